"""A workload's tool-time and token fit beside the published figures it was fitted to.

``tao sim --describe-workload`` prints it: the generated tasks' per-call tool durations (p50,
p90, p99, mean, the share of calls in each duration band, and the share of all tool time held
by calls over 60 s), turns per task and context per call, each beside the figure of the source
the family cites (:data:`SOURCES`, the same numbers as the family's docstring in
:mod:`shared.sim.workloads`). A figure the source does not give prints as ``–``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np

from shared.sim.workloads import Task
from shared.tables import render

__all__ = ["SOURCES", "describe", "measure"]

SOURCES: Final[Mapping[str, Mapping[str, float]]] = {
    # TraceLab (github.com/uw-syfi/TraceLab), 357k steps of real Claude Code and Codex use.
    "claude-code": {
        "tool p50 s": 0.3,
        "tool p90 s": 13.6,
        "tool p99 s": 216.0,
        "tool mean s": 18.4,
        "calls < 1 s": 0.61,
        "calls 1-10 s": 0.27,
        "calls 10-60 s": 0.08,
        "calls > 60 s": 0.04,
        "time in calls > 60 s": 0.85,
        "append median tok": 875.0,
        "output median tok": 214.0,
    },
    # SWE-agent 1.1 on SWE-Bench Pro (github.com/nilenso/swe-bench-pro-cost-token-time-analysis);
    # ranges over its two models are given as their midpoints.
    "swe-agent": {
        "tool p50 s": 0.42,
        "calls > 10 s": 0.0305,
        "calls > 60 s": 0.00875,
        "longest call per task p50 s": 27.5,
        "turns p50": 68.5,
        "context per call mean tok": 38_500.0,
    },
    # docs/evaluation.md: issue 5's measurements and the paper's Figure 6 (median 0.4 s).
    "swe-lite": {"tool p50 s": 0.4, "tool p90 s": 0.7},
}
"""Per built-in family, the published figures its fit is checked against."""

_ROWS: Final = (
    "tool p50 s",
    "tool p90 s",
    "tool p99 s",
    "tool mean s",
    "calls < 1 s",
    "calls 1-10 s",
    "calls 10-60 s",
    "calls > 60 s",
    "calls > 10 s",
    "time in calls > 60 s",
    "longest call per task p50 s",
    "turns p50",
    "context per call mean tok",
    "append median tok",
    "output median tok",
)


def measure(tasks: Sequence[Task]) -> dict[str, float]:
    """The figures of :data:`_ROWS` measured on ``tasks`` (NaN where there are no tool calls)."""
    durs = np.asarray([u.duration for t in tasks for u in t.turns if u.tool is not None])
    longest = [max((u.duration for u in t.turns if u.tool is not None), default=0.0) for t in tasks]
    contexts = [p for t in tasks for p in t.prompt_tokens]
    appends = [u.added for t in tasks for u in t.turns[1:]]
    outputs = [u.output for t in tasks for u in t.turns]
    nan = math.nan
    out: dict[str, float] = {
        "turns p50": float(np.median([len(t.turns) for t in tasks])) if tasks else nan,
        "context per call mean tok": float(np.mean(contexts)) if contexts else nan,
        "append median tok": float(np.median(appends)) if appends else nan,
        "output median tok": float(np.median(outputs)) if outputs else nan,
        "longest call per task p50 s": float(np.median(longest)) if longest else nan,
    }
    if durs.size == 0:
        return out
    p50, p90, p99 = (float(v) for v in np.quantile(durs, [0.5, 0.9, 0.99]))
    total = float(durs.sum())
    out |= {
        "tool p50 s": p50,
        "tool p90 s": p90,
        "tool p99 s": p99,
        "tool mean s": float(durs.mean()),
        "calls < 1 s": float(np.mean(durs < 1.0)),
        "calls 1-10 s": float(np.mean((durs >= 1.0) & (durs < 10.0))),
        "calls 10-60 s": float(np.mean((durs >= 10.0) & (durs < 60.0))),
        "calls > 60 s": float(np.mean(durs >= 60.0)),
        "calls > 10 s": float(np.mean(durs > 10.0)),
        "time in calls > 60 s": float(durs[durs >= 60.0].sum() / total) if total > 0 else nan,
    }
    return out


def _cell(name: str, value: float | None) -> str:
    if value is None or math.isnan(value):
        return "–"
    if name.startswith(("calls", "time in")):
        return f"{100 * value:.1f} %"
    if name.endswith("tok") or name.startswith("turns"):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def describe(family: str, tasks: Sequence[Task]) -> str:
    """The table ``tao sim --describe-workload`` prints for ``tasks`` of ``family``."""
    got = measure(tasks)
    source = SOURCES.get(family, {})
    rows = [[name, _cell(name, got.get(name)), _cell(name, source.get(name))] for name in _ROWS]
    calls = sum(1 for t in tasks for u in t.turns if u.tool is not None)
    head = f"workload {family}: {len(tasks)} tasks, {calls} tool calls"
    return head + "\n" + render(["figure", "this fit", "source"], rows)
