"""The metrics of a run, identical for every policy (names are the ``--json`` keys).

The full account: docs/internals.md, section ``shared/sim/metrics.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shared.sim.records import SimResult

__all__ = [
    "HIGHER_IS_BETTER",
    "LOWER_IS_BETTER",
    "METRICS",
    "Paired",
    "compute_metrics",
    "mean",
    "node_moves",
    "paired_relative",
    "pct",
    "recompute_by_cause",
    "recomputed_tokens",
    "t_quantile",
]

METRICS: tuple[str, ...] = (
    "latency_mean",
    "latency_p50",
    "latency_p99",
    "ttft_mean",
    "ttft_p99",
    "decode_tps",
    "prefix_hit_rate",
    "tool_to_first_mean",
    "tool_to_first_p99",
    "pause_wait_mean",
    "pause_wait_total",
    "makespan",
    "running_mean",
    "running_max",
    "fallback_rate",
    "solve_ms_mean",
    "solve_ms_p99",
    "demand_capacity_mean",
    "interrupts",
    "preemptions",
    "recomputed_tokens",
    "recompute_share",
    "recomputed_move",
    "recomputed_release",
    "recomputed_kept",
    "recomputed_payback",
    "releases_payback",
    "node_moves",
    "interrupts_per_tool",
    "plans_discarded",
    "requests",
    "tasks",
    "completion_tokens",
)
"""Every metric name, in report order."""

LOWER_IS_BETTER = frozenset(
    {
        "latency_mean",
        "latency_p50",
        "latency_p99",
        "ttft_mean",
        "ttft_p99",
        "tool_to_first_mean",
        "tool_to_first_p99",
        "pause_wait_mean",
        "pause_wait_total",
        "makespan",
        "preemptions",
        "recomputed_tokens",
        "recompute_share",
        "recomputed_move",
        "recomputed_release",
        "recomputed_kept",
        "recomputed_payback",
        "node_moves",
        "interrupts_per_tool",
        "plans_discarded",
    }
)
HIGHER_IS_BETTER = frozenset({"decode_tps", "prefix_hit_rate"})


def pct(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100), None for no values."""
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def mean(values: Sequence[float]) -> float | None:
    """The mean, None for no values."""
    return float(np.mean(np.asarray(values, dtype=float))) if values else None


def recomputed_tokens(res: SimResult) -> int:
    """Σ over requests of max(0, min(prompt, prev_ctx) − cached): the part of a prompt the session
    had already had computed (its previous request's prompt + completion; 0 for its first) that
    was not served from the cache and so was prefilled again."""
    prev: dict[str, int] = {}
    total = 0
    for r in sorted(res.requests, key=lambda r: (r.session, r.turn)):
        ctx = prev.get(r.session, 0)
        total += max(0, min(r.prompt, ctx) - r.cached)
        prev[r.session] = r.prompt + r.completion
    return total


def recompute_by_cause(res: SimResult) -> dict[str, int]:
    """:func:`recomputed_tokens` split by what preceded each request: ``move`` (served on another
    node than the session's previous request), ``release`` (same node, the admission released
    since the previous request: ``RequestRecord.release`` set), ``kept`` (same node, admitted
    throughout). The three sum to :func:`recomputed_tokens`; ``payback`` is the part of ``move``
    and ``release`` whose last release was a pay-back one (``RequestRecord.release``)."""
    prev: dict[str, tuple[int, str]] = {}
    out = {"move": 0, "release": 0, "kept": 0, "payback": 0}
    for r in sorted(res.requests, key=lambda r: (r.session, r.turn)):
        ctx, node = prev.get(r.session, (0, r.node))
        lost = max(0, min(r.prompt, ctx) - r.cached)
        cause = "move" if node != r.node else "release" if r.release is not None else "kept"
        out[cause] += lost
        if r.release == "payback":
            out["payback"] += lost
        prev[r.session] = (r.prompt + r.completion, r.node)
    return out


def node_moves(res: SimResult) -> int:
    """Requests served on another node than the same session's previous request (each one
    prefills the whole context again unless the new node happens to hold it)."""
    prev: dict[str, str] = {}
    moves = 0
    for r in sorted(res.requests, key=lambda r: (r.session, r.turn)):
        last = prev.get(r.session)
        moves += last is not None and last != r.node
        prev[r.session] = r.node
    return moves


def compute_metrics(res: SimResult, dp_policy: bool) -> dict[str, float | int | None]:
    """Every metric of :data:`METRICS` for one run."""
    lat = [t.end - t.start for t in res.tasks]
    reqs = res.requests
    ttft = [r.first_token - r.issued for r in reqs]
    after_tool = [r.first_token - r.tool_end for r in reqs if r.tool_end is not None]
    holds = [r.submitted - r.issued for r in reqs]
    prompt = sum(r.prompt for r in reqs)
    cached = sum(r.cached for r in reqs)
    out_tokens = sum(r.completion for r in reqs)
    makespan = max(t.end for t in res.tasks) - min(t.start for t in res.tasks) if res.tasks else 0.0
    running = [s.running for s in res.samples]
    dp_rounds = [t for t in res.ticks if t.pool > 0]
    solve = [t.solve_s * 1000.0 for t in res.ticks]
    ratios = [t.demand / t.capacity for t in res.ticks if t.pool > 0 and t.capacity > 0]
    recomputed = recomputed_tokens(res)
    by_cause = recompute_by_cause(res)
    return {
        "latency_mean": mean(lat),
        "latency_p50": pct(lat, 50),
        "latency_p99": pct(lat, 99),
        "ttft_mean": mean(ttft),
        "ttft_p99": pct(ttft, 99),
        "decode_tps": out_tokens / makespan if makespan > 0 else None,
        "prefix_hit_rate": cached / prompt if prompt else None,
        "tool_to_first_mean": mean(after_tool),
        "tool_to_first_p99": pct(after_tool, 99),
        "pause_wait_mean": mean(holds),
        "pause_wait_total": float(sum(holds)),
        "makespan": makespan,
        "running_mean": mean(running),
        "running_max": max(running) if running else None,
        "fallback_rate": (
            sum(1 for t in dp_rounds if not t.exact) / len(dp_rounds)
            if dp_policy and dp_rounds
            else (0.0 if dp_policy else None)
        ),
        "solve_ms_mean": mean(solve),
        "solve_ms_p99": pct(solve, 99),
        "demand_capacity_mean": mean(ratios),
        "interrupts": res.counters.get("interrupts", 0),
        "preemptions": res.preemptions,
        "recomputed_tokens": recomputed,
        "recompute_share": recomputed / prompt if prompt else None,
        "recomputed_move": by_cause["move"],
        "recomputed_release": by_cause["release"],
        "recomputed_kept": by_cause["kept"],
        "recomputed_payback": by_cause["payback"],
        "releases_payback": res.counters.get("releases_payback", 0),
        "node_moves": node_moves(res),
        "interrupts_per_tool": (
            res.counters.get("interrupts", 0) / tools
            if (tools := len(reqs) - len(res.tasks))
            else None
        ),
        "plans_discarded": res.counters.get("plans_discarded", 0),
        "requests": len(reqs),
        "tasks": len(res.tasks),
        "completion_tokens": out_tokens,
    }


def improvement(metric: str, ours: float | None, best: float | None) -> float | None:
    """Relative improvement of ``ours`` over ``best`` in percent, positive = better."""
    if ours is None or best is None or best == 0 or math.isnan(ours) or math.isnan(best):
        return None
    if metric in LOWER_IS_BETTER:
        return (best - ours) / best * 100.0
    if metric in HIGHER_IS_BETTER:
        return (ours - best) / best * 100.0
    return None


def _t_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` >= 1 (A&S 26.7.3-4, exact)."""
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    total = 0.0
    if df % 2 == 1:
        term = c  # cos θ, (2/3) cos³ θ, (2·4)/(3·5) cos⁵ θ, ... up to cos^(df−2) θ
        for j in range((df - 1) // 2):
            total += term
            term *= c2 * (2 * j + 2) / (2 * j + 3)
        return 2.0 / math.pi * (theta + s * total)
    term = 1.0  # 1, (1/2) cos² θ, (1·3)/(2·4) cos⁴ θ, ... up to cos^(df−2) θ
    for j in range(df // 2):
        total += term
        term *= c2 * (2 * j + 1) / (2 * j + 2)
    return s * total


def t_quantile(q: float, df: int) -> float:
    """The ``q``-quantile of Student's t with integer ``df`` >= 1, for 0.5 <= q < 1 (what
    ``scipy.stats.t.ppf(q, df)`` returns), by bisection on the exact CDF."""
    if df < 1:
        raise ValueError(f"df: must be >= 1, got {df}")
    if not 0.5 <= q < 1.0:
        raise ValueError(f"q: must be in [0.5, 1), got {q}")
    p = 2.0 * q - 1.0  # two-sided coverage
    lo, hi = 0.0, 1.0
    while _t_coverage(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid in (lo, hi):
            break
        if _t_coverage(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class Paired:
    """The paired relative difference of a policy against a baseline over seeds, in percent.

    ``low``/``high`` bound the 95 % Student-t interval of the mean; None with one seed."""

    n: int
    mean: float
    low: float | None
    high: float | None

    @property
    def excludes_zero(self) -> bool:
        """The interval lies wholly above or below zero (False without an interval)."""
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def paired_relative(
    pairs: Sequence[tuple[float | None, float | None]], confidence: float = 0.95
) -> Paired | None:
    """Mean over seeds of (policy − baseline) / baseline × 100 with its Student-t interval.

    ``pairs`` holds one (policy, baseline) value per seed. A pair with a None or NaN value is
    skipped; baseline 0 counts as 0 % when the policy is 0 too and is skipped otherwise (the
    ratio is undefined). None when no pair is left. See the module docstring for the formula.
    """
    diffs: list[float] = []
    for ours, base in pairs:
        if ours is None or base is None or math.isnan(ours) or math.isnan(base):
            continue
        if base == 0:
            if ours == 0:
                diffs.append(0.0)
            continue
        diffs.append((ours - base) / base * 100.0)
    n = len(diffs)
    if n == 0:
        return None
    m = math.fsum(diffs) / n
    if n == 1:
        return Paired(1, m, None, None)
    sd = math.sqrt(math.fsum((d - m) ** 2 for d in diffs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return Paired(n, m, m - half, m + half)
