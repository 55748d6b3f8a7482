"""The metrics of a run, identical for every policy (names are the ``--json`` keys).

=========================  ===================================================================
``latency_mean/p50/p99``   task latency, s: task end − task start (first request issued)
``ttft_mean/p99``          time to first token, s: first token − request issued by the agent
                           (includes any hold in the pool and engine queueing)
``decode_tps``             output tokens of all requests / makespan, tokens/s
``prefix_hit_rate``        Σ cached prompt tokens / Σ prompt tokens (vLLM's counters' ratio)
``tool_to_first_mean/p99`` s from a tool's end to the first token of the request after it
``pause_wait_mean``        s a request is held in the pool before reaching an engine
``pause_wait_total``       Σ of those holds, s
``makespan``               last task end − first task start, s
``running_mean/max``       engine-running requests (all nodes), sampled every ``sample_s``
``fallback_rate``          share of DP rounds whose plan was not proven exact (tao family;
                           null for policies that do not solve the DP)
``solve_ms_mean/p99``      wall ms of one scheduling round's decide() (null for routers)
``demand_capacity_mean``   mean over rounds with a pool of Σ pool weights / Σ usable capacity
``interrupts``             admissions released while in a tool (TAO interrupts, ThunderAgent
                           pauses)
``requests``, ``tasks``    counts; ``completion_tokens`` Σ output tokens
=========================  ===================================================================

Percentiles are numpy's default linear interpolation. Null (``None``) means "does not apply".
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from shared.sim.records import SimResult

__all__ = ["LOWER_IS_BETTER", "METRICS", "compute_metrics", "mean", "pct"]

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
