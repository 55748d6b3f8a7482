"""The one interface every placement policy implements (``tao`` and each baseline)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shared.core.problem import PlanResult, Problem

DEFAULT_BUDGET = 150_000
"""Default DP state budget per solve: child states examined, summed over layers. Sized by
``benchmarks/planner.py`` so that p99 solve time stays under 50 ms up to 8 nodes × 160
candidates on one core (docs/benchmarks.md)."""


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Knobs a caller passes to a policy.

    ``budget`` bounds the DP states explored. ``expired`` is an injected deadline check (the core
    owns no clock): the solver polls it between layers and falls back when it returns true.
    With ``expired=None`` every policy is deterministic for a given problem.
    """

    budget: int = DEFAULT_BUDGET
    expired: Callable[[], bool] | None = None


class Policy(Protocol):
    """A placement policy: a frozen snapshot in, an ordered plan out."""

    name: str

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult: ...
