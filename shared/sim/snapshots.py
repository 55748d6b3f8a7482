"""DP vs short-first on the same contended snapshots (paper Appendix H, Figures 10–11).

A tao run captures the problems its planner solved (``SimConfig.capture_snapshots``: the first
rounds with more than one candidate). Each is solved again by ``tao`` (the DP) and by
``short-first`` (the affinity greedy), and their objectives — both under the full valuation, as
every :class:`~shared.core.problem.PlanResult` reports them — are compared lexicographically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.core.policies import PlanOptions, get_policy
from shared.core.problem import Objective, PlanResult, Problem

__all__ = ["SnapshotComparison", "SnapshotStudy", "compare_snapshots"]


@dataclass(frozen=True, slots=True)
class SnapshotComparison:
    t: float
    candidates: int
    dp: PlanResult
    greedy: PlanResult
    problem: Problem

    @property
    def verdict(self) -> int:
        """+1 when the DP's objective is better, 0 equal, -1 worse."""
        a, b = tuple(self.dp.objective), tuple(self.greedy.objective)
        return (a > b) - (a < b)


@dataclass(frozen=True, slots=True)
class SnapshotStudy:
    comparisons: tuple[SnapshotComparison, ...]

    @property
    def improved(self) -> int:
        return sum(1 for c in self.comparisons if c.verdict > 0)

    @property
    def equal(self) -> int:
        return sum(1 for c in self.comparisons if c.verdict == 0)

    @property
    def worse(self) -> int:
        return sum(1 for c in self.comparisons if c.verdict < 0)

    def credit_gains(self) -> list[tuple[int, int]]:
        """(DP credit, greedy credit) kept on the snapshots the DP improved."""
        return [
            (c.dp.objective.credit, c.greedy.objective.credit)
            for c in self.comparisons
            if c.verdict > 0
        ]

    def best(self) -> SnapshotComparison | None:
        """The improved snapshot with the largest credit gain (then admitted gain)."""
        better = [c for c in self.comparisons if c.verdict > 0]
        if not better:
            return None

        def gain(c: SnapshotComparison) -> tuple[int, int, float]:
            o1: Objective = c.dp.objective
            o2: Objective = c.greedy.objective
            return (o1.credit - o2.credit, o1.admitted - o2.admitted, -c.t)

        return max(better, key=gain)


def compare_snapshots(
    snapshots: Sequence[tuple[float, Problem]], budget: int | None = None
) -> SnapshotStudy:
    """Solve each snapshot with ``tao`` and ``short-first`` and compare."""
    opts = PlanOptions() if budget is None else PlanOptions(budget=budget)
    out: list[SnapshotComparison] = []
    for t, problem in snapshots:
        dp = get_policy("tao").plan(problem, opts)
        greedy = get_policy("short-first").plan(problem, opts)
        out.append(SnapshotComparison(t, len(problem.candidates), dp, greedy, problem))
    return SnapshotStudy(tuple(out))
