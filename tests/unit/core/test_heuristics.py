"""The planner's cheap heuristics: always feasible, with the documented ordering rules."""

from __future__ import annotations

import os

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from shared.core.brute import brute_force
from shared.core.generate import generate
from shared.core.heuristics import (
    PORTFOLIO,
    Choice,
    balance,
    bfd,
    k_first,
    ready_tokens_fill,
    short_first,
    value_density,
)
from shared.core.problem import (
    Candidate,
    Dense,
    Node,
    Problem,
    densify,
    is_feasible,
    objective_of,
)

NO_JIT = os.environ.get("NUMBA_DISABLE_JIT") == "1"
EXAMPLES = 60 if NO_JIT else 150
Q = 512

HEURISTICS = [*PORTFOLIO, ("bfd-no-affinity", lambda d: bfd(d, affinity=False))]


@st.composite
def problems(draw: st.DrawFn, *, one_credit_node: bool = False) -> Problem:
    """A small snapshot (n ≤ 7, m ≤ 3); with ``one_credit_node`` each session's credit sits on
    at most one node."""
    m = draw(st.integers(1, 3))
    n = draw(st.integers(0, 7))
    ids = [f"n{b}" for b in range(m)]
    nodes = tuple(Node(id=x, free=draw(st.integers(0, 12)) * Q) for x in ids)
    cands = []
    for i in range(n):
        places = draw(
            st.lists(st.sampled_from(ids), unique=True, max_size=1 if one_credit_node else m)
        )
        cands.append(
            Candidate(
                id=f"s{i}",
                weight=draw(st.integers(0, 8 * Q)),
                tokens=draw(st.integers(0, 30)),
                ready=draw(st.integers(0, 1)),
                credit={x: draw(st.integers(0, 9)) for x in places},
                eligible=draw(st.none() | st.frozensets(st.sampled_from(ids))),
            )
        )
    return Problem(quantum=Q, nodes=nodes, candidates=tuple(cands))


def dense(nodes: list[int], cands: list[dict[str, object]]) -> Dense:
    """Nodes by free quanta, candidates by keyword (weight in quanta)."""
    return densify(
        Problem(
            quantum=Q,
            nodes=tuple(Node(id=f"n{b}", free=f * Q) for b, f in enumerate(nodes)),
            candidates=tuple(
                Candidate(
                    id=f"s{i}",
                    weight=int(c["w"]) * Q,  # type: ignore[call-overload]
                    tokens=int(c.get("t", 0)),  # type: ignore[call-overload]
                    ready=int(c.get("r", 0)),  # type: ignore[call-overload]
                    credit=c.get("k", {}),  # type: ignore[arg-type]
                )
                for i, c in enumerate(cands)
            ),
        )
    )


class TestFeasibility:
    @pytest.mark.parametrize(("name", "fn"), HEURISTICS, ids=[h[0] for h in HEURISTICS])
    @given(problem=problems())
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_small_random_snapshots(self, name: str, fn: object, problem: Problem) -> None:
        """Every heuristic returns a full-length, feasible choice vector."""
        d = densify(problem)
        choice: Choice = fn(d)  # type: ignore[operator]
        assert len(choice) == d.n
        assert is_feasible(d, choice)

    @pytest.mark.parametrize(("name", "fn"), HEURISTICS, ids=[h[0] for h in HEURISTICS])
    @pytest.mark.parametrize("load", [0.5, 2.0, 5.0])
    def test_generated_snapshots(self, name: str, fn: object, load: float) -> None:
        """Feasible on generated 8-node × 64-session snapshots, several credit placements."""
        d = densify(
            generate(11, nodes=8, candidates=64, load=load, credit="several", interchangeable=False)
        )
        assert is_feasible(d, fn(d))  # type: ignore[operator]


class TestBfd:
    def test_largest_first(self) -> None:
        """Largest weight first: 6 then 4 fill a 10-quanta node; 5 is left out."""
        d = dense([10], [{"w": 4}, {"w": 6}, {"w": 5}])
        assert bfd(d) == [0, 0, -1]

    def test_equal_weight_higher_value_first(self) -> None:
        """Among equal weights the higher (k, r, t) goes first, then input order."""
        assert bfd(dense([4], [{"w": 4, "t": 1}, {"w": 4, "t": 9}])) == [-1, 0]
        assert bfd(dense([4], [{"w": 4, "r": 1}, {"w": 4, "t": 9}])) == [0, -1]
        assert bfd(dense([4], [{"w": 4, "t": 3}, {"w": 4, "t": 3}])) == [0, -1]

    def test_affinity_then_tightest_fit(self) -> None:
        """A credit holder goes to its credit node; without affinity, to the tightest fit."""
        d = dense([8, 4], [{"w": 4, "k": {"n0": 5}}])
        assert bfd(d) == [0]
        assert bfd(d, affinity=False) == [1]

    def test_tightest_fit_then_lowest_index(self) -> None:
        """Without credit the node left with least room wins; ties go to the lowest index."""
        assert bfd(dense([8, 5, 6], [{"w": 4}])) == [1]
        assert bfd(dense([6, 6], [{"w": 4}])) == [0]


class TestShortFirst:
    def test_smallest_first(self) -> None:
        """Smallest weight first: 4 then 5 fill a 10-quanta node; 6 is left out."""
        assert short_first(dense([10], [{"w": 4}, {"w": 6}, {"w": 5}])) == [0, -1, 0]

    def test_equal_weight_higher_value_first(self) -> None:
        """Among equal weights the higher (k, r, t) goes first."""
        assert short_first(dense([2], [{"w": 2, "t": 1}, {"w": 2, "r": 1}])) == [-1, 0]

    def test_affinity_node_when_it_fits_else_tightest(self) -> None:
        """A session goes to its most-credit node if it fits there, else the tightest fit."""
        d = dense([3, 9, 5], [{"w": 2, "k": {"n1": 4, "n2": 1}}])
        assert short_first(d) == [1]
        d = dense([3, 1, 5], [{"w": 2, "k": {"n1": 4, "n2": 1}}])
        assert short_first(d) == [2]

    def test_fragments_what_bfd_packs(self) -> None:
        """The two greedies differ: short-first fills with small sessions, BFD with large."""
        d = dense([6], [{"w": 1}, {"w": 1}, {"w": 1}, {"w": 5}])
        assert short_first(d) == [0, 0, 0, -1]
        assert bfd(d) == [0, -1, -1, 0]


class TestOtherHeuristics:
    def test_value_density_prefers_value_per_quantum(self) -> None:
        """Value density ranks by (k, r, t) per quantum: 3 tokens on 1 quantum beat 5 on 2."""
        d = dense([2], [{"w": 2, "t": 5}, {"w": 1, "t": 3}, {"w": 1, "t": 2}])
        assert value_density(d) == [-1, 0, 0]

    def test_ready_tokens_fill_prefers_credit_then_ready(self) -> None:
        """Credit holders first, then ready sessions, then more tokens."""
        d = dense([2, 1], [{"w": 1, "t": 9}, {"w": 1, "r": 1}, {"w": 2, "k": {"n0": 1}}])
        assert ready_tokens_fill(d) == [-1, 1, 0]


class TestKFirst:
    @given(problems(one_credit_node=True))
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_optimal_credit_when_credit_sits_on_one_node(self, problem: Problem) -> None:
        """With each session's credit on one node, k-first's Σk is the optimum's Σk (brute
        force maximises the full tuple, whose first component is Σk)."""
        d = densify(problem)
        choice = k_first(d)
        assert is_feasible(d, choice)
        got = sum(int(d.k[i, b]) for i, b in enumerate(choice) if b >= 0)
        assert got == brute_force(d)[1].credit

    def test_rejected_credit_holder_moves_to_its_next_credit_node(self) -> None:
        """A session crowded out of its best node proposes to its next node with credit
        (deferred acceptance), and may displace a weaker holder there, who moves on in turn."""
        d = dense(
            [4, 4, 4],
            [
                {"w": 4, "k": {"n0": 900}},  # keeps n0
                {"w": 4, "k": {"n0": 800, "n1": 700}},  # rejected at n0, takes n1
                {"w": 4, "k": {"n1": 500, "n2": 400}},  # displaced from n1, takes n2
            ],
        )
        assert k_first(d) == [0, 1, 2]
        assert sum(int(d.k[i, b]) for i, b in enumerate(k_first(d))) == 2000


class TestBalance:
    """Balancing spreads a plan over equally valued nodes and never changes its value."""

    def test_spreads_sessions_without_credit(self) -> None:
        """Four equal sessions piled on node 0 end up two per node."""
        d = dense([8, 8], [{"w": 2}, {"w": 2}, {"w": 2}, {"w": 2}])
        out = balance(d, [0, 0, 0, 0])
        assert sorted(out) == [0, 0, 1, 1]

    def test_keeps_credit_affinity(self) -> None:
        """A session with credit on its node is not moved to a node without it."""
        d = dense([8, 8], [{"w": 4, "k": {"n0": 512}}, {"w": 2}])
        assert balance(d, [0, 0]) == [0, 1]

    def test_leaves_unplaced_alone(self) -> None:
        """Sessions the plan did not admit stay unadmitted."""
        d = dense([4, 4], [{"w": 2}, {"w": 2}])
        assert balance(d, [0, -1]) == [0, -1]

    @given(problems())
    @settings(max_examples=EXAMPLES, deadline=None)
    def test_same_objective_and_feasible(self, problem: Problem) -> None:
        """On any plan (here the DP's), balancing keeps the objective and feasibility."""
        d = densify(problem)
        choice = k_first(d)
        out = balance(d, choice)
        assert objective_of(d, out) == objective_of(d, choice)
        assert is_feasible(d, out)
        assert [b < 0 for b in out] == [b < 0 for b in choice]
