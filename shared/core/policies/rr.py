"""Baseline ``rr``: vLLM-style round-robin routing, made capacity-safe.

vLLM's router (and SGLang's, from which it derives) sends request *j* to worker
``counter mod len(workers)`` and bumps the counter. Here the pool is walked in arrival order
(FCFS) and each candidate goes to the node the rotation pointer names; when that node is not
eligible or lacks room, the following nodes are tried in rotation order, and the pointer moves
just past the node actually used. A candidate is left out only when no node can take it.

The pointer persists across ticks in :class:`RoundRobinPolicy` (the only state a baseline
keeps); the functions below are pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.core.policies.base import PlanOptions
from shared.core.problem import (
    Dense,
    PlanDiagnostics,
    PlanResult,
    Problem,
    densify,
    result_from_choice,
)


def round_robin(d: Dense, problem: Problem, *, start: int = 0) -> list[int]:
    """Choice vector of round-robin placement starting the rotation at node ``start mod m``."""
    del problem  # rr looks at nothing but eligibility and room
    n, m = d.n, d.m
    choice = [-1] * n
    if m == 0:
        return choice
    rem = [int(c) for c in d.cap]
    ptr = start % m
    for i in range(n):
        wi = int(d.w[i])
        for step in range(m):
            b = (ptr + step) % m
            if d.elig[i, b] and wi <= rem[b]:
                choice[i] = b
                rem[b] -= wi
                ptr = (b + 1) % m
                break
    return choice


def round_robin_pointer(choice: Sequence[int], start: int, m: int) -> int:
    """Rotation pointer after a round-robin tick: just past the last node used, else unchanged.

    Candidates are placed in order, so the last placed candidate's node is the last node used.
    """
    if m == 0:
        return start
    for b in reversed(choice):
        if b >= 0:
            return (b + 1) % m
    return start % m


class RoundRobinPolicy:
    """``rr``: the rotation pointer starts at ``offset`` and carries over from tick to tick.

    The pointer is a node *index* (taken modulo the tick's node count), as vLLM's counter is.
    """

    name = "rr"

    def __init__(self, offset: int = 0) -> None:
        self.pointer = offset

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        choice = round_robin(d, problem, start=self.pointer)
        self.pointer = round_robin_pointer(choice, self.pointer, d.m)
        skipped = tuple(d.cand_ids[i] for i, b in enumerate(choice) if b < 0)
        return result_from_choice(
            d,
            choice,
            exact=False,
            method=self.name,
            diagnostics=PlanDiagnostics(pointer=self.pointer, skipped=skipped),
        )
