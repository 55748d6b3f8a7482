"""Per-tick valuation: weights, free capacity, eligibility and the planner's Problem (DESIGN 3.2).

The valuation service calls :func:`build_problem` each tick with plain value objects read from
its store and gets back the :class:`~shared.core.problem.Problem` for the planner, one
:class:`CandidateDiagnostics` per pooled session (for the shell to log) and the probe marks to
persist (see :mod:`shared.core.readiness`). Every term is a small pure function:

- ``w_i = max(tokens - shared, 0) + reserve`` (:func:`session_weight`): a session that shares
  all of its context still needs the reserve for its next turn, so the weight is ≥ ``reserve``.
- ``C_b = max(0, floor(capacity × target) - Σ admitted weights)`` (:func:`free_capacity`): an
  over-committed node has no free capacity, never negative capacity. ``target`` is read as the
  decimal it was written as (0.7 means 7/10 exactly), so ``floor`` does not lose a token to
  binary rounding.
- ``e_ib`` (:func:`eligible`): node healthy, serves the session's model, ``w_i <= C_b``.
- ``k_ib``: decayed, rounded credit (:mod:`shared.core.decay`), kept only on eligible nodes;
  ``r_i``: readiness (:mod:`shared.core.readiness`) of the predicted tool end
  (:mod:`shared.core.predictor`); ``t_i``: the session's tokens.

Pure: no clock; ``now`` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final, Literal

from shared.core.decay import DEFAULT_HALF_LIFE_S, decayed_credits
from shared.core.predictor import Evidence, History, ToolCallView, predict_end
from shared.core.problem import Candidate, Node, Phase, Problem, ProblemError
from shared.core.readiness import (
    DEFAULT_FRESHNESS_S,
    DEFAULT_HORIZON_S,
    ReadinessState,
    Rule,
    readiness,
)

__all__ = [
    "DEFAULT_CREDIT_UNIT",
    "DEFAULT_QUANTUM",
    "DEFAULT_RESERVE",
    "CandidateDiagnostics",
    "Ineligibility",
    "NodeView",
    "SessionView",
    "Valuation",
    "ValuationParams",
    "build_candidate",
    "build_nodes",
    "build_problem",
    "eligible",
    "free_capacity",
    "ineligibility",
    "session_weight",
]

DEFAULT_RESERVE: Final = 512
"""Tokens reserved for a session's next turn on top of its unshared context."""
DEFAULT_QUANTUM: Final = 512
"""Capacity quantum Δ in tokens."""
DEFAULT_CREDIT_UNIT: Final = 256
"""Credit rounding unit U in tokens (half a default quantum)."""

Ineligibility = Literal["unhealthy", "model", "too-large"]


def session_weight(tokens: int, shared_tokens: int, reserve: int = DEFAULT_RESERVE) -> int:
    """``max(tokens - shared_tokens, 0) + reserve``: the capacity an admission reserves."""
    if tokens < 0 or shared_tokens < 0 or reserve < 0:
        got = f"{tokens}, {shared_tokens}, {reserve}"
        raise ValueError(f"tokens, shared_tokens, reserve: must be >= 0, got {got}")
    return max(tokens - shared_tokens, 0) + reserve


def free_capacity(
    capacity_tokens: int, target_utilisation: float, reserved_weights: Iterable[int]
) -> int:
    """``floor(capacity × target) - Σ reserved``, clamped at 0 when over-committed."""
    if capacity_tokens < 0:
        raise ValueError(f"capacity_tokens: must be >= 0, got {capacity_tokens}")
    if not 0.0 <= target_utilisation <= 1.0:
        raise ValueError(f"target_utilisation: must be in [0, 1], got {target_utilisation}")
    usable = math.floor(capacity_tokens * Fraction(repr(float(target_utilisation))))
    return max(0, usable - sum(reserved_weights))


def ineligibility(
    healthy: bool,
    node_models: frozenset[str] | None,
    session_model: str | None,
    weight: int,
    free: int,
) -> Ineligibility | None:
    """Why a session may not go to a node, or ``None`` when it may.

    ``node_models=None`` means the node serves any model; ``session_model=None`` means the
    session accepts any node. Checked in the order: health, model, size.
    """
    if not healthy:
        return "unhealthy"
    if node_models is not None and session_model is not None and session_model not in node_models:
        return "model"
    if weight > free:
        return "too-large"
    return None


def eligible(
    healthy: bool,
    node_models: frozenset[str] | None,
    session_model: str | None,
    weight: int,
    free: int,
) -> bool:
    """True when the node is healthy, serves the session's model and ``weight <= free``."""
    return ineligibility(healthy, node_models, session_model, weight, free) is None


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the store sees it: ``reserved`` = Σ weights of sessions admitted on it;
    ``running`` the requests its engine runs (telemetry's ``vllm:num_requests_running``)."""

    id: str
    capacity_tokens: int
    target_utilisation: float = 1.0
    reserved: int = 0
    healthy: bool = True
    models: frozenset[str] | None = None
    running: int = 0


@dataclass(frozen=True, slots=True)
class SessionView:
    """A pooled session as the store sees it.

    ``residency`` maps node id → ``(k0, t_obs)``: resident prefix tokens last observed there and
    when. ``tool`` is the current tool call, ``None`` when the session is not in a tool.
    ``probe_mark`` is the persisted readiness probe mark; ``phase`` is passed through.
    """

    id: str
    tokens: int
    shared_tokens: int = 0
    model: str | None = None
    residency: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    tool: ToolCallView | None = None
    probe_mark: float | None = None
    phase: Phase | None = None


@dataclass(frozen=True, slots=True)
class ValuationParams:
    """Knobs of one valuation; defaults are DESIGN 3.1–3.2."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    credit_unit: int = DEFAULT_CREDIT_UNIT
    quantum: int = DEFAULT_QUANTUM
    reserve: int = DEFAULT_RESERVE
    horizon_s: float = DEFAULT_HORIZON_S
    freshness_s: float = DEFAULT_FRESHNESS_S


@dataclass(frozen=True, slots=True)
class CandidateDiagnostics:
    """Why a candidate got its values: for the shell's log line, never read by the planner.

    ``credits`` are the decayed credits on every node with residency (eligible or not);
    ``ineligible`` maps node id → reason for every node the session may not go to.
    """

    session_id: str
    weight: int
    rule: Rule
    evidence: Evidence | None
    evidence_ts: float | None
    predicted_end: float | None
    probe_consumed: bool
    probe_mark: float | None
    credits: Mapping[str, int]
    ineligible: Mapping[str, Ineligibility]


@dataclass(frozen=True, slots=True)
class Valuation:
    """One tick's valuation: the problem, per-candidate diagnostics (problem order), and the
    probe mark to persist per session id."""

    problem: Problem
    diagnostics: tuple[CandidateDiagnostics, ...]
    probe_marks: Mapping[str, float | None]


def build_nodes(nodes: Sequence[NodeView]) -> tuple[Node, ...]:
    """Planner nodes with this tick's free capacity; ``load`` is the reserved tokens."""
    seen: set[str] = set()
    out: list[Node] = []
    for i, nv in enumerate(nodes):
        if nv.id in seen:
            raise ProblemError(f"nodes[{i}].id", f"duplicate node id {nv.id!r}")
        seen.add(nv.id)
        free = free_capacity(nv.capacity_tokens, nv.target_utilisation, (nv.reserved,))
        out.append(Node(id=nv.id, free=free, load=nv.reserved))
    return tuple(out)


def build_candidate(
    session: SessionView,
    nodes: Sequence[NodeView],
    planned: Sequence[Node],
    history: History,
    now: float,
    params: ValuationParams = ValuationParams(),
) -> tuple[Candidate, CandidateDiagnostics]:
    """Value one pooled session against ``nodes`` (``planned`` = ``build_nodes(nodes)``)."""
    weight = session_weight(session.tokens, session.shared_tokens, params.reserve)
    ineligible: dict[str, Ineligibility] = {}
    ok: set[str] = set()
    for nv, nd in zip(nodes, planned, strict=True):
        why = ineligibility(nv.healthy, nv.models, session.model, weight, nd.free)
        if why is None:
            ok.add(nv.id)
        else:
            ineligible[nv.id] = why
    credits = decayed_credits(
        session.residency, now, half_life_s=params.half_life_s, unit=params.credit_unit
    )
    pred = None if session.tool is None else predict_end(session.tool, history, now)
    ready = readiness(
        ReadinessState(pred, session.probe_mark),
        now,
        horizon_s=params.horizon_s,
        freshness_s=params.freshness_s,
    )
    candidate = Candidate(
        id=session.id,
        weight=weight,
        tokens=session.tokens,
        ready=ready.r,
        credit={b: k for b, k in credits.items() if b in ok},
        eligible=frozenset(ok),
        phase=session.phase,
    )
    diagnostics = CandidateDiagnostics(
        session_id=session.id,
        weight=weight,
        rule=ready.rule,
        evidence=None if pred is None else pred.evidence,
        evidence_ts=None if pred is None else pred.evidence_ts,
        predicted_end=None if pred is None else pred.predicted_end,
        probe_consumed=ready.probe_consumed,
        probe_mark=ready.probe_mark,
        credits=credits,
        ineligible=ineligible,
    )
    return candidate, diagnostics


def build_problem(
    sessions: Sequence[SessionView],
    nodes: Sequence[NodeView],
    history: History,
    now: float,
    params: ValuationParams = ValuationParams(),
) -> Valuation:
    """The planner's problem for one tick, candidates and nodes in input order."""
    if params.quantum < 1:
        raise ProblemError("quantum", f"must be >= 1, got {params.quantum}")
    planned = build_nodes(nodes)
    seen: set[str] = set()
    candidates: list[Candidate] = []
    diagnostics: list[CandidateDiagnostics] = []
    for i, sv in enumerate(sessions):
        if sv.id in seen:
            raise ProblemError(f"candidates[{i}].id", f"duplicate session id {sv.id!r}")
        seen.add(sv.id)
        cand, diag = build_candidate(sv, nodes, planned, history, now, params)
        candidates.append(cand)
        diagnostics.append(diag)
    problem = Problem(quantum=params.quantum, nodes=planned, candidates=tuple(candidates))
    marks = {d.session_id: d.probe_mark for d in diagnostics}
    return Valuation(problem=problem, diagnostics=tuple(diagnostics), probe_marks=marks)
