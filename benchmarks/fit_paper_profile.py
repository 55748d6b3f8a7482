"""Fit the ``paper-deepseek`` engine profile to the paper's *baseline* figures, and print the fit.

The paper's DeepSeek deployment (Table 1: DeepSeek-V4 Flash, 2 nodes × 4 H100, SWE-Lite) runs
a model whose configuration is not public, so its KV capacity and step costs are unknown. They
are fitted once, here, to what the paper reports for its *baselines* — never to TAO's rows:

    .venv/bin/python -m benchmarks.fit_paper_profile          # search, then the table (~15 min)
    .venv/bin/python -m benchmarks.fit_paper_profile --check      # the built-in profile's table

**Targets** (:data:`PAPER_BASELINES`): Table 1's best-baseline column at 16 and 64 workers (the
paper compares TAO with the best of vLLM RR, vLLM CA, Dynamo and ThunderAgent per metric; the
numbers are the summary's §4.2, /work/shared/000_b7bb0ad7dea3a93d.txt "4.2 메인 결과"). The
simulator's counterpart is the same: the best of ``rr``, ``cache-aware``, ``kv-aware`` and
``thunderagent`` per metric (:data:`FIT_POLICIES`), on the same tasks.

**Fitted**: mean task latency and mean TTFT at 16 and 64 workers (four figures). **Held out**:
decode tok/s. The paper's decode counts its own tokens per task: by Little's law on its baseline
figures, decode × latency / workers = 889.6 × 116.0 / 16 ≈ 6,450 and 1,561.3 × 253.2 / 64 ≈
6,180 output tokens per task, where the simulator's swe-lite produces 4,322 (seed 0, 100 tasks).
No profile makes both latency and decode match on this workload, so decode is printed beside
the paper's and not fitted (it would only pull latency away from the paper's to raise tok/s).

**Parameters**: three, the rest kept from the ``deepseek-4xh100`` stand-in (its roofline shape,
shared/core/engine/profiles.py): the KV capacity per node ``kv_tokens``, one factor on the
prefill terms (``prefill_a``, ``prefill_b``, ``prefill_f``) and one on the decode terms
(``decode_c``, ``decode_d``, ``decode_e``).

**Objective**: Σ over the fitted figures of ln(simulated / paper)², so a figure 10 % high
weighs as one 10 % low whatever its unit.

**Search**: a pattern search in log2 space: each coordinate is tried one step up and one step
down, the best move is taken when it lowers the objective by more than 1 % (:data:`MIN_GAIN`),
and the step halves when none does; at most ``--max-evals`` evaluations. The KV capacity is
rounded to whole 1,024-block steps (16,384 tokens), the factors to 3 significant digits, so the
result reads as a profile entry. Deterministic: the same tasks (seed 0) for every candidate.
The built-in profile came from three runs (docs/evaluation.md, "Reproducing the paper"), each
starting where the one before stopped:

    # 1: from the stand-in (147,456 tokens, x1, x1), step 1, 30 evaluations
    .venv/bin/python -m benchmarks.fit_paper_profile --steps 1 --max-evals 30
    # 2: steps 1/2 and 1/4, 14 evaluations (stopped by the cap at step 1/2)
    .venv/bin/python -m benchmarks.fit_paper_profile --start 1179648,2,0.5 --steps 0.5,0.25 \
        --max-evals 14
    # 3: the same steps again, 11 evaluations (stopped by the cap at step 1/2)
    .venv/bin/python -m benchmarks.fit_paper_profile --start 835584,1.41,0.354 --steps 0.5,0.25 \
        --max-evals 11

Run 1 was made before the 1 % rule: its moves up to (1,179,648, x2, x0.5) each gained more than
1 %, then it drifted along the flat capacity (2.36 M, 4.72 M: −0.6 %), which is why the rule
exists; with the rule it stops at the same point. The caps were the time the shared 2-core
machine allowed (20–90 s an evaluation under the other helpers' load); the result,
(589,824, x1.41, x0.354), objective 0.1738, is the best point evaluated, not a proven minimum.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from shared.core.engine import PROFILES
from shared.core.engine.profiles import Profile, scaled
from shared.sim import des
from shared.sim.des import SimConfig
from shared.sim.metrics import compute_metrics
from shared.sim.runner import simulate
from shared.sim.workloads import Task, generate_tasks, load_workload

__all__ = [
    "FIT_POLICIES",
    "PAPER_BASELINES",
    "PaperFigure",
    "best_baseline",
    "candidate",
    "objective",
]

BASE_PROFILE = "deepseek-4xh100"
"""The stand-in whose roofline shape the fit scales."""

FIT_POLICIES: tuple[str, ...] = ("rr", "cache-aware", "kv-aware", "thunderagent")
"""The simulator's counterparts of the paper's baselines (vLLM RR, vLLM CA, Dynamo,
ThunderAgent); the best of them per metric is compared with the paper's best baseline."""

HIGHER_IS_BETTER: frozenset[str] = frozenset({"decode_tps"})


@dataclass(frozen=True, slots=True)
class PaperFigure:
    """One figure of the paper's Table 1 (DeepSeek-V4 Flash, SWE-Lite, 2 × 4 H100)."""

    workers: int
    metric: str
    """The key of ``tao sim --json``'s ``metrics`` that measures the same thing."""
    value: float
    row: str
    """Which row of the paper's table the number is: only baseline rows appear here."""
    fitted: bool
    """In the objective (False: printed beside the fit, see the module docstring)."""


PAPER_BASELINES: tuple[PaperFigure, ...] = (
    PaperFigure(16, "latency_mean", 116.011, "best baseline", fitted=True),
    PaperFigure(16, "ttft_mean", 0.146, "best baseline", fitted=True),
    PaperFigure(16, "decode_tps", 889.590, "best baseline", fitted=False),
    PaperFigure(64, "latency_mean", 253.228, "best baseline", fitted=True),
    PaperFigure(64, "ttft_mean", 0.351, "best baseline", fitted=True),
    PaperFigure(64, "decode_tps", 1561.307, "best baseline", fitted=False),
)
"""Table 1's best-baseline figures (paper §4.2; the summary's "4.2 메인 결과": "64 workers ...
최선 경쟁치 253.228초 ... 0.351초 ... 1,561.307 tok/s", "16 workers ... 116.011초, 0.146초,
889.590 tok/s"). TAO's own figures of the same table are not here and the fit never reads them."""

FIT_WORKERS: tuple[int, ...] = tuple(sorted({f.workers for f in PAPER_BASELINES}))
MIN_GAIN = 0.01
"""A move must lower the objective by more than this share: above about 1.2 M tokens the
64-worker baselines no longer contend for KV, the objective is flat in the capacity (within
0.6 %) and the capacity is not identified, so the search stops where it flattens instead of
drifting to ever larger caches."""
KV_STEP = 1024 * 16
"""KV capacity granularity of the search: 1,024 blocks of 16 tokens."""


def candidate(kv_tokens: int, prefill_scale: float, decode_scale: float) -> Profile:
    """The stand-in's profile with its KV capacity replaced and its step terms scaled."""
    return scaled(
        PROFILES[BASE_PROFILE],
        prefill_scale,
        decode_scale,
        name="paper-deepseek-candidate",
        kv_tokens=kv_tokens,
        source="fit candidate",
    )


def best_baseline(
    runs: Mapping[tuple[str, int], Mapping[str, float | int | None]], workers: int, metric: str
) -> float:
    """The best of :data:`FIT_POLICIES` on ``metric`` at ``workers`` (as the paper's column).

    Only baseline policies are read; a TAO-family run in ``runs`` changes nothing."""
    values = []
    for pol in FIT_POLICIES:
        v = runs[(pol, workers)][metric]
        if v is None:
            raise ValueError(f"{pol} at {workers} workers has no {metric}")
        values.append(float(v))
    return max(values) if metric in HIGHER_IS_BETTER else min(values)


def objective(runs: Mapping[tuple[str, int], Mapping[str, float | int | None]]) -> float:
    """Σ ln(simulated best baseline / paper's best baseline)² over the fitted figures."""
    total = 0.0
    for f in PAPER_BASELINES:
        if f.fitted:
            total += math.log(best_baseline(runs, f.workers, f.metric) / f.value) ** 2
    return total


@contextmanager
def _registered(profile: Profile) -> Iterator[str]:
    """Make ``profile`` selectable by name in the simulator for the block (the built-in
    registry is read-only; the fit's candidates are not profiles anyone should select)."""
    saved = des.PROFILES
    des.PROFILES = {**saved, profile.name: profile}
    try:
        yield profile.name
    finally:
        des.PROFILES = saved


Runs = dict[tuple[str, int], dict[str, float | int | None]]


def evaluate(profile: Profile, tasks: list[Task], nodes: int) -> Runs:
    """Every fit policy at every fit worker count on ``tasks``, seed 0."""
    runs: Runs = {}
    with _registered(profile) as name:
        for w in FIT_WORKERS:
            cfg = SimConfig(nodes=nodes, profile=name, workers=w)
            for pol in FIT_POLICIES:
                runs[(pol, w)] = compute_metrics(simulate(tasks, cfg, pol, 0), False)
    return runs


Point = tuple[float, float, float]
"""(log2 kv_tokens, log2 prefill factor, log2 decode factor)."""


def _profile_at(x: Point) -> Profile:
    kv = max(KV_STEP, round(2 ** x[0] / KV_STEP) * KV_STEP)
    return candidate(kv, float(f"{2 ** x[1]:.3g}"), float(f"{2 ** x[2]:.3g}"))


def _describe(p: Profile) -> str:
    base = PROFILES[BASE_PROFILE]
    return (f"kv {p.kv_tokens:>9,}  prefill x{p.prefill_b / base.prefill_b:.3g}  "
            f"decode x{p.decode_c / base.decode_c:.3g}")  # fmt: skip


def pattern_search(
    f: Callable[[Profile], float],
    start: Point,
    steps: Sequence[float],
    max_evals: int,
    log: Callable[[str], None],
) -> tuple[Profile, float]:
    """Minimise ``f`` over the three log2 coordinates (module docstring)."""
    cache: dict[tuple[int, float, float], float] = {}

    def value(x: Point) -> tuple[Profile, float]:
        p = _profile_at(x)
        key = (p.kv_tokens, p.prefill_b, p.decode_c)
        if key not in cache:
            if len(cache) >= max_evals:
                return p, math.inf
            t0 = time.perf_counter()
            cache[key] = f(p)
            log(f"  {_describe(p)}  objective {cache[key]:.4f}  "
                f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
        return p, cache[key]

    x = start
    best_p, best = value(x)
    for step in steps:
        while True:
            moves = []
            for i in range(3):
                for sign in (1.0, -1.0):
                    y = list(x)
                    y[i] += sign * step
                    p, v = value((y[0], y[1], y[2]))
                    moves.append((v, (y[0], y[1], y[2]), p))
            v, y, p = min(moves, key=lambda m: m[0])
            if v >= best * (1.0 - MIN_GAIN):
                break
            x, best, best_p = y, v, p
        if len(cache) >= max_evals:
            break
    return best_p, best


def table(runs: Runs) -> str:
    """The paper's baseline figures beside the simulated best baseline, with residuals."""
    lines = [
        "| workers | metric | paper (best baseline) | simulated (best baseline) | by | residual "
        "| fitted |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in PAPER_BASELINES:
        sim = best_baseline(runs, f.workers, f.metric)
        better = max if f.metric in HIGHER_IS_BETTER else min
        who = better(FIT_POLICIES, key=lambda pol: float(runs[(pol, f.workers)][f.metric] or 0))
        lines.append(
            f"| {f.workers} | {f.metric} | {f.value:g} | {sim:.4g} | {who} | "
            f"{(sim / f.value - 1) * 100:+.1f} % | {'yes' if f.fitted else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=100, help="swe-lite tasks per run (default 100)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes (the paper's 2; default 2)")
    ap.add_argument("--max-evals", type=int, default=30, help="search evaluations (default 30)")
    ap.add_argument("--check", action="store_true", help="only evaluate paper-deepseek")
    ap.add_argument("--start", metavar="KV,P,D", help="start point: kv_tokens, prefill and "
                    "decode factors (default the stand-in: its kv_tokens,1,1)")  # fmt: skip
    ap.add_argument("--steps", default="1,0.5,0.25", help="log2 steps (default 1,0.5,0.25)")
    args = ap.parse_args()
    tasks = generate_tasks(load_workload("swe-lite"), args.tasks, 0)
    per_task = sum(sum(t.output for t in task.turns) for task in tasks) / len(tasks)
    print(f"swe-lite, {args.tasks} tasks (seed 0), {args.nodes} nodes; "
          f"output tokens per task {per_task:,.0f}")  # fmt: skip
    if args.check:
        best_p = PROFILES["paper-deepseek"]
    else:
        base = PROFILES[BASE_PROFILE]
        kv, pf, df = (float(x) for x in (args.start or f"{base.kv_tokens},1,1").split(","))
        start: Point = (math.log2(kv), math.log2(pf), math.log2(df))
        best_p, _ = pattern_search(
            lambda p: objective(evaluate(p, tasks, args.nodes)),
            start,
            [float(x) for x in args.steps.split(",")],
            args.max_evals,
            lambda s: print(s, flush=True),
        )
    runs = evaluate(best_p, tasks, args.nodes)
    print(f"\n{_describe(best_p)}; objective {objective(runs):.4f}\n")
    print(table(runs))


if __name__ == "__main__":
    main()
