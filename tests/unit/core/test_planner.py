"""The planner (DESIGN 3.2): exact where it says so, feasible always, never worse than its
heuristics, deterministic, and within its state budget."""

from __future__ import annotations

import copy
import itertools
import os
from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from shared.core import planner
from shared.core.brute import brute_force
from shared.core.generate import generate
from shared.core.heuristics import bfd, short_first
from shared.core.planner import solve
from shared.core.policies.base import PlanOptions
from shared.core.policies.tao import TaoPolicy
from shared.core.problem import (
    MAX_VALUE,
    Candidate,
    Dense,
    Node,
    Objective,
    Problem,
    ProblemError,
    densify,
    is_feasible,
    objective_of,
    pair_value,
)

NO_JIT = os.environ.get("NUMBA_DISABLE_JIT") == "1"
EXAMPLES = 100 if NO_JIT else 200
GENERATED = 10 if NO_JIT else 30
GENEROUS = 400_000


@st.composite
def problems(draw: st.DrawFn, max_n: int = 7, max_m: int = 3, min_m: int = 1) -> Problem:
    """A brute-forceable snapshot: random free capacity, weights, credit on any nodes,
    readiness, tokens and eligibility subsets, quantum 1, 256 or 512. In ``twins`` mode all
    nodes have the same free capacity and only ``n0`` carries credit or splits eligibility,
    so the other nodes are interchangeable (exercises symmetry merging)."""
    q = draw(st.sampled_from([1, 256, 512]))
    m = draw(st.integers(min_m, max_m))
    n = draw(st.integers(0, max_n))
    twins = draw(st.booleans())
    ids = [f"n{b}" for b in range(m)]
    unit = 1 if q == 1 else q // 4  # weights that straddle quantum boundaries
    same = draw(st.integers(0, 24)) * unit * 2
    nodes = tuple(
        Node(id=x, free=same if twins else draw(st.integers(0, 24)) * unit * 2) for x in ids
    )
    credit_places = ids[:1] if twins else ids
    cands = []
    for i in range(n):
        credit_nodes = draw(st.lists(st.sampled_from(credit_places), unique=True, max_size=m))
        credit = {
            x: draw(st.integers(0, 6)) * draw(st.sampled_from([1, 256])) for x in credit_nodes
        }
        if twins:
            eligible = draw(st.sampled_from([None, frozenset(ids[:1]), frozenset(ids[1:])]))
        else:
            eligible = draw(st.none() | st.frozensets(st.sampled_from(ids)))
        cands.append(
            Candidate(
                id=f"s{i}",
                weight=draw(st.integers(0, 16)) * unit + draw(st.integers(0, 1)),
                tokens=draw(st.integers(0, 40)),
                ready=draw(st.integers(0, 1)),
                credit=credit,
                eligible=eligible,
            )
        )
    return Problem(quantum=q, nodes=nodes, candidates=tuple(cands))


def check_plan(d: Dense, choice: list[int], objective: Objective) -> None:
    assert len(choice) == d.n
    assert is_feasible(d, choice)
    assert objective_of(d, choice) == objective


class TestExactOnSmallInstances:
    @given(problems())
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_matches_brute_force_at_a_generous_budget(self, problem: Problem) -> None:
        """With a generous budget the answer is proven optimal and equals brute force."""
        d = densify(problem)
        sol = solve(d, budget=GENEROUS)
        check_plan(d, sol.choice, sol.objective)
        assert sol.exact, sol.reason
        assert sol.reason is None
        assert sol.objective == brute_force(d)[1]

    @given(problems(), st.integers(1, 50))
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_tiny_budgets_stay_feasible_and_beat_the_greedies(
        self, problem: Problem, budget: int
    ) -> None:
        """At budgets of 1–50 states the choice is feasible, no worse than BFD or short-first,
        and equal to brute force whenever it claims to be exact."""
        d = densify(problem)
        sol = solve(d, budget=budget)
        check_plan(d, sol.choice, sol.objective)
        best = brute_force(d)[1]
        assert sol.objective <= best
        assert sol.objective >= objective_of(d, bfd(d))
        assert sol.objective >= objective_of(d, short_first(d))
        if sol.exact:
            assert sol.objective == best
        else:
            assert sol.reason


def beams_find_nothing(search: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap the planner's layered search so only the exact (width 0) pass runs."""

    def only_exact(*args: Any, width: int, **kw: Any) -> Any:
        if width:
            return planner._Search(0, True, None, 0)
        return search(*args, width=width, **kw)

    return only_exact


class TestExactSearchAlone:
    @given(problems(), st.sampled_from([30, 300, GENEROUS]))
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_dp_without_incumbent_matches_brute_force(self, problem: Problem, budget: int) -> None:
        """With no heuristics, no polish and no beams, the exact DP alone finds the optimum
        whenever it claims exactness (always at a generous budget), and stays feasible."""
        d = densify(problem)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(planner, "PORTFOLIO", ())
            mp.setattr(planner, "_polish", lambda d, choice: None)
            mp.setattr(planner, "_search", beams_find_nothing(planner._search))
            sol = planner.solve(d, budget=budget)
        check_plan(d, sol.choice, sol.objective)
        if budget == GENEROUS:
            assert sol.exact
        if sol.exact:
            assert sol.objective == brute_force(d)[1]


class TestExactFlagHonesty:
    @given(problems(), st.sampled_from([1, 10, 100, 1_000, 10_000]))
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_exact_implies_optimal(self, problem: Problem, budget: int) -> None:
        """Whenever the planner reports exact, its objective is the brute-force optimum."""
        d = densify(problem)
        sol = solve(d, budget=budget)
        check_plan(d, sol.choice, sol.objective)
        if sol.exact:
            assert sol.objective == brute_force(d)[1]


class TestDeadline:
    @given(problems(), st.integers(0, 5))
    @settings(max_examples=EXAMPLES // 2, deadline=None)
    def test_expired_deadline_falls_back_feasibly(self, problem: Problem, after: int) -> None:
        """A deadline that expires after a few polls still yields a feasible plan no worse than
        the greedies; when not exact it says why, and exact still means optimal."""
        d = densify(problem)
        polls = itertools.count()
        sol = solve(d, budget=GENEROUS, expired=lambda: next(polls) >= after)
        check_plan(d, sol.choice, sol.objective)
        assert sol.objective >= objective_of(d, bfd(d))
        assert sol.objective >= objective_of(d, short_first(d))
        if sol.exact:
            assert sol.objective == brute_force(d)[1]
        else:
            assert sol.reason and "time limit" in sol.reason

    def test_already_expired_on_a_large_instance(self) -> None:
        """Expired from the start on 64 × 8: inexact with a time-limit reason, still feasible."""
        d = densify(
            generate(2, nodes=8, candidates=64, load=2.0, credit="one", interchangeable=False)
        )
        sol = solve(d, budget=GENEROUS, expired=lambda: True)
        check_plan(d, sol.choice, sol.objective)
        if not sol.exact:
            assert sol.reason and "time limit" in sol.reason
        assert sol.objective >= objective_of(d, bfd(d))


class TestNeverWorseThanHeuristics:
    @given(
        seed=st.integers(0, 10_000),
        load=st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 5.0]),
        credit=st.sampled_from(["one", "several", "none"]),
        interchangeable=st.booleans(),
    )
    @settings(max_examples=GENERATED, deadline=None)
    def test_tao_dominates_bfd_and_short_first(
        self, seed: int, load: float, credit: str, interchangeable: bool
    ) -> None:
        """On 4 nodes × 24 generated sessions tao is never lexicographically worse than BFD or
        short-first."""
        problem = generate(
            seed,
            nodes=4,
            candidates=24,
            load=load,
            credit=credit,  # type: ignore[arg-type]
            interchangeable=interchangeable,
        )
        d = densify(problem)
        sol = solve(d, budget=50_000)
        check_plan(d, sol.choice, sol.objective)
        assert sol.objective >= objective_of(d, bfd(d))
        assert sol.objective >= objective_of(d, short_first(d))


class TestDeterminism:
    @given(problems())
    @settings(max_examples=EXAMPLES // 4, deadline=None)
    def test_same_input_same_plan(self, problem: Problem) -> None:
        """The same snapshot, twice or deep-copied, gives identical assignments and objective."""
        policy, opts = TaoPolicy(), PlanOptions()
        first = policy.plan(problem, opts)
        again = policy.plan(problem, opts)
        copied = TaoPolicy().plan(copy.deepcopy(problem), opts)
        for other in (again, copied):
            assert other.assignments == first.assignments
            assert other.objective == first.objective
            assert other.exact == first.exact

    @pytest.mark.parametrize("budget", [1_000, 40_000])
    def test_generated_instance_is_reproducible(self, budget: int) -> None:
        """A moderate generated snapshot (possibly inexact) plans identically twice."""
        problem = generate(
            7, nodes=4, candidates=24, load=2.0, credit="several", interchangeable=False
        )
        d = densify(problem)
        a, b = solve(d, budget=budget), solve(densify(copy.deepcopy(problem)), budget=budget)
        assert (a.choice, a.objective, a.exact, a.states) == (
            b.choice,
            b.objective,
            b.exact,
            b.states,
        )


class TestOrderedPlan:
    @given(problems())
    @settings(max_examples=EXAMPLES // 4, deadline=None)
    def test_most_valuable_first(self, problem: Problem) -> None:
        """Assignments come most valuable first: pair values (k, r, t) never increase."""
        d = densify(problem)
        plan = TaoPolicy().plan(problem, PlanOptions())
        cand = {c: i for i, c in enumerate(d.cand_ids)}
        node = {x: b for b, x in enumerate(d.node_ids)}
        values = [pair_value(d, cand[a.session], node[a.node])[:3] for a in plan.assignments]
        assert values == sorted(values, reverse=True)
        assert len({a.session for a in plan.assignments}) == len(plan.assignments)


def nodes_(*free: int) -> tuple[Node, ...]:
    return tuple(Node(id=f"n{b}", free=f) for b, f in enumerate(free))


def sessions(count: int, weight: int, **kw: object) -> tuple[Candidate, ...]:
    return tuple(
        Candidate(
            id=f"s{i}",
            weight=weight,
            tokens=kw.get("tokens", 1),  # type: ignore[arg-type]
            ready=int(kw.get("ready", 0)),
            credit=kw.get("credit", {}),
        )  # type: ignore[arg-type]
        for i in range(count)
    )


class TestEdgeCases:
    def test_no_nodes(self) -> None:
        """No nodes: nothing admitted, trivially exact."""
        d = densify(Problem(quantum=512, nodes=(), candidates=sessions(3, 512)))
        sol = solve(d, budget=GENEROUS)
        assert sol.choice == [-1, -1, -1] and sol.exact
        assert sol.objective == Objective(0, 0, 0, 0)

    def test_empty_pool(self) -> None:
        """No candidates: an empty, exact plan."""
        d = densify(Problem(quantum=512, nodes=nodes_(4096, 2048), candidates=()))
        sol = solve(d, budget=GENEROUS)
        assert sol.choice == [] and sol.exact and sol.objective == Objective(0, 0, 0, 0)

    def test_zero_capacity_everywhere(self) -> None:
        """Zero free capacity on every node: nothing admitted (weight 0 sessions aside)."""
        d = densify(Problem(quantum=512, nodes=nodes_(0, 0, 511), candidates=sessions(4, 100)))
        sol = solve(d, budget=GENEROUS)
        assert sol.choice == [-1] * 4 and sol.exact

    def test_nothing_fits(self) -> None:
        """Every session is larger than every node: nothing admitted, exact."""
        d = densify(
            Problem(
                quantum=256,
                nodes=nodes_(1024, 2048),
                candidates=sessions(5, 4096, credit={"n0": 10}),
            )
        )
        sol = solve(d, budget=GENEROUS)
        assert sol.choice == [-1] * 5 and sol.exact

    def test_ineligible_everywhere(self) -> None:
        """Sessions eligible nowhere (empty set or unknown nodes) are never admitted."""
        cands = (
            Candidate("a", weight=512, tokens=9, ready=1, eligible=frozenset()),
            Candidate("b", weight=512, tokens=9, ready=1, eligible=frozenset({"elsewhere"})),
            Candidate("c", weight=512, tokens=1, eligible=frozenset({"n1"})),
        )
        d = densify(Problem(quantum=512, nodes=nodes_(4096, 4096), candidates=cands))
        sol = solve(d, budget=GENEROUS)
        assert sol.choice == [-1, -1, 1] and sol.exact

    def test_credits_beyond_int32_sum_exactly(self) -> None:
        """Credits near 10**7 on 256 sessions sum past 2**31 and come back as exact ints."""
        cands = tuple(
            Candidate(
                f"s{i}",
                weight=512,
                tokens=1_000 + i,
                ready=i % 2,
                credit={f"n{i % 4}": 10**7 + 7 * i},
            )
            for i in range(256)
        )
        d = densify(Problem(quantum=512, nodes=nodes_(*[64 * 512] * 4), candidates=cands))
        sol = solve(d, budget=GENEROUS)
        check_plan(d, sol.choice, sol.objective)
        want = sum(10**7 + 7 * i for i in range(256))
        assert want > 2**31
        assert sol.objective == Objective(want, 128, sum(1_000 + i for i in range(256)), 256)
        assert all(type(x) is int for x in sol.objective)
        assert sol.exact

    def test_credits_beyond_int32_under_contention(self) -> None:
        """With only half fitting, large credits still give a feasible plan at least as good as
        the greedies, objective recomputed exactly."""
        cands = tuple(
            Candidate(
                f"s{i}",
                weight=512 * (1 + i % 3),
                tokens=1_000 + i,
                credit={f"n{i % 4}": 10**7 + 7 * i, f"n{(i + 1) % 4}": 10**7 - i},
            )
            for i in range(256)
        )
        d = densify(Problem(quantum=512, nodes=nodes_(*[128 * 512] * 4), candidates=cands))
        sol = solve(d, budget=20_000)
        check_plan(d, sol.choice, sol.objective)
        assert sol.objective.credit > 2**31
        assert sol.objective >= objective_of(d, bfd(d))
        assert sol.objective >= objective_of(d, short_first(d))

    def test_million_tokens_per_session(self) -> None:
        """256 sessions of 10**6 tokens each: tokens sum exactly, plan feasible."""
        cands = tuple(
            Candidate(f"s{i}", weight=10**6 + 512, tokens=10**6, ready=i % 3 == 0)
            for i in range(256)
        )
        d = densify(Problem(quantum=512, nodes=nodes_(*[40 * 10**6] * 4), candidates=cands))
        sol = solve(d, budget=20_000)
        check_plan(d, sol.choice, sol.objective)
        assert sol.objective.admitted == 4 * (40 * 10**6 // 512 // 1955)
        assert sol.objective.tokens == sol.objective.admitted * 10**6

    @pytest.mark.parametrize("credit", ["one", "several"])
    @pytest.mark.parametrize("budget", [10_000, 400_000])
    def test_large_instance_respects_budget(self, budget: int, credit: str) -> None:
        """256 candidates × 16 nodes: feasible, and states ≤ budget + one width-1 pass."""
        if NO_JIT and budget > 10_000:
            pytest.skip("too slow without the JIT")
        problem = generate(
            3,
            nodes=16,
            candidates=256,
            load=2.0,
            credit=credit,  # type: ignore[arg-type]
            interchangeable=False,
        )
        d = densify(problem)
        sol = solve(d, budget=budget)
        check_plan(d, sol.choice, sol.objective)
        assert sol.states <= budget + 256 * 17
        assert sol.objective >= objective_of(d, bfd(d))
        assert sol.objective >= objective_of(d, short_first(d))
        if not sol.exact:
            assert sol.reason

    def test_capacity_beyond_int32_quanta(self) -> None:
        """Quantum 1 with a node past 2**31 tokens (valid input) still gives a feasible,
        optimal plan."""
        cands = tuple(
            Candidate(f"s{i}", weight=w, tokens=w // 1000, ready=i % 2)
            for i, w in enumerate([1_600_000_000, 1_500_000_000, 1_400_000_000, 1_100_000_000])
        )
        d = densify(Problem(quantum=1, nodes=nodes_(3_000_000_000), candidates=cands))
        sol = solve(d, budget=GENEROUS)
        check_plan(d, sol.choice, sol.objective)
        assert sol.objective == brute_force(d)[1]


class TestSizeLimits:
    """Values past MAX_VALUE are refused up front, so int64 sums inside the planner never wrap."""

    @pytest.mark.parametrize(
        ("problem", "field"),
        [
            (Problem(MAX_VALUE + 1, (), ()), "quantum"),
            (Problem(512, (Node("n0", MAX_VALUE + 1),), ()), "nodes[0].free"),
            (
                Problem(512, (Node("n0", 1024),), (Candidate("s0", 512, MAX_VALUE + 1),)),
                "candidates[0].tokens",
            ),
            (
                Problem(512, (Node("n0", 1024),), (Candidate("s0", 512, 1, credit={"n0": 2**53}),)),
                'candidates[0].credit["n0"]',
            ),
        ],
    )
    def test_too_large_is_a_problem_error(self, problem: Problem, field: str) -> None:
        """densify names the field that is too large."""
        with pytest.raises(ProblemError) as err:
            densify(problem)
        assert err.value.field_path == field

    def test_largest_values_plan_exactly(self) -> None:
        """Credits and tokens at MAX_VALUE on 16 nodes x 64 sessions give exact Python ints."""
        nodes = tuple(Node(f"n{b}", 512 * 40) for b in range(16))
        cands = tuple(
            Candidate(
                f"s{i}",
                512 * (1 + i % 5),
                MAX_VALUE,
                1,
                credit={f"n{b}": MAX_VALUE - i - b for b in range(16)},
            )
            for i in range(64)
        )
        d = densify(Problem(512, nodes, cands))
        sol = solve(d, budget=20_000)
        assert is_feasible(d, sol.choice)
        assert sol.objective.credit >= 0
        assert sol.objective == objective_of(d, sol.choice)
        assert sol.objective.tokens == MAX_VALUE * sol.objective.admitted


class TestManyNodes:
    def test_node_positions_past_int16(self) -> None:
        """A placement on a node whose position in the search order passes 32767 is replayed
        on that node (a move index kept in int16 would wrap and drop it)."""
        fillers = tuple(Node(f"d{i}", 1000 + i) for i in range(32768))
        only = frozenset({"T"})
        cands = tuple(
            Candidate(cid, weight, tokens, 0, eligible=only)
            for cid, weight, tokens in (("big", 6, 10), ("a", 5, 6), ("b", 5, 6), ("tiny", 1, 0))
        )
        d = densify(Problem(1, (*fillers, Node("T", 10)), cands))
        sol = solve(d, budget=1_000_000)
        assert is_feasible(d, sol.choice)
        assert sol.exact
        assert sol.objective.tokens == 12  # a + b
