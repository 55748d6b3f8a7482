"""Valuation terms: weights, free capacity, eligibility and the planner's nodes."""

from __future__ import annotations

import pytest

from shared.core.problem import Node, ProblemError
from shared.core.valuation import (
    NodeView,
    build_nodes,
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


class TestBuildNodes:
    """The planner's nodes: free capacity after the reservations, load = reserved."""

    def test_free_and_load(self) -> None:
        nodes = (
            NodeView("n1", capacity_tokens=10_000, target_utilisation=0.9, reserved=4000),
            NodeView("n2", capacity_tokens=4000, reserved=5000),
        )
        assert build_nodes(nodes) == (Node("n1", 5000, 4000), Node("n2", 0, 5000))

    def test_duplicate_node_ids_name_the_field(self) -> None:
        nodes = (NodeView("n1", capacity_tokens=1), NodeView("n1", capacity_tokens=2))
        with pytest.raises(ProblemError) as err:
            build_nodes(nodes)
        assert err.value.field_path == "nodes[1].id"
