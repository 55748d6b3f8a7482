"""Baseline ``thunderagent``: ThunderAgent's program-aware pause/resume scheduler (DESIGN 3.5).

Sources (ThunderAgent-org/ThunderAgent): ``wiki/Scheduler.md``; ``ThunderAgent/scheduler/
router.py`` (``_greedy_resume``, ``_pause_until_safe``, ``_wait_for_resume(timeout=1800.0)``,
``scheduler_interval=5.0``, ``acting_token_weight=1.0``); ``ThunderAgent/backend/state.py``
(``BUFFER_PER_PROGRAM = 100``, ``remaining_capacity``, ``remaining_capacity_with_decay``).

Placement (:func:`thunderagent`), ThunderAgent's ``_greedy_resume`` on the snapshot:

1. the total remaining capacity is ``Σ cap`` over the healthy nodes (here: nodes that at least
   one candidate may use — the snapshot has no health flag, and a node nobody may use is not
   serving this pool);
2. candidates are taken in class order — ``reasoning`` (a pending request), then ``new``, then
   ``acting`` (:attr:`Candidate.effective_phase`) — fewest tokens first within a class, ties in
   arrival order; each is selected when the running total still fits the total capacity
   (a candidate that does not fit is passed over and the walk goes on, as the source does);
3. the selected candidates are placed largest first (by weight, then tokens; ties in selection
   order) on the eligible node with the most remaining capacity (ties to the lower index),
   blind to where their cache lives; one that fits nowhere stays paused.

The size is the snapshot weight ``w`` in quanta, not ``tokens + 100``: ``w`` already holds the
session's tokens net of shared prefix plus the next-turn reserve, and it is the common admission
currency every policy is judged by (one feasibility test for all), so ThunderAgent's buffer is
not added a second time.

Pause rules (services and the simulator run them; pure here for reuse): :func:`thunderagent_pause`,
:func:`thunderagent_remaining`, :func:`thunderagent_overdue`, :func:`thunderagent_due`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

from shared.core.policies.base import PlanOptions
from shared.core.problem import Dense, Phase, PlanResult, Problem, densify, result_from_choice

BUFFER_PER_PROGRAM = 100
"""Tokens ThunderAgent reserves per active program for decode headroom."""

SCHEDULER_INTERVAL_S = 5.0
"""Seconds between ThunderAgent's periodic checks (``--scheduler-interval``)."""

WAIT_TIMEOUT_S = 1800.0
"""Seconds a paused program waits before ThunderAgent force-resumes it regardless of capacity."""

DEFAULT_ACTING_WEIGHT = 1.0

PHASE_RANK: dict[Phase, int] = {"reasoning": 0, "new": 1, "acting": 2}


# --- placement -----------------------------------------------------------------------------


def healthy_nodes(problem: Problem) -> list[int]:
    """Indices of nodes that at least one candidate may use (``eligible`` None = all)."""
    ids = [nd.id for nd in problem.nodes]
    if any(c.eligible is None for c in problem.candidates):
        return list(range(len(ids)))
    allowed: set[str] = set()
    for c in problem.candidates:
        allowed |= c.eligible or frozenset()
    return [j for j, node_id in enumerate(ids) if node_id in allowed]


def thunderagent_order(d: Dense, problem: Problem) -> list[int]:
    """Candidate indices in resume priority: class (reasoning, new, acting), tokens, arrival."""
    phases = [c.effective_phase for c in problem.candidates]
    return sorted(range(d.n), key=lambda i: (PHASE_RANK[phases[i]], int(d.t[i]), i))


def thunderagent_select(d: Dense, problem: Problem) -> list[int]:
    """Candidates selected for resume, in priority order, whose total fits the total capacity."""
    total = sum(int(d.cap[b]) for b in healthy_nodes(problem))
    selected: list[int] = []
    used = 0
    for i in thunderagent_order(d, problem):
        wi = int(d.w[i])
        if used + wi <= total:
            selected.append(i)
            used += wi
    return selected


def thunderagent(d: Dense, problem: Problem) -> list[int]:
    """Choice vector of ThunderAgent's greedy resume: select by class, then BFD on most free."""
    choice = [-1] * d.n
    rem = [int(c) for c in d.cap]
    selected = thunderagent_select(d, problem)
    for i in sorted(selected, key=lambda i: (-int(d.w[i]), -int(d.t[i]))):
        wi = int(d.w[i])
        nodes = [b for b in range(d.m) if d.elig[i, b]]
        if not nodes:
            continue
        b = min(nodes, key=lambda b: (-rem[b], b))
        if wi <= rem[b]:
            choice[i] = b
            rem[b] -= wi
    return choice


class ThunderAgentPolicy:
    """``thunderagent``: class-ordered selection, largest first on the most free node."""

    def __init__(self, name: str = "thunderagent") -> None:
        self.name = name

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        selected = thunderagent_select(d, problem)
        choice = thunderagent(d, problem)
        unplaced = tuple(d.cand_ids[i] for i in selected if choice[i] < 0)
        skipped = tuple(d.cand_ids[i] for i, b in enumerate(choice) if b < 0)
        return result_from_choice(
            d,
            choice,
            exact=False,
            method=self.name,
            diagnostics={"selected": len(selected), "unplaced": unplaced, "skipped": skipped},
        )


# --- pause rules ---------------------------------------------------------------------------


class TAProgram(NamedTuple):
    """A program admitted on a backend, as ThunderAgent tracks it.

    ``tokens`` is the last response's ``usage.total_tokens``; ``acting_since`` the time it
    entered ACTING (``None`` when unknown); ``marked`` says a REASONING program is already
    marked to pause when its call ends.
    """

    id: str
    state: Literal["reasoning", "acting"]
    tokens: int
    acting_since: float | None = None
    marked: bool = False


class TABackend(NamedTuple):
    """A backend: ``capacity`` is its KV capacity in tokens net of shared prefix tokens
    (ThunderAgent's ``total_tokens_capacity − shared_tokens``), before the listed programs."""

    capacity: int
    programs: Sequence[TAProgram]


def program_weight(p: TAProgram, now: float, acting_weight: float, decay: bool) -> float:
    """Weight of a program's tokens: 1 when REASONING; ``acting_weight`` when ACTING, or
    ``2^−(seconds acting)`` with ``decay`` (``acting_weight`` when the start is unknown)."""
    if p.state != "acting":
        return 1.0
    if decay and p.acting_since is not None:
        return float(2.0 ** (-max(now - p.acting_since, 0.0)))
    return acting_weight


def thunderagent_remaining(
    backend: TABackend,
    now: float,
    *,
    acting_weight: float = DEFAULT_ACTING_WEIGHT,
    decay: bool = False,
) -> float:
    """Remaining capacity: ``capacity − Σ (weight × tokens + 100)`` (may be negative)."""
    used = sum(
        program_weight(p, now, acting_weight, decay) * p.tokens + BUFFER_PER_PROGRAM
        for p in backend.programs
    )
    return backend.capacity - used


def thunderagent_pause(
    backends: Sequence[TABackend],
    now: float,
    acting_weight: float = DEFAULT_ACTING_WEIGHT,
    decay: bool = False,
) -> list[str]:
    """Program ids to pause, backend by backend (ThunderAgent's ``_pause_until_safe``).

    On a backend with negative remaining capacity: ACTING programs, smallest first (ties in
    input order), are paused now, each freeing ``weight × tokens + 100``, until the remaining
    capacity is non-negative; if it is still negative, REASONING programs not yet marked,
    smallest first, are returned to be *marked*: the caller pauses them when their call ends.
    Marked programs (earlier ones included) count as releasing their tokens, ThunderAgent's
    ``future_paused_tokens``, so marking stops as soon as that makes the backend safe. (The
    source's loop re-tests ``remaining_capacity()``, which ignores marks and so marks every
    REASONING program; DESIGN 3.5 and the wiki state the intent "only until safe", followed
    here.) ThunderAgent pauses on the undecayed capacity, so ``decay`` defaults to false.
    """
    out: list[str] = []
    for be in backends:
        rem = thunderagent_remaining(be, now, acting_weight=acting_weight, decay=decay)
        if rem >= 0:
            continue
        acting = sorted((p for p in be.programs if p.state == "acting"), key=lambda p: p.tokens)
        for p in acting:
            if rem >= 0:
                break
            rem += program_weight(p, now, acting_weight, decay) * p.tokens + BUFFER_PER_PROGRAM
            out.append(p.id)
        reasoning = [p for p in be.programs if p.state == "reasoning"]
        rem += sum(p.tokens for p in reasoning if p.marked)
        for p in sorted((p for p in reasoning if not p.marked), key=lambda p: p.tokens):
            if rem >= 0:
                break
            rem += p.tokens
            out.append(p.id)
    return out


def thunderagent_overdue(
    waiting: Sequence[tuple[str, float]], now: float, timeout: float = WAIT_TIMEOUT_S
) -> list[str]:
    """Ids of paused programs (``(id, paused_at)``) that have waited ``timeout`` seconds or more;
    ThunderAgent then resumes them regardless of capacity (DESIGN 3.5: waiting is force-ended)."""
    return [pid for pid, since in waiting if now - since >= timeout]


def thunderagent_due(
    last_check: float | None, now: float, interval: float = SCHEDULER_INTERVAL_S
) -> bool:
    """True when the periodic check is due (never run, or ``interval`` seconds have passed)."""
    return last_check is None or now - last_check >= interval
