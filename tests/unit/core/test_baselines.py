"""Baseline placement policies (DESIGN 3.5) on hand-built snapshots, plus feasibility."""

from __future__ import annotations

from collections.abc import Mapping

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from shared.core.policies.base import PlanOptions
from shared.core.policies.baselines import (
    BASELINES,
    CacheAwarePolicy,
    KvAwarePolicy,
    RoundRobinPolicy,
    ThunderAgentPolicy,
    cache_aware,
    kv_aware,
    kv_cost,
    round_robin,
    round_robin_pointer,
    thunderagent,
)
from shared.core.policies.thunderagent import healthy_nodes, thunderagent_order
from shared.core.problem import (
    Candidate,
    Node,
    Phase,
    Problem,
    densify,
    is_feasible,
    objective_of,
)

OPTS = PlanOptions()


def node(node_id: str, free: int, load: int = 0) -> Node:
    return Node(id=node_id, free=free, load=load)


def cand(
    cand_id: str,
    weight: int,
    tokens: int = 0,
    *,
    credit: Mapping[str, int] | None = None,
    eligible: set[str] | None = None,
    phase: Phase | None = None,
    ready: int = 0,
) -> Candidate:
    return Candidate(
        id=cand_id,
        weight=weight,
        tokens=tokens,
        ready=ready,
        credit=dict(credit or {}),
        eligible=None if eligible is None else frozenset(eligible),
        phase=phase,
    )


def problem(nodes: list[Node], cands: list[Candidate], quantum: int = 1) -> Problem:
    return Problem(quantum=quantum, nodes=tuple(nodes), candidates=tuple(cands))


def placed(result_assignments: object) -> dict[str, str]:
    assert isinstance(result_assignments, tuple)
    return {a.session: a.node for a in result_assignments}


class TestRoundRobin:
    """vLLM round-robin: FCFS, rotating pointer, fall through to the next node that fits."""

    def test_rotates_through_nodes_in_arrival_order(self) -> None:
        """Each candidate goes to the next node in rotation."""
        p = problem([node(f"n{j}", 10) for j in range(3)], [cand(f"c{i}", 1) for i in range(4)])
        choice = round_robin(densify(p), p)
        assert choice == [0, 1, 2, 0]
        assert round_robin_pointer(choice, 0, 3) == 1

    def test_skips_ineligible_and_full_nodes_in_rotation_order(self) -> None:
        """A node that is ineligible or full is passed over for the following one."""
        p = problem(
            [node("n0", 10), node("n1", 2), node("n2", 10)],
            [cand("c0", 1), cand("c1", 3), cand("c2", 1, eligible={"n0", "n2"}), cand("c3", 1)],
        )
        # c0→n0; c1 too big for n1 → n2; pointer at n0: c2→n0; c3→n1.
        assert round_robin(densify(p), p) == [0, 2, 0, 1]

    def test_skips_a_candidate_only_when_no_node_fits(self) -> None:
        """A candidate no node can take is left out and the pointer does not move."""
        p = problem([node("n0", 10), node("n1", 10)], [cand("big", 20), cand("c1", 1)])
        choice = round_robin(densify(p), p, start=1)
        assert choice == [-1, 1]
        assert round_robin_pointer([-1], 1, 2) == 1

    def test_offset_sets_the_first_node(self) -> None:
        """The constructor offset is where the rotation starts."""
        p = problem([node(f"n{j}", 10) for j in range(3)], [cand("c0", 1)])
        res = RoundRobinPolicy(offset=2).plan(p, OPTS)
        assert placed(res.assignments) == {"c0": "n2"}

    def test_pointer_persists_across_ticks(self) -> None:
        """The next tick continues the rotation where the previous one stopped."""
        nodes = [node(f"n{j}", 10) for j in range(3)]
        policy = RoundRobinPolicy()
        first = policy.plan(problem(nodes, [cand("a", 1), cand("b", 1)]), OPTS)
        second = policy.plan(problem(nodes, [cand("c", 1), cand("d", 1)]), OPTS)
        assert placed(first.assignments) == {"a": "n0", "b": "n1"}
        assert placed(second.assignments) == {"c": "n2", "d": "n0"}
        assert policy.pointer == 1
        assert second.exact is False and second.method == "rr"


class TestCacheAware:
    """SGLang cache-aware: most credit above the match threshold, else least load."""

    def test_routes_to_most_credit_above_threshold(self) -> None:
        """A match rate above 0.5 wins over a lighter node."""
        p = problem(
            [node("n0", 1000), node("n1", 1000, load=5000)],
            [cand("c", 10, 100, credit={"n1": 60})],
        )
        assert cache_aware(densify(p), p) == [1]

    def test_routes_to_least_load_at_or_below_threshold(self) -> None:
        """A match rate of exactly 0.5 is not above the threshold: least load wins."""
        p = problem(
            [node("n0", 1000), node("n1", 1000, load=5000)],
            [cand("c", 10, 100, credit={"n1": 50})],
        )
        assert cache_aware(densify(p), p) == [0]
        assert cache_aware(densify(p), p, cache_threshold=0.4) == [1]

    def test_equal_credit_ties_go_to_least_load(self) -> None:
        """Among nodes with the most credit, the less loaded one wins."""
        p = problem(
            [node("n0", 1000, load=500), node("n1", 1000, load=100)],
            [cand("c", 10, 100, credit={"n0": 80, "n1": 80})],
        )
        assert cache_aware(densify(p), p) == [1]

    def test_load_counts_tokens_placed_this_tick(self) -> None:
        """With no credit, candidates spread by node load plus this tick's tokens."""
        p = problem(
            [node("n0", 1000), node("n1", 1000, load=50)],
            [cand("c0", 10, 100), cand("c1", 10, 100), cand("c2", 10, 10)],
        )
        # c0→n0 (0 < 50); n0 now 100 > 50: c1→n1 (150); c2→n0 (100 < 150).
        assert cache_aware(densify(p), p) == [0, 1, 0]

    def test_falls_through_to_best_fitting_node(self) -> None:
        """When the best-credit node is full, the rule is re-applied to the nodes that fit."""
        nodes = [node("n0", 5), node("n1", 100, load=900), node("n2", 100)]
        above = problem(nodes, [cand("c", 10, 100, credit={"n0": 90, "n1": 70})])
        below = problem(nodes, [cand("c", 10, 100, credit={"n0": 90, "n1": 30})])
        assert cache_aware(densify(above), above) == [1]
        assert cache_aware(densify(below), below) == [2]

    def test_imbalance_switch_routes_to_least_load(self) -> None:
        """With the imbalance switch on, an imbalanced system ignores cache."""
        p = problem(
            [node("n0", 1000), node("n1", 1000, load=1000)],
            [cand("c", 10, 100, credit={"n1": 90})],
        )
        d = densify(p)
        assert cache_aware(d, p) == [1]
        assert cache_aware(d, p, balance_abs_tokens=100) == [0]
        assert cache_aware(d, p, balance_abs_tokens=5000) == [1]

    def test_rejects_threshold_outside_unit_interval(self) -> None:
        """A match-rate threshold must lie in [0, 1]."""
        with pytest.raises(ValueError, match="cache_threshold"):
            CacheAwarePolicy(cache_threshold=1.5)


class TestKvAware:
    """Dynamo KV router: argmin of weight × prefill blocks + decode blocks."""

    def test_cost_rounds_blocks_up(self) -> None:
        """Partial blocks count as whole blocks."""
        assert kv_cost(17, 0, 1) == 3.0
        assert kv_cost(100, 120, 0) == 0.0

    def test_dynamo_documented_example(self) -> None:
        """Costs 18, 10, 11 (Dynamo's router design example) pick the second worker."""
        nodes = [node("w1", 10_000, load=160), node("w2", 10_000, load=80)]
        nodes.append(node("w3", 10_000, load=144))
        credit = {"w1": 32, "w2": 80, "w3": 128}  # 2, 5, 8 cached blocks of a 10-block prompt
        p = problem(nodes, [cand("c", 10, 160, credit=credit)])
        d = densify(p)
        costs = [kv_cost(160, int(d.k[0, b]), int(d.load[b])) for b in range(3)]
        assert costs == [18.0, 10.0, 11.0]
        assert kv_aware(d, p) == [1]
        # Weight 2 favours cache: 26, 15, 13.
        assert kv_aware(d, p, overlap_score_weight=2.0) == [2]

    def test_ties_go_to_lower_index_and_load_updates_fcfs(self) -> None:
        """Equal costs pick the lower index; a placed candidate's tokens load its node."""
        p = problem([node("n0", 100), node("n1", 100)], [cand("a", 1, 160), cand("b", 1, 160)])
        assert kv_aware(densify(p), p) == [0, 1]

    def test_falls_through_when_cheapest_is_full(self) -> None:
        """The cheapest node without room is passed over for the next cheapest."""
        nodes = [node("n0", 5), node("n1", 100, load=320), node("n2", 100, load=160)]
        p = problem(nodes, [cand("c", 10, 160, credit={"n0": 160})])
        assert kv_aware(densify(p), p) == [2]

    def test_rejects_bad_block_size(self) -> None:
        """A block size must be at least one token."""
        with pytest.raises(ValueError, match="block_size"):
            KvAwarePolicy(block_size=0)


class TestThunderAgent:
    """ThunderAgent resume: class order, fewest tokens, BFD largest first on most free."""

    def test_class_order_then_fewest_tokens(self) -> None:
        """Reasoning before new before acting, fewest tokens first, while the total fits."""
        p = problem(
            [node("n0", 9)],
            [
                cand("a", 3, 30, phase="acting"),
                cand("n", 3, 30, phase="new"),
                cand("r1", 3, 50, phase="reasoning"),
                cand("r2", 3, 40, ready=1),  # phase derived from readiness
            ],
        )
        d = densify(p)
        assert thunderagent_order(d, p) == [3, 2, 1, 0]
        assert thunderagent(d, p) == [-1, 0, 0, 0]

    def test_selection_passes_over_what_does_not_fit(self) -> None:
        """A candidate over the remaining total is passed over; smaller later ones still go."""
        p = problem(
            [node("n0", 10)],
            [
                cand("r", 8, 10, phase="reasoning"),
                cand("r2", 5, 20, phase="reasoning"),
                cand("n", 2, 5, phase="new"),
            ],
        )
        assert thunderagent(densify(p), p) == [0, -1, 0]

    def test_places_largest_first_on_most_free_blind_to_cache(self) -> None:
        """Largest goes first, each to the node with the most room left, ignoring credit."""
        p = problem(
            [node("A", 10), node("B", 6)],
            [
                cand("z", 3, 3, phase="reasoning", credit={"B": 3}),
                cand("y", 4, 4, phase="reasoning"),
                cand("x", 5, 5, phase="reasoning"),
            ],
        )
        # x(5)→A (10); y(4)→B (6 > 5); z(3)→A (5 > 2).
        assert thunderagent(densify(p), p) == [0, 1, 0]

    def test_selected_but_fits_nowhere_stays_paused(self) -> None:
        """A selected program no node can hold is skipped and reported as unplaced."""
        p = problem(
            [node("A", 5), node("B", 5)],
            [cand("big", 6, 1, phase="reasoning"), cand("small", 4, 2, phase="reasoning")],
        )
        res = ThunderAgentPolicy().plan(p, OPTS)
        assert placed(res.assignments) == {"small": "A"}
        assert res.diagnostics.unplaced == ("big",)
        assert res.exact is False and res.method == "thunderagent"

    def test_total_capacity_counts_only_nodes_someone_may_use(self) -> None:
        """A node no candidate may use adds nothing to the total remaining capacity."""
        p = problem(
            [node("A", 5), node("C", 100)],
            [
                cand("r1", 3, 1, phase="reasoning", eligible={"A"}),
                cand("r2", 3, 2, phase="reasoning", eligible={"A"}),
                cand("n", 2, 1, phase="new", eligible={"A"}),
            ],
        )
        assert healthy_nodes(p) == [0]
        # Total 5: r1 (3) selected, r2 passed over (6 > 5), n (5) selected.
        assert thunderagent(densify(p), p) == [0, -1, 0]


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    m = draw(st.integers(1, 4))
    ids = [f"n{j}" for j in range(m)]
    nodes = [node(nid, draw(st.integers(-100, 3000)), draw(st.integers(0, 5000))) for nid in ids]
    phases: list[Phase | None] = [None, "reasoning", "new", "acting"]
    cands = []
    for i in range(draw(st.integers(0, 8))):
        tokens = draw(st.integers(0, 3000))
        credit = {nid: draw(st.integers(0, tokens)) for nid in draw(st.lists(st.sampled_from(ids)))}
        eligible = draw(st.none() | st.sets(st.sampled_from(ids)))
        cands.append(
            cand(
                f"c{i}",
                draw(st.integers(1, 2000)),
                tokens,
                credit=credit,
                eligible=eligible,
                phase=draw(st.sampled_from(phases)),
                ready=draw(st.integers(0, 1)),
            )
        )
    return problem(nodes, cands, quantum=draw(st.sampled_from([1, 256, 512])))


class TestFeasibility:
    """Every baseline returns a feasible plan on any small problem."""

    @settings(max_examples=200, deadline=None)
    @given(p=problems(), start=st.integers(0, 7))
    def test_every_baseline_is_feasible(self, p: Problem, start: int) -> None:
        """Choices use eligible pairs only and never exceed a node's capacity."""
        d = densify(p)
        for choice in (
            round_robin(d, p, start=start),
            cache_aware(d, p),
            cache_aware(d, p, cache_threshold=0.0, balance_abs_tokens=0),
            kv_aware(d, p),
            kv_aware(d, p, overlap_score_weight=0.0, block_size=1),
            thunderagent(d, p),
        ):
            assert len(choice) == d.n
            assert is_feasible(d, choice)
        for name, make in BASELINES.items():
            res = make().plan(p, OPTS)
            assert res.exact is False and res.method == name
            col = {nid: j for j, nid in enumerate(d.node_ids)}
            row = {cid: i for i, cid in enumerate(d.cand_ids)}
            choice = [-1] * d.n
            for a in res.assignments:
                choice[row[a.session]] = col[a.node]
            assert is_feasible(d, choice)
            assert res.objective == objective_of(d, choice)
