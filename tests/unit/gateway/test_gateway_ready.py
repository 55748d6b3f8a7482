"""``/readyz``'s rule (:func:`services.gateway.ready.check`): ready only with a current planner
readiness record and a healthy node, and a reason naming what is missing otherwise."""

from __future__ import annotations

import pytest

from services.gateway.ready import check
from shared.infra.store_types import NodeRecord, PlannerReady

NOW = 1000.0


def record(beat_at: float = NOW - 1.0) -> PlannerReady:
    return PlannerReady("host-planner", 3, 8200.0, NOW - 20.0, beat_at, 5.0, rounds=7, tick=41)


def node(node_id: str, healthy: bool = True, capacity: int = 4096) -> NodeRecord:
    return NodeRecord(node_id, f"http://{node_id}", capacity, 0.9, healthy=healthy)


class TestCheck:
    @pytest.mark.parametrize(
        ("planner", "nodes", "reason"),
        [
            (None, [node("n1")], "no planner is ready"),
            (record(beat_at=NOW - 5.5), [node("n1")], "last beat is 5.5 s old"),
            (record(), [], "no healthy node"),
            (record(), [node("n1", healthy=False), node("n2", capacity=0)], "no healthy node"),
            (record(), [node("n1", healthy=False), node("n2")], None),
            (record(beat_at=NOW - 5.0), [node("n1")], None),
        ],
        ids=["no-planner", "stale-beat", "no-node", "no-usable-node", "one-good-node", "at-ttl"],
    )
    def test_ready_only_with_a_current_planner_and_a_healthy_node(
        self, planner: PlannerReady | None, nodes: list[NodeRecord], reason: str | None
    ) -> None:
        why, _ = check(planner, nodes, NOW)
        if reason is None:
            assert why is None
        else:
            assert why is not None and reason in why

    def test_details_show_the_planner_and_the_nodes(self) -> None:
        _, detail = check(record(), [node("n2"), node("n1")], NOW)
        assert detail["nodes_healthy"] == ["n1", "n2"]
        assert detail["planner"] == {
            "instance": "host-planner",
            "epoch": 3,
            "warm_ms": 8200.0,
            "ready_for_s": 20.0,
            "beat_age_s": 1.0,
            "rounds": 7,
        }


class TestRecord:
    def test_the_hash_round_trips(self) -> None:
        r = record()
        assert PlannerReady.from_hash(r.as_hash()) == r

    @pytest.mark.parametrize("drop", ["instance", "epoch", "beat_at", "ttl_s"])
    def test_a_partial_hash_is_no_record(self, drop: str) -> None:
        raw = record().as_hash()
        del raw[drop]
        assert PlannerReady.from_hash(raw) is None

    def test_fresh_until_ttl_after_the_beat(self) -> None:
        r = record(beat_at=NOW)
        assert r.fresh(NOW + 5.0) and not r.fresh(NOW + 5.01)
