"""Tool-return readiness ``r ∈ {0, 1}`` (DESIGN 3.1, paper §3.4 eq. 6).

Rules, first match wins (the ``rule`` names are what :class:`ReadinessResult` reports):

0. ``not-in-tool`` → 1. A pooled session that is not in a tool is waiting with a request (a
   new arrival, or a session whose tool ended and whose next call is pending): it needs the
   GPU now.
1. ``completed`` → 1. The tool's completion (or its move to the background) was observed.
2. The predicted end has passed (``now >= predicted_end``) and no completion was observed: a
   *probe*. ``probe`` → 1 the first time this is seen for a given evidence timestamp, and the
   result carries ``probe_consumed=True``; afterwards ``probe-spent`` → 0 until newer evidence
   arrives (an ``evidence_ts`` later than the one the probe was spent on re-arms it). The
   session is therefore never stuck at "ready".
3. ``horizon`` → 1 when the predicted remaining time is ≤ ``horizon_s`` *and* the evidence that
   the call is still running is fresh (``now - alive <= freshness_s``, both inclusive, where
   ``alive`` is :attr:`Prediction.alive`: for an open call the absence of its end, i.e. ``now``,
   so a long call's prediction does not go stale while it runs); otherwise ``stale`` → 0 (old
   evidence) or ``beyond-horizon`` → 0 (fresh, but the end is further than the horizon).
   The horizon is the caller's: the paper's constant ``H``, or per session the time its
   readmission takes (:func:`shared.core.rules.readmit_horizon_s`).

The probe is explicit state the caller persists per session: ``probe_mark`` is the evidence
timestamp the probe was last spent on (``None`` = never). Pass it in, store
``result.probe_mark`` back. Every call that returns ``probe`` spends it, so call this once per
session per tick.

Pure: no clock; ``now`` is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from shared.core.predictor import Prediction

__all__ = [
    "DEFAULT_FRESHNESS_S",
    "DEFAULT_HORIZON_S",
    "ReadinessResult",
    "ReadinessState",
    "Rule",
    "readiness",
]

DEFAULT_HORIZON_S: Final = 1.0
"""``H``: a tool predicted to end within this many seconds makes its session ready."""
DEFAULT_FRESHNESS_S: Final = 30.0
"""A prediction whose evidence is older than this is not trusted (rule 3)."""

Rule = Literal[
    "not-in-tool",
    "completed",
    "probe",
    "probe-spent",
    "horizon",
    "beyond-horizon",
    "stale",
]


@dataclass(frozen=True, slots=True)
class ReadinessState:
    """Readiness inputs of one session.

    ``prediction`` is ``None`` when the session is not in a tool call. ``probe_mark`` is the
    evidence timestamp a probe was last spent on, as returned by the previous evaluation.
    """

    prediction: Prediction | None
    probe_mark: float | None = None


@dataclass(frozen=True, slots=True)
class ReadinessResult:
    """``r``, the rule that decided it, whether a probe was spent now, and the probe mark the
    caller must persist for the next evaluation."""

    r: int
    rule: Rule
    probe_consumed: bool = False
    probe_mark: float | None = None


def readiness(
    state: ReadinessState,
    now: float,
    *,
    horizon_s: float = DEFAULT_HORIZON_S,
    freshness_s: float = DEFAULT_FRESHNESS_S,
) -> ReadinessResult:
    """Readiness of one session at ``now`` by the rules of the module docstring."""
    mark = state.probe_mark
    pred = state.prediction
    if pred is None:
        return ReadinessResult(1, "not-in-tool", probe_mark=mark)
    if pred.observed:
        return ReadinessResult(1, "completed", probe_mark=mark)
    if now >= pred.predicted_end:
        if mark is None or pred.evidence_ts > mark:
            return ReadinessResult(1, "probe", probe_consumed=True, probe_mark=pred.evidence_ts)
        return ReadinessResult(0, "probe-spent", probe_mark=mark)
    if now - pred.alive > freshness_s:
        return ReadinessResult(0, "stale", probe_mark=mark)
    if pred.remaining(now) <= horizon_s:
        return ReadinessResult(1, "horizon", probe_mark=mark)
    return ReadinessResult(0, "beyond-horizon", probe_mark=mark)
