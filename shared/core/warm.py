"""Load (or compile) every numba kernel once, so that numba's on-disk cache holds them all.

The kernels are ``@njit(cache=True)``: numba writes each compiled kernel to its cache
(``NUMBA_CACHE_DIR``, else ``__pycache__`` beside the module) and a later process loads it in
milliseconds instead of compiling it again (seconds). :func:`warm_all` runs each kernel on tiny
inputs of the types the services use: the planner's (:func:`shared.core.planner.warm_up`, on
one small snapshot: the exact search, the beam fallback and the bounds) and the block pool's
(:mod:`shared.core.engine.poolkernels`, through a small engine serving turns of two sessions,
so that allocation, the prefix-cache hits, eviction and release all run) and its host tier's
(:mod:`shared.core.engine.hostkernels`, the same engine with a host tier). Run it once where
the cache will be read, as the user the services run as: ``tao warm`` (:mod:`shared.cli.warm`;
scripts/setup.sh runs it, and so can the image build after the install). It returns how
many signatures each kernel holds; :func:`cache_misses` says which were compiled rather than
loaded.

With ``NUMBA_DISABLE_JIT=1`` the kernels are plain Python: the same calls run, nothing compiles.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np

from shared.core import kernels
from shared.core.engine import (
    DEFAULT_PROFILE,
    PROFILES,
    Engine,
    EngineRequest,
    hostkernels,
    poolkernels,
)
from shared.core.planner import warm_up

__all__ = ["KERNEL_MODULES", "cache_misses", "compiled", "warm_all", "warm_engine"]

KERNEL_MODULES: tuple[ModuleType, ...] = (kernels, poolkernels, hostkernels)
"""The modules whose ``@njit`` functions :func:`warm_all` compiles."""


def warm_engine() -> None:
    """Serve turns of two sessions on an engine whose pool holds about one prompt, so that
    the block pool's kernels all run: allocation, caching, prefix hits, eviction, release,
    touch and the cache reset; and, with a host tier of the pool's size, the host tier's
    (stores, completions, evictions, a load of an evicted prefix, unpins, re-ranks)."""
    profile = replace(PROFILES[DEFAULT_PROFILE], kv_tokens=64 * 16, max_batched_tokens=256)
    engine = Engine("warm", profile, emit_kv_events=True, host=profile.host_link(1.0))
    prompt = [i % 97 for i in range(600)]
    turns = [
        EngineRequest("r1", "a", prompt, 8),
        EngineRequest("r2", "a", prompt + list(range(100, 180)), 48),  # a prefix hit
        EngineRequest("r3", "b", [i % 89 + 200 for i in range(700)], 8),  # evicts a's blocks
        EngineRequest("r4", "a", prompt, 8),
    ]
    now = 0.0
    for batch in (turns[:1], turns[1:3], turns[3:]):  # r2 and r3 at once: r3 waits for room
        for req in batch:
            engine.submit(req, now)
            engine.resident_prefix(req.prompt, req.session_id)
        while (at := engine.next_event_time()) is not None:
            now = max(now, at)
            engine.advance(now)
        engine.drain_kv_events()
    engine.pool.free_order()
    engine.submit(EngineRequest("r5", "c", prompt, 64), now)
    engine.abort("r5", now)
    engine.reset_prefix_cache(now)


def _kernels() -> dict[str, Any]:
    """Every numba dispatcher defined in :data:`KERNEL_MODULES` with code of its own (an
    ``inline="always"`` helper has none: it is compiled into its callers), by
    ``module.name``."""
    out: dict[str, Any] = {}
    for module in KERNEL_MODULES:
        for name, fn in vars(module).items():
            options = getattr(fn, "targetoptions", None)
            if not isinstance(options, dict) or fn.__module__ != module.__name__:
                continue
            if options.get("inline") != "always":
                out[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"] = fn
    return out


def compiled() -> dict[str, int]:
    """Signatures each kernel holds, compiled or loaded from the cache (empty with
    ``NUMBA_DISABLE_JIT=1``: there are no dispatchers then)."""
    return {name: len(fn.signatures) for name, fn in _kernels().items()}


def cache_misses() -> dict[str, int]:
    """Per kernel, the signatures this process compiled because numba's cache lacked them
    (0 everywhere once the cache is warm for this machine)."""
    return {name: sum(fn.stats.cache_misses.values()) for name, fn in _kernels().items()}


def warm_all() -> dict[str, int]:
    """Run every kernel once (module docstring); :func:`compiled` afterwards."""
    warm_up()
    warm_engine()
    one = np.ones(1, dtype=np.int64)
    kernels.suffix_knapsack(one, one, np.ones(1, dtype=np.bool_), 2)  # the oracle tests' own
    return compiled()
