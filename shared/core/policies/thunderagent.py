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

This is the resume placement on a TAO ``Problem`` (``tao plan`` / ``tao compare`` run it beside
the other policies). ThunderAgent as a scheduler — its periodic check, pause loop, marks,
blocking requests and forced resume, on its own ``tokens + 100`` accounting — is the state
machine of :mod:`shared.core.thunder`, which the simulator and the live planner drive.
"""

from __future__ import annotations

from shared.core.policies.base import PlanOptions
from shared.core.problem import (
    Dense,
    Phase,
    PlanDiagnostics,
    PlanResult,
    Problem,
    densify,
    result_from_choice,
)

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
            diagnostics=PlanDiagnostics(selected=len(selected), unplaced=unplaced, skipped=skipped),
        )
