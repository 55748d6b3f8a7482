"""The one-tick placement problem, its dense (array) form, and the plan result.

Everything here is pure: values in, values out. A :class:`Problem` is what ``tao plan`` reads
and what the valuation service builds each tick (DESIGN 3.2). :func:`densify` turns it into the
integer arrays the kernels work on, discretising weights and capacities by the quantum Δ:
``w̄ = ceil(w/Δ)`` and ``C̄ = floor(C/Δ)``.

The objective is the lexicographic tuple ``(Σk, Σr, Σt, admitted)``. It is compared as a
Python tuple of ints (or as four int64 columns inside kernels), never folded into a weighted
sum, so it cannot tie or invert wrongly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

Phase = Literal["reasoning", "new", "acting"]

I64 = npt.NDArray[np.int64]
B1 = npt.NDArray[np.bool_]


class ProblemError(ValueError):
    """A snapshot that cannot be planned: names the field and the reason."""

    def __init__(self, field_path: str, reason: str) -> None:
        self.field_path = field_path
        self.reason = reason
        super().__init__(f"{field_path}: {reason}")


@dataclass(frozen=True, slots=True)
class Node:
    """A serving node with ``free`` tokens of admissible KV capacity this tick.

    ``load`` (tokens already reserved on the node) only informs load-aware baselines
    (cache-aware tie-break, kv-aware decode cost); it is not subtracted again from ``free``.
    """

    id: str
    free: int
    load: int = 0


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pooled session.

    ``credit`` maps node id → decayed, rounded cache credit in tokens (absent = 0).
    ``eligible`` is the set of node ids it may go to (``None`` = every node).
    ``phase`` is only read by the ``thunderagent`` baseline (its REASONING / new / ACTING
    classes); when absent it is derived as ``reasoning`` if ``ready`` else ``acting``.
    """

    id: str
    weight: int
    tokens: int
    ready: int = 0
    credit: Mapping[str, int] = field(default_factory=dict)
    eligible: frozenset[str] | None = None
    phase: Phase | None = None

    @property
    def effective_phase(self) -> Phase:
        if self.phase is not None:
            return self.phase
        return "reasoning" if self.ready else "acting"


@dataclass(frozen=True, slots=True)
class Problem:
    quantum: int
    nodes: tuple[Node, ...]
    candidates: tuple[Candidate, ...]


class Objective(NamedTuple):
    """Lexicographic objective. Tuple comparison is the order."""

    credit: int
    ready: int
    tokens: int
    admitted: int


ZERO = Objective(0, 0, 0, 0)


@dataclass(frozen=True, slots=True)
class Assignment:
    session: str
    node: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveDiagnostics:
    """What the exact planner (:func:`shared.core.planner.solve`) found on its way."""

    heuristics: tuple[tuple[str, Objective], ...] = ()
    """Each portfolio heuristic's objective, in portfolio order."""
    proof: Literal["bound", "dp"] | None = None
    """How the answer was proven optimal: an upper bound met, or the exact DP completed (None:
    not proven)."""
    groups: int | None = None
    """Node groups the DP saw (nodes alike in capacity and eligibility share one)."""
    root_bound: Objective | None = None
    """The upper bound on the whole snapshot, when the tables were built."""
    beam_width: int | None = None
    """The final beam's width, when one ran after the exact DP ran out of budget."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanDiagnostics:
    """Facts a policy reports about one plan, for the planner's log line (never logged in the
    core). Each field is set only by the policies it names."""

    solve: SolveDiagnostics | None = None
    """The exact planner's (TAO)."""
    own_objective: Objective | None = None
    """TAO's policies: the objective on the values the policy optimised (an ablation's own)."""
    skipped: tuple[str, ...] = ()
    """The heuristic baselines: candidates left unplaced."""
    pointer: int | None = None
    """Round robin: where the next round starts."""
    selected: int | None = None
    """ThunderAgent's pure planner: sessions its rule selected."""
    unplaced: tuple[str, ...] = ()
    """ThunderAgent's pure planner: selected sessions that fit nowhere."""
    marked: tuple[str, ...] = ()
    """ThunderAgent live: sessions its pause rule marked this step."""
    checked: bool | None = None
    """ThunderAgent live: whether its periodic pause check ran this step."""

    def log_fields(self) -> dict[str, object]:
        """The set fields as JSON-ready values (the DP's flattened in)."""
        out: dict[str, object] = {}
        if self.solve is not None:
            sv = self.solve
            out["heuristics"] = {name: list(obj) for name, obj in sv.heuristics} or None
            out["proof"] = sv.proof
            out["groups"] = sv.groups
            out["root_bound"] = None if sv.root_bound is None else list(sv.root_bound)
            out["beam_width"] = sv.beam_width
        out["own_objective"] = None if self.own_objective is None else list(self.own_objective)
        out["skipped"] = list(self.skipped) or None
        out["pointer"] = self.pointer
        out["selected"] = self.selected
        out["unplaced"] = list(self.unplaced) or None
        out["marked"] = list(self.marked) or None
        out["checked"] = self.checked
        return {k: v for k, v in out.items() if v is not None}


NO_DIAGNOSTICS = PlanDiagnostics()


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What a policy returns.

    ``assignments`` are ordered most valuable first, so any prefix is a sensible partial plan.
    ``exact`` is true only when the objective is proven optimal on the discretised snapshot.
    ``method`` names what produced the answer; ``reason`` says why it is not exact (or is
    ``None``). ``states`` counts DP child states examined (0 for heuristics).
    ``diagnostics`` carries extra facts for the shell to log (:class:`PlanDiagnostics`).
    """

    assignments: tuple[Assignment, ...]
    objective: Objective
    exact: bool
    method: str
    states: int = 0
    reason: str | None = None
    diagnostics: PlanDiagnostics = NO_DIAGNOSTICS


@dataclass(frozen=True, slots=True)
class Dense:
    """Integer-array form of a :class:`Problem` (n candidates × m nodes).

    ``w[i]`` weight in quanta, ``cap[b]`` free capacity in quanta, ``k[i, b]`` credit,
    ``r[i]`` readiness, ``t[i]`` tokens, ``elig[i, b]`` eligibility *and* fits-at-all
    (``w[i] <= cap[b]``); where ``elig`` is false, ``k`` is 0.
    """

    w: I64
    cap: I64
    k: I64
    r: I64
    t: I64
    elig: B1
    load: I64
    node_ids: tuple[str, ...]
    cand_ids: tuple[str, ...]

    @property
    def kmax(self) -> I64:
        """Each candidate's largest credit over nodes (0 with no nodes)."""
        if self.k.shape[1] == 0:
            return np.zeros(self.k.shape[0], dtype=np.int64)
        out: I64 = self.k.max(axis=1)
        return out

    @property
    def n(self) -> int:
        return int(self.w.shape[0])

    @property
    def m(self) -> int:
        return int(self.cap.shape[0])


MAX_VALUE = 2**40
"""Largest integer a snapshot may carry (tokens, credit, capacity, quantum): about 1.1e12, far
beyond any KV cache. It keeps every sum the planner forms (at most nodes × sessions such
values) inside int64 for up to 2**22 (session, node) pairs."""
MAX_PAIRS = 2**22
"""Most (session, node) pairs one snapshot may have."""


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_sizes(problem: Problem) -> None:
    """Raise :class:`ProblemError` for values past :data:`MAX_VALUE` or too many pairs, which
    could overflow the planner's int64 arithmetic. (Shape and sign checks belong to whoever
    parses the snapshot, such as ``tao plan``.)"""
    if len(problem.nodes) * len(problem.candidates) > MAX_PAIRS:
        raise ProblemError("candidates", f"too many (session, node) pairs (at most {MAX_PAIRS})")
    if problem.quantum > MAX_VALUE:
        raise ProblemError("quantum", f"too large (at most 2**40 = {MAX_VALUE})")
    for b, nd in enumerate(problem.nodes):
        for name, value in (("free", nd.free), ("load", nd.load)):
            if value > MAX_VALUE:
                raise ProblemError(f"nodes[{b}].{name}", f"too large (at most {MAX_VALUE})")
    for i, c in enumerate(problem.candidates):
        for name, value in (("weight", c.weight), ("tokens", c.tokens)):
            if value > MAX_VALUE:
                raise ProblemError(f"candidates[{i}].{name}", f"too large (at most {MAX_VALUE})")
        for node_id, credit in c.credit.items():
            if credit > MAX_VALUE:
                raise ProblemError(
                    f'candidates[{i}].credit["{node_id}"]', f"too large (at most {MAX_VALUE})"
                )


def densify(problem: Problem) -> Dense:
    """Discretise and lay out a problem as arrays. Assumes a validated problem, apart from the
    size limits, which it checks (:data:`MAX_VALUE`, :data:`MAX_PAIRS`)."""
    _check_sizes(problem)
    q = problem.quantum
    nodes = problem.nodes
    cands = problem.candidates
    n, m = len(cands), len(nodes)
    col = {nd.id: j for j, nd in enumerate(nodes)}
    w = np.array([ceil_div(c.weight, q) for c in cands], dtype=np.int64).reshape(n)
    cap = np.array([max(nd.free, 0) // q for nd in nodes], dtype=np.int64).reshape(m)
    load = np.array([nd.load for nd in nodes], dtype=np.int64).reshape(m)
    k = np.zeros((n, m), dtype=np.int64)
    elig = np.zeros((n, m), dtype=np.bool_)
    for i, c in enumerate(cands):
        allowed = range(m) if c.eligible is None else [col[x] for x in c.eligible if x in col]
        for j in allowed:
            if w[i] <= cap[j]:
                elig[i, j] = True
        for node_id, credit in c.credit.items():
            j2 = col.get(node_id)
            if j2 is not None and elig[i, j2]:
                k[i, j2] = credit
    r = np.array([c.ready for c in cands], dtype=np.int64).reshape(n)
    t = np.array([c.tokens for c in cands], dtype=np.int64).reshape(n)
    return Dense(
        w=w,
        cap=cap,
        k=k,
        r=r,
        t=t,
        elig=elig,
        load=load,
        node_ids=tuple(nd.id for nd in nodes),
        cand_ids=tuple(c.id for c in cands),
    )


def pair_value(d: Dense, i: int, b: int) -> Objective:
    """Value of admitting candidate ``i`` on node ``b``."""
    return Objective(int(d.k[i, b]), int(d.r[i]), int(d.t[i]), 1)


def objective_of(d: Dense, choice: Sequence[int]) -> Objective:
    """Objective of a full choice vector (``choice[i]`` = node index or -1)."""
    kk = rr = tt = cnt = 0
    for i, b in enumerate(choice):
        if b >= 0:
            kk += int(d.k[i, b])
            rr += int(d.r[i])
            tt += int(d.t[i])
            cnt += 1
    return Objective(kk, rr, tt, cnt)


def is_feasible(d: Dense, choice: Sequence[int]) -> bool:
    """True when every chosen pair is eligible and no node's capacity is exceeded."""
    used = [0] * d.m
    for i, b in enumerate(choice):
        if b < 0:
            continue
        if not d.elig[i, b]:
            return False
        used[b] += int(d.w[i])
    return all(used[b] <= int(d.cap[b]) for b in range(d.m))


def ordered_assignments(d: Dense, choice: Sequence[int]) -> tuple[Assignment, ...]:
    """Assignments most valuable first: by pair value (k, r, t) descending, then by the
    smaller weight (a cheaper prefix admits more), then input order (deterministic)."""
    chosen = [i for i, b in enumerate(choice) if b >= 0]
    chosen.sort(key=lambda i: (-int(d.k[i, choice[i]]), -int(d.r[i]), -int(d.t[i]), int(d.w[i]), i))
    return tuple(Assignment(d.cand_ids[i], d.node_ids[choice[i]]) for i in chosen)


def result_from_choice(
    d: Dense,
    choice: Sequence[int],
    *,
    exact: bool,
    method: str,
    states: int = 0,
    reason: str | None = None,
    diagnostics: PlanDiagnostics = NO_DIAGNOSTICS,
) -> PlanResult:
    if not exact and reason is None:
        reason = f"{method}: a heuristic, not proven optimal"
    return PlanResult(
        assignments=ordered_assignments(d, choice),
        objective=objective_of(d, choice),
        exact=exact,
        method=method,
        states=states,
        reason=reason,
        diagnostics=diagnostics,
    )
