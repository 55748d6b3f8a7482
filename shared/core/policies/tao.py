"""The ``tao`` policy and its ablations, plus the ``short-first`` greedy baseline.

``tao`` solves the lexicographic placement with :func:`shared.core.planner.solve`. The ablations
are rule sets (:mod:`shared.core.rules`): ``tao-no-cache`` / ``tao-no-ready`` switch the credit
or readiness signal off in the round (:func:`shared.core.tick.decide` zeroes it in the snapshot,
the one place it is switched), ``tao-bfd`` places by best-fit-decreasing instead of the DP, as in
the paper's Table 4; ``diagnostics.own_objective`` holds the value the policy optimised.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from shared.core.heuristics import balance, bfd, short_first
from shared.core.planner import solve
from shared.core.policies.base import PlanOptions
from shared.core.problem import (
    Dense,
    PlanDiagnostics,
    PlanResult,
    Problem,
    densify,
    objective_of,
    result_from_choice,
)
from shared.core.rules import DEFAULT_RULES, RuleSet


def _ablate(d: Dense, rules: RuleSet) -> Dense:
    """The problem with the credit or readiness signal off where the rule set has it off."""
    cache, ready = "cache" in rules, "ready" in rules
    if cache and ready:
        return d
    return replace(
        d,
        k=d.k if cache else np.zeros_like(d.k),
        r=d.r if ready else np.zeros_like(d.r),
    )


@dataclass
class TaoPolicy:
    """TAO: exact lexicographic DP with bounded fallback (see :mod:`shared.core.planner`),
    spread over equally valued nodes by :func:`shared.core.heuristics.balance` (same value)."""

    name: str = "tao"
    rules: RuleSet = DEFAULT_RULES
    """The round's rule set (:mod:`shared.core.rules`), read by :func:`shared.core.tick.decide`;
    its ``cache`` / ``ready`` rules also decide what this search optimises (a problem planned
    on its own, ``tao plan``, is ablated here as the round ablates its snapshot)."""

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        own = _ablate(d, self.rules)
        sol = solve(own, budget=options.budget, expired=options.expired)
        return result_from_choice(
            d,
            balance(own, sol.choice),
            exact=sol.exact,
            method=sol.method,
            states=sol.states,
            reason=sol.reason,
            diagnostics=PlanDiagnostics(solve=sol.diagnostics, own_objective=sol.objective),
        )


@dataclass
class TaoBfdPolicy:
    """TAO's valuation, placed by best-fit-decreasing (largest weight first, most credit, then
    tightest fit): the paper's DP→BFD ablation."""

    name: str = "tao-bfd"
    rules: RuleSet = DEFAULT_RULES

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        choice = bfd(d)
        return result_from_choice(
            d,
            choice,
            exact=False,
            method="bfd",
            reason="ablation: no DP",
            diagnostics=PlanDiagnostics(own_objective=objective_of(d, choice)),
        )


@dataclass
class ShortFirstPolicy:
    """Short-first affinity greedy (the paper's Figures 10-11 comparison)."""

    name: str = "short-first"

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        return result_from_choice(
            d, short_first(d), exact=False, method="short-first", reason="greedy baseline"
        )
