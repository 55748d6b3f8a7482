"""Every registered policy plans feasibly on one scale; ablations and names behave as documented."""

from __future__ import annotations

import pytest

from shared.core.generate import generate
from shared.core.policies import POLICY_NAMES, PlanOptions, UnknownPolicyError, get_policy
from shared.core.problem import (
    Candidate,
    Dense,
    Node,
    Objective,
    PlanResult,
    Problem,
    densify,
    is_feasible,
    objective_of,
)

Q = 512
OPTS = PlanOptions(budget=50_000)


def choice_of(d: Dense, plan: PlanResult) -> list[int]:
    """The choice vector behind a plan's assignments (each session at most once)."""
    cand = {c: i for i, c in enumerate(d.cand_ids)}
    node = {x: b for b, x in enumerate(d.node_ids)}
    choice = [-1] * d.n
    for a in plan.assignments:
        assert choice[cand[a.session]] == -1, f"{a.session} assigned twice"
        choice[cand[a.session]] = node[a.node]
    return choice


@pytest.fixture(scope="module", params=[(1, 1.0, "one"), (5, 3.0, "several")])
def problem(request: pytest.FixtureRequest) -> Problem:
    seed, load, credit = request.param
    return generate(seed, nodes=4, candidates=32, load=load, credit=credit, interchangeable=False)


class TestEveryPolicy:
    @pytest.mark.parametrize("name", POLICY_NAMES)
    def test_feasible_plan_with_honest_objective(self, name: str, problem: Problem) -> None:
        """Each policy returns a feasible plan whose objective is recomputed exactly from it
        under the full valuation."""
        plan = get_policy(name).plan(problem, OPTS)
        d = densify(problem)
        choice = choice_of(d, plan)
        assert is_feasible(d, choice)
        assert plan.objective == objective_of(d, choice)
        assert plan.method

    def test_names_are_unique_and_tao_first(self) -> None:
        """POLICY_NAMES lists each policy once, ``tao`` first, and each builds a fresh object
        named as registered."""
        assert POLICY_NAMES[0] == "tao"
        assert len(set(POLICY_NAMES)) == len(POLICY_NAMES)
        for name in POLICY_NAMES:
            assert get_policy(name).name == name
            assert get_policy(name) is not get_policy(name)

    def test_tao_is_best_on_the_full_valuation(self, problem: Problem) -> None:
        """tao's objective is at least every non-ablated policy's on the same snapshot."""
        tao = get_policy("tao").plan(problem, OPTS)
        for name in POLICY_NAMES:
            if name.startswith("tao-no"):
                continue  # ablations optimise another valuation
            other = get_policy(name).plan(problem, OPTS)
            assert tao.objective >= other.objective, name


class TestAblations:
    def test_no_cache_ignores_credit(self, problem: Problem) -> None:
        """tao-no-cache optimises with credit zeroed: its own objective has credit 0."""
        plan = get_policy("tao-no-cache").plan(problem, OPTS)
        own = plan.diagnostics.own_objective
        assert isinstance(own, Objective) and own[0] == 0
        assert own[1:] == plan.objective[1:]

    def test_no_ready_ignores_readiness(self, problem: Problem) -> None:
        """tao-no-ready optimises with readiness zeroed: its own objective has ready 0."""
        plan = get_policy("tao-no-ready").plan(problem, OPTS)
        own = plan.diagnostics.own_objective
        assert isinstance(own, Objective) and own[1] == 0
        assert own[0] == plan.objective.credit

    def test_no_cache_no_ready(self, problem: Problem) -> None:
        """Both ablated: credit and readiness are 0 in its own objective."""
        own = get_policy("tao-no-cache-no-ready").plan(problem, OPTS).diagnostics.own_objective
        assert isinstance(own, Objective) and own[:2] == (0, 0)

    def test_tao_own_objective_is_its_objective(self, problem: Problem) -> None:
        """Unablated tao optimises the full valuation itself."""
        plan = get_policy("tao").plan(problem, OPTS)
        assert plan.diagnostics.own_objective == plan.objective


class TestUnknownPolicy:
    def test_raises_with_the_name(self) -> None:
        """An unregistered name raises UnknownPolicyError naming it and the known ones."""
        with pytest.raises(UnknownPolicyError) as err:
            get_policy("fastest")
        assert err.value.name == "fastest"
        assert "'fastest'" in str(err.value) and "tao" in str(err.value)
        assert isinstance(err.value, KeyError)


class TestFigure11:
    def test_tao_admits_the_long_high_credit_session(self) -> None:
        """Short-first admits 6 small sessions on their affinity node and defers the long
        high-credit one; tao admits all 7 and scores higher."""
        small = tuple(
            Candidate(f"small{i}", weight=Q, tokens=1_000, ready=1, credit={"a": 256})
            for i in range(6)
        )
        long = Candidate("long", weight=6 * Q, tokens=30_000, ready=1, credit={"a": 40_000})
        problem = Problem(
            quantum=Q, nodes=(Node("a", 8 * Q), Node("b", 4 * Q)), candidates=(*small, long)
        )
        sf = get_policy("short-first").plan(problem, OPTS)
        tao = get_policy("tao").plan(problem, OPTS)
        assert len(sf.assignments) == 6
        assert "long" not in {a.session for a in sf.assignments}
        assert len(tao.assignments) == 7
        assert tao.assignments[0].session == "long" and tao.assignments[0].node == "a"
        assert tao.exact
        assert tao.objective > sf.objective
        assert tao.objective.credit == 40_000 + 2 * 256
