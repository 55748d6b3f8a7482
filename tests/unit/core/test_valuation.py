"""Valuation: weights, free capacity, eligibility and the per-tick Problem."""

from __future__ import annotations

import pytest

from shared.core.predictor import History, ToolCallView, record
from shared.core.problem import Candidate, Node, ProblemError, densify
from shared.core.valuation import (
    NodeView,
    SessionView,
    ValuationParams,
    build_problem,
    eligible,
    free_capacity,
    ineligibility,
    session_weight,
)


class TestSessionWeight:
    """w = max(tokens - shared, 0) + reserve, so never below the reserve."""

    @pytest.mark.parametrize(
        ("tokens", "shared", "reserve", "expected"),
        [
            (1000, 0, 512, 1512),
            (1000, 400, 512, 1112),
            (1000, 1000, 512, 512),
            (1000, 1500, 512, 512),  # over-reported sharing floors at the reserve
            (0, 0, 512, 512),
            (1000, 0, 0, 1000),
        ],
    )
    def test_table(self, tokens: int, shared: int, reserve: int, expected: int) -> None:
        """Each row gives the expected weight."""
        assert session_weight(tokens, shared, reserve) == expected

    def test_default_reserve(self) -> None:
        """The default reserve is 512 tokens."""
        assert session_weight(100, 0) == 612

    def test_negative_rejected(self) -> None:
        """Negative token counts are errors."""
        with pytest.raises(ValueError, match="tokens"):
            session_weight(-1, 0)


class TestFreeCapacity:
    """C = floor(capacity × target) − Σ reserved, clamped at 0."""

    @pytest.mark.parametrize(
        ("capacity", "target", "reserved", "expected"),
        [
            (10_000, 1.0, [], 10_000),
            (10_000, 0.9, [1000, 500], 7500),
            (10_000, 0.7, [], 7000),  # 0.7 read as 7/10: no token lost to binary rounding
            (10_001, 0.5, [], 5000),  # floor
            (10_000, 0.9, [9500], 0),  # over-committed clamps at 0
            (0, 0.9, [], 0),
            (10_000, 0.0, [], 0),
        ],
    )
    def test_table(self, capacity: int, target: float, reserved: list[int], expected: int) -> None:
        """Each row gives the expected free capacity."""
        assert free_capacity(capacity, target, reserved) == expected

    @pytest.mark.parametrize("target", [-0.1, 1.1, float("nan")])
    def test_bad_target_rejected(self, target: float) -> None:
        """A target utilisation outside [0, 1] is an error."""
        with pytest.raises(ValueError, match="target_utilisation"):
            free_capacity(1000, target, [])


class TestEligibility:
    """A node is eligible when healthy, serving the model and with room for the weight."""

    @pytest.mark.parametrize(
        ("healthy", "models", "model", "weight", "free", "why"),
        [
            (True, None, "m", 100, 100, None),  # exact fit
            (True, frozenset({"m"}), "m", 100, 200, None),
            (True, frozenset({"m"}), None, 100, 200, None),  # session accepts any node
            (False, None, "m", 100, 200, "unhealthy"),
            (True, frozenset({"x"}), "m", 100, 200, "model"),
            (True, frozenset(), "m", 100, 200, "model"),  # empty set serves nothing
            (True, None, "m", 101, 100, "too-large"),
            (False, frozenset({"x"}), "m", 999, 0, "unhealthy"),  # health reported first
        ],
    )
    def test_table(
        self,
        healthy: bool,
        models: frozenset[str] | None,
        model: str | None,
        weight: int,
        free: int,
        why: str | None,
    ) -> None:
        """Each row is (in)eligible for the expected reason."""
        assert ineligibility(healthy, models, model, weight, free) == why
        assert eligible(healthy, models, model, weight, free) is (why is None)


class TestBuildProblem:
    """The problem carries decayed credits on eligible nodes, readiness and diagnostics."""

    NODES = (
        NodeView("n1", capacity_tokens=10_000, target_utilisation=0.9, reserved=4000),
        NodeView("n2", capacity_tokens=10_000, reserved=0, models=frozenset({"other"})),
        NodeView("n3", capacity_tokens=4000, healthy=False),
    )
    PARAMS = ValuationParams(credit_unit=1, quantum=512)

    def test_nodes_and_candidates(self) -> None:
        """Free capacity, credits, readiness and eligibility come out as documented."""
        history = record(record(History(), "bash", 4.0), "bash", 4.0)
        sessions = [
            SessionView(
                "s1",
                tokens=3000,
                shared_tokens=1000,
                model="m",
                residency={"n1": (2000, 90.0), "n2": (800, 100.0)},
                tool=ToolCallView("bash", started_at=96.5),
            ),
            SessionView("s2", tokens=100, model="other"),
        ]
        val = build_problem(sessions, self.NODES, history, 100.0, self.PARAMS)
        assert val.problem.quantum == 512
        assert val.problem.nodes == (
            Node("n1", free=5000, load=4000),
            Node("n2", free=10_000, load=0),
            Node("n3", free=4000, load=0),
        )
        s1, s2 = val.problem.candidates
        assert s1 == Candidate(
            id="s1", weight=2512, tokens=3000, ready=1,
            credit={"n1": 1000}, eligible=frozenset({"n1"}),
        )  # fmt: skip
        assert s2 == Candidate(
            id="s2", weight=612, tokens=100, ready=1, eligible=frozenset({"n1", "n2"})
        )
        d1, d2 = val.diagnostics
        assert (d1.rule, d1.evidence, d1.predicted_end) == ("horizon", "history:tool", 100.5)
        assert d1.credits == {"n1": 1000, "n2": 800}
        assert d1.ineligible == {"n2": "model", "n3": "unhealthy"}
        assert (d2.rule, d2.evidence) == ("not-in-tool", None)
        assert val.probe_marks == {"s1": None, "s2": None}
        densify(val.problem)  # the planner can lay it out

    def test_probe_mark_round_trip(self) -> None:
        """A spent probe is returned as a mark; fed back, the next tick is not ready."""
        call = ToolCallView("bash", started_at=0.0)
        s = SessionView("s", tokens=10, tool=call)
        first = build_problem([s], self.NODES[:1], History(), 6.0, self.PARAMS)
        assert (first.problem.candidates[0].ready, first.diagnostics[0].rule) == (1, "probe")
        again = SessionView("s", tokens=10, tool=call, probe_mark=first.probe_marks["s"])
        second = build_problem([again], self.NODES[:1], History(), 7.0, self.PARAMS)
        assert (second.problem.candidates[0].ready, second.diagnostics[0].rule) == (
            0,
            "probe-spent",
        )

    def test_too_large_everywhere(self) -> None:
        """A session that fits nowhere has an empty eligible set and no credit."""
        s = SessionView("big", tokens=50_000, residency={"n1": (40_000, 100.0)})
        val = build_problem([s], self.NODES, History(), 100.0, self.PARAMS)
        cand = val.problem.candidates[0]
        assert (cand.eligible, dict(cand.credit)) == (frozenset(), {})
        assert val.diagnostics[0].ineligible == {
            "n1": "too-large", "n2": "too-large", "n3": "unhealthy"
        }  # fmt: skip

    @pytest.mark.parametrize(
        ("sessions", "nodes", "field"),
        [
            ([SessionView("a", 1), SessionView("a", 2)], [NodeView("n", 10)], "candidates[1].id"),
            ([], [NodeView("n", 10), NodeView("n", 20)], "nodes[1].id"),
        ],
    )
    def test_duplicates_rejected(
        self, sessions: list[SessionView], nodes: list[NodeView], field: str
    ) -> None:
        """Duplicate session or node ids name the offending field."""
        with pytest.raises(ProblemError) as err:
            build_problem(sessions, nodes, History(), 0.0)
        assert err.value.field_path == field
