"""``tao warm``: compile every numba kernel into numba's on-disk cache (:mod:`shared.core.warm`).

Run once after an install (``scripts/setup.sh`` does) or in an image build, as the user the
services run as and with the ``NUMBA_CACHE_DIR`` they use: the planner then loads its kernels
at start in about a second instead of compiling them (tens of seconds on two cores), and the
gateway's ``/readyz`` turns 200 that much sooner. Also ``python -m shared.cli.warm``.

numba keys its cache by the source files and by the CPU: a cache warmed on another CPU model
is compiled again on first use (and then kept). An image built for many machines may set
``NUMBA_CPU_NAME=generic`` for both the build and the services, trading a little kernel speed
for a cache that fits every x86-64 CPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, TextIO

__all__ = ["add_warm_parser", "main", "run"]


def add_warm_parser(sub: Any) -> None:
    """Register ``tao warm``."""
    warm = sub.add_parser(
        "warm",
        help="compile the numba kernels into numba's cache (once per install or image)",
        description=(__doc__ or "").split("\n\n")[1],
    )
    warm.set_defaults(run=run)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Warm the cache and say what it holds; exit 1 if the cache cannot be written."""
    from numba.core import config

    from shared.core.warm import cache_misses, warm_all

    if getattr(config, "DISABLE_JIT", False):
        out.write("tao warm: NUMBA_DISABLE_JIT=1, nothing to compile\n")
        return 0
    cache_dir = str(getattr(config, "CACHE_DIR", "") or "")
    where = cache_dir or "__pycache__ beside each module"
    if cache_dir and not _writable(cache_dir):
        out.write(f"tao warm: NUMBA_CACHE_DIR={cache_dir} is not writable by this user\n")
        return 1
    t0 = time.perf_counter()
    kernels = warm_all()
    compiled = sum(cache_misses().values())
    out.write(
        f"tao warm: {len(kernels)} numba kernels ready in {time.perf_counter() - t0:.1f} s "
        f"({compiled} compiled now, the rest loaded from the cache: {where})\n"
    )
    return 0


def _writable(folder: str) -> bool:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def main() -> int:
    return run(argparse.Namespace(), sys.stdout)


if __name__ == "__main__":
    raise SystemExit(main())
