"""Tool-call end prediction (DESIGN 3.1 "Prediction", paper §3.4 eq. 5 and Appendix A).

Precedence of evidence, strongest first:

1. **observed** — the call's completion was seen (``completed_at``), or the call went to the
   background (Claude Code ``backgroundTaskId``): it no longer blocks its session.
2. **interface** — an explicit ``expected_end`` or a progress fraction reported by the tool
   interface. When both are present the more recently reported wins (ties: ``expected_end``).
   Progress ``f`` reported at ``ts`` extrapolates linearly: ``end = start + (ts - start) / f``.
3. **history** — per-tool stats when the tool has ``MIN_SAMPLES`` completed durations, else the
   global aggregate when it has ``MIN_SAMPLES``, else ``DEFAULT_DURATION_S``.

A ``deadline`` (start + the call's timeout: Claude Code Bash ``timeout`` ms, Monitor
``timeoutMs``, OpenCode bash timeout) is an upper bound on the end, never a prediction of it:
every non-observed prediction is ``min(end, deadline)``. When the deadline binds the evidence
is ``"deadline"`` and its timestamp is ``min(now, deadline)``: a hard bound is re-confirmed at
every instant until it passes, and after that it is old news (so the readiness probe fires
once, not every tick).

History estimate of a duration, for ``n >= MIN_SAMPLES`` completed calls with sample mean ``m``
and sample standard deviation ``s`` (Welford, divisor ``n - 1``)::

    d = clip(m + t_{n-1, 1-ALPHA} * s * sqrt(1 + 1/n),  lo = min,  hi = max(max, L_cens))

the one-sided ``1 - ALPHA`` (90 %) prediction bound for one new observation under a normal
model, clipped to the observed range. ``L_cens`` is the longest elapsed time of a call cut by a
timeout: such calls are right-censored, never enter the mean or the variance, and only widen
the upper clip (the true duration exceeded ``L_cens``, so the range must allow it). The
predicted end is ``start + d``; the remaining time ``max(0, start + d - now)`` is the estimate
minus elapsed, floored at 0. This is a scheduling heuristic, not a calibrated probability.

**Expected remaining time** (:func:`expected_remaining_s`, what a release of the session's
room is worth): the prediction bound above answers "by when will it most likely have ended",
which is what readiness needs; the time a held reservation stays unused is the *mean* remaining
duration given that the call has already run ``e`` seconds, ``E[D - e | D > e]``. Tool times
are heavy-tailed (a call that has run long is expected to run longer), so it is computed from a
log-normal fitted to the history's mean ``m`` and variance ``v`` by moments,
``σ² = ln(1 + v/m²)``, ``μ = ln m - σ²/2``::

    E[D - e | D > e] = exp(μ + σ²/2) · Q(z - σ) / Q(z) - e,   z = (ln e - μ) / σ

(``Q`` the standard normal survival function; ``e <= 0`` gives ``m``). Where ``Q(z)`` underflows
(the call has outrun its history by far) it is "as long again as it has run so far", ``e``;
with interface evidence it is ``end - now`` while the end is ahead, then ``e``; with no history
at all, ``e`` from the start: a call of unknown length is expected to run as long again as it
has run so far (the median residual of a scale-free duration), so a call nothing is known of is
not released on the 5 s default the readiness prediction uses — only once it has run long. A
``deadline`` caps it at ``deadline - now``.

**Liveness** (``Prediction.alive_ts``): the time of the latest evidence that an open call is
still running. An end is reported when it happens (a hook, or the gateway's next request), so
its absence is such evidence up to ``now``: an open call's prediction never goes stale while it
runs (a session that silently stopped is ended by the idle sweep, not by readiness).

``t_{ν, 0.90}`` comes from the standard Student-t table for ν = 1..30 (4 decimals); beyond 30
from the normal quantile ``z = 1.2815516`` with the two-term Cornish–Fisher correction
``z + (z³ + z)/(4ν) + (5z⁵ + 16z³ + 3z)/(96ν²)`` (error < 1e-4 there, tends to ``z``).

Pure: values in, values out; ``now`` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

__all__ = [
    "ALPHA",
    "DEFAULT_DURATION_S",
    "MIN_SAMPLES",
    "OBSERVED",
    "Evidence",
    "History",
    "Prediction",
    "ToolCallView",
    "ToolStats",
    "censor",
    "duration_bound",
    "estimate_duration",
    "expected_remaining_s",
    "fold",
    "margin_factor",
    "predict_end",
    "record",
    "record_censored",
    "t_quantile",
    "update",
]

ALPHA: Final = 0.10
"""One-sided miss rate of the prediction bound: the bound is the 90 % quantile."""
DEFAULT_DURATION_S: Final = 5.0
"""Duration assumed when neither the tool nor the global history has ``MIN_SAMPLES``."""
MIN_SAMPLES: Final = 2
"""Completed calls needed before a history is used (a sample variance needs two)."""

_T_TABLE_090: Final = (
    3.0777, 1.8856, 1.6377, 1.5332, 1.4759, 1.4398, 1.4149, 1.3968, 1.3830, 1.3722,
    1.3634, 1.3562, 1.3502, 1.3450, 1.3406, 1.3368, 1.3334, 1.3304, 1.3277, 1.3253,
    1.3232, 1.3212, 1.3195, 1.3178, 1.3163, 1.3150, 1.3137, 1.3125, 1.3114, 1.3104,
)  # fmt: skip
"""Standard Student-t quantiles t_{ν, 0.90} for ν = 1..30."""
_Z_090: Final = 1.2815516

Evidence = Literal[
    "completed",
    "background",
    "expected_end",
    "progress",
    "deadline",
    "history:tool",
    "history:global",
    "default",
]
OBSERVED: Final[frozenset[Evidence]] = frozenset({"completed", "background"})
"""Evidence kinds that mean the call no longer blocks its session."""


def t_quantile(df: int) -> float:
    """Student-t quantile ``t_{df, 1 - ALPHA}`` (``df >= 1``)."""
    if df < 1:
        raise ValueError(f"df: must be >= 1, got {df}")
    if df <= len(_T_TABLE_090):
        return _T_TABLE_090[df - 1]
    z = _Z_090
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df * df)


def margin_factor(n: int) -> float:
    """``t_{n-1, 1-ALPHA} * sqrt(1 + 1/n)``: the bound is ``mean + margin_factor(n) * s``."""
    if n < 2:
        raise ValueError(f"n: must be >= 2, got {n}")
    return t_quantile(n - 1) * math.sqrt(1.0 + 1.0 / n)


def _check_duration(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"{name}: must be finite and >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class ToolStats:
    """Completed-duration statistics of one tool (or of all tools), in seconds.

    ``count``/``mean``/``m2`` are Welford's running sums (``m2`` = Σ (x - mean)²); ``min_s`` and
    ``max_s`` are meaningful only when ``count >= 1``. ``censored`` counts calls cut by a
    timeout and ``censored_max_s`` is the longest elapsed time at such a cut.
    """

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min_s: float = math.inf
    max_s: float = -math.inf
    censored: int = 0
    censored_max_s: float = 0.0

    @property
    def variance(self) -> float:
        """Sample variance (divisor ``count - 1``); 0 below two samples."""
        return self.m2 / (self.count - 1) if self.count >= 2 else 0.0

    @property
    def stdev(self) -> float:
        return math.sqrt(self.variance)


def update(stats: ToolStats, duration: float) -> ToolStats:
    """``stats`` with one more completed duration (Welford's update)."""
    _check_duration("duration", duration)
    n = stats.count + 1
    delta = duration - stats.mean
    mean = stats.mean + delta / n
    m2 = stats.m2 + delta * (duration - mean)
    return replace(
        stats,
        count=n,
        mean=mean,
        m2=max(m2, 0.0),
        min_s=min(stats.min_s, duration),
        max_s=max(stats.max_s, duration),
    )


def censor(stats: ToolStats, elapsed_at_cut: float) -> ToolStats:
    """``stats`` with one more call cut by a timeout after ``elapsed_at_cut`` seconds.

    A cut call is not a duration: the mean, variance, min and max are untouched.
    """
    _check_duration("elapsed_at_cut", elapsed_at_cut)
    return replace(
        stats,
        censored=stats.censored + 1,
        censored_max_s=max(stats.censored_max_s, elapsed_at_cut),
    )


def fold(durations: Iterable[float], stats: ToolStats | None = None) -> ToolStats:
    """``update`` applied to each duration in turn, starting from ``stats`` (or empty)."""
    acc = stats if stats is not None else ToolStats()
    for d in durations:
        acc = update(acc, d)
    return acc


def duration_bound(stats: ToolStats) -> float | None:
    """The clipped prediction bound ``d`` of the module docstring; None below MIN_SAMPLES."""
    if stats.count < MIN_SAMPLES:
        return None
    raw = stats.mean + margin_factor(stats.count) * stats.stdev
    hi = max(stats.max_s, stats.censored_max_s)
    return min(max(raw, stats.min_s), hi)


@dataclass(frozen=True, slots=True)
class History:
    """Per-tool statistics plus the global aggregate over every tool."""

    tools: Mapping[str, ToolStats] = field(default_factory=dict)
    overall: ToolStats = field(default_factory=ToolStats)
    estimates: dict[str, tuple[float, Evidence]] = field(
        default_factory=dict, compare=False, repr=False
    )
    """:func:`estimate_duration`'s answers so far, per tool: a history never changes (the
    ``record`` functions make a new one), and a tick asks it once per session in a tool."""

    def of(self, tool: str) -> ToolStats:
        return self.tools.get(tool, ToolStats())


def record(history: History, tool: str, duration: float) -> History:
    """``history`` with a completed call of ``tool`` that took ``duration`` seconds."""
    tools = dict(history.tools)
    tools[tool] = update(history.of(tool), duration)
    return History(tools=tools, overall=update(history.overall, duration))


def record_censored(history: History, tool: str, elapsed_at_cut: float) -> History:
    """``history`` with a call of ``tool`` cut by a timeout after ``elapsed_at_cut`` seconds."""
    tools = dict(history.tools)
    tools[tool] = censor(history.of(tool), elapsed_at_cut)
    return History(tools=tools, overall=censor(history.overall, elapsed_at_cut))


def estimate_duration(history: History, tool: str) -> tuple[float, Evidence]:
    """Predicted total duration of a call of ``tool``: per-tool → global → default."""
    known = history.estimates.get(tool)
    if known is not None:
        return known
    own = duration_bound(history.of(tool))
    if own is not None:
        out: tuple[float, Evidence] = (own, "history:tool")
    else:
        overall = duration_bound(history.overall)
        out = (
            (overall, "history:global") if overall is not None else (DEFAULT_DURATION_S, "default")
        )
    history.estimates[tool] = out
    return out


@dataclass(frozen=True, slots=True)
class ToolCallView:
    """What is known about a session's current tool call; all times are absolute seconds.

    ``expected_end_ts`` / ``progress_ts`` say when that evidence was reported (``None`` =
    at ``started_at``). ``progress`` is a fraction done in (0, 1]. ``deadline`` is
    ``started_at + timeout``.
    """

    tool: str
    started_at: float
    completed_at: float | None = None
    background: bool = False
    expected_end: float | None = None
    expected_end_ts: float | None = None
    progress: float | None = None
    progress_ts: float | None = None
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Prediction:
    """When the call is predicted to end, from which evidence, last updated when, and the
    time of the latest evidence that the call is still running (``alive_ts``: ``now`` for an
    open call, module docstring; ``evidence_ts`` when not given)."""

    predicted_end: float
    evidence: Evidence
    evidence_ts: float
    alive_ts: float | None = field(default=None, compare=False)

    @property
    def alive(self) -> float:
        """``alive_ts``, else ``evidence_ts``."""
        return self.evidence_ts if self.alive_ts is None else self.alive_ts

    @property
    def observed(self) -> bool:
        """True when the call's end (or its move to the background) was observed."""
        return self.evidence in OBSERVED

    def remaining(self, now: float) -> float:
        """Predicted remaining seconds, floored at 0."""
        return max(0.0, self.predicted_end - now)


def _interface(call: ToolCallView) -> tuple[float, Evidence, float] | None:
    """The expected_end or progress prediction, whichever was reported last."""
    options: list[tuple[float, int, float, Evidence]] = []
    if call.expected_end is not None:
        ts = call.expected_end_ts if call.expected_end_ts is not None else call.started_at
        options.append((ts, 1, call.expected_end, "expected_end"))
    f = call.progress
    if f is not None and f > 0.0:
        ts = call.progress_ts if call.progress_ts is not None else call.started_at
        elapsed = ts - call.started_at
        if f >= 1.0:
            options.append((ts, 0, ts, "progress"))
        elif elapsed > 0.0:
            options.append((ts, 0, call.started_at + elapsed / f, "progress"))
    if not options:
        return None
    ts, _, end, evidence = max(options)
    return end, evidence, ts


def predict_end(call: ToolCallView, history: History, now: float) -> Prediction:
    """Predict the end of ``call`` from the strongest evidence available (module docstring).

    Evidence timestamps later than ``now`` (clock skew) are read as ``now``.
    """
    if call.completed_at is not None:
        ts = min(call.completed_at, now)
        return Prediction(call.completed_at, "completed", ts)
    if call.background:
        ts = min(call.started_at, now)
        return Prediction(call.started_at, "background", ts)
    found = _interface(call)
    if found is not None:
        end, evidence, ts = found
    else:
        duration, evidence = estimate_duration(history, call.tool)
        end, ts = call.started_at + duration, call.started_at
    if call.deadline is not None and call.deadline < end:
        return Prediction(call.deadline, "deadline", min(now, call.deadline), now)
    return Prediction(end, evidence, min(ts, now), now)


def _q(z: float) -> float:
    """Standard normal survival function ``P(Z > z)``."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _mean_residual(stats: ToolStats, elapsed: float) -> float | None:
    """``E[D - e | D > e]`` under the moment-fitted log-normal (module docstring); None when
    the tail has underflowed or the history cannot fit one."""
    m, v = stats.mean, stats.variance
    if m <= 0.0:
        return None
    if elapsed <= 0.0:
        return m
    s2 = math.log1p(v / (m * m))
    if s2 <= 0.0:  # every sample the same: a point mass at m
        return m - elapsed if elapsed < m else None
    sigma = math.sqrt(s2)
    z = (math.log(elapsed) - (math.log(m) - s2 / 2.0)) / sigma
    tail = _q(z)
    if tail < 1e-12:
        return None
    return max(0.0, m * _q(z - sigma) / tail - elapsed)


def expected_remaining_s(
    call: ToolCallView, history: History, now: float, pred: Prediction | None = None
) -> float:
    """Mean remaining seconds of ``call`` given how long it has run (module docstring);
    ``pred`` is :func:`predict_end`'s answer for the same call and ``now`` when the caller
    already has it."""
    if pred is None:
        pred = predict_end(call, history, now)
    if pred.observed:
        return 0.0
    elapsed = max(0.0, now - call.started_at)
    out = elapsed  # as long again as it has run, when nothing says better
    if pred.evidence in ("expected_end", "progress"):
        if now < pred.predicted_end:
            out = pred.predicted_end - now
    else:
        stats = history.of(call.tool)
        if stats.count < MIN_SAMPLES:
            stats = history.overall
        residual = _mean_residual(stats, elapsed) if stats.count >= MIN_SAMPLES else None
        if residual is not None:  # else it has outrun its history, or none exists (new: ~0)
            out = residual
    if call.deadline is not None:
        out = min(out, max(0.0, call.deadline - now))
    return max(0.0, out)
