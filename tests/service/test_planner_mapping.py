"""TickSnapshot ↔ ValuationSnapshot mapping (services.planner.mapping)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.planner.mapping import from_wire, to_wire
from shared.contracts import codec
from shared.contracts.errors import DecodeError
from shared.contracts.valuation import ValuationSnapshot
from shared.core.predictor import History
from shared.core.session import Session, ToolCall
from shared.core.tick import TickSnapshot, value_snapshot
from shared.core.valuation import NodeView


def _snapshot() -> tuple[TickSnapshot, list[NodeView]]:
    views = [
        NodeView("n1", 100_000, 0.9, reserved=6_000, models=frozenset({"m"})),
        NodeView("n2", 50_000, 0.9, reserved=0, healthy=False),
    ]
    sessions = [
        Session("a", version=3, activity="waiting", tokens=4_000, model="m", turns=2),
        Session("b", version=1, activity="waiting", tokens=1_000, model="m"),
        Session(
            "c",
            version=7,
            activity="tool",
            node="n1",
            weight=6_000,
            tokens=5_000,
            tool=ToolCall("call1", "bash", started_at=95.0),
        ),
    ]
    residency = {"a": {"n1": (3_000, 99.0)}, "c": {"n1": (5_000, 99.0)}}
    snap = value_snapshot(sessions, views, residency, History(), 100.0, tick=42)
    return snap, views


def _without_shell_fields(s: TickSnapshot) -> TickSnapshot:
    """What the wire carries: no probe marks, no readiness rule."""
    return replace(s, probe_marks={}, candidates=tuple(replace(c, rule="") for c in s.candidates))


class TestMapping:
    def test_round_trip_through_json(self) -> None:
        """to_wire → JSON → from_wire gives the snapshot back (less the shell-only fields)."""
        snap, views = _snapshot()
        assert len(snap.candidates) == 2 and len(snap.interrupts) == 1
        data = codec.encode(to_wire(snap, views))
        back = from_wire(codec.decode(data, ValuationSnapshot))
        assert back == _without_shell_fields(snap)

    def test_nodes_carry_capacity_and_health(self) -> None:
        """Wire nodes carry the capacity and health of the views; unhealthy ones have no room."""
        snap, views = _snapshot()
        wire = to_wire(snap, views)
        assert [(n.id, n.capacity, n.healthy, n.free) for n in wire.nodes] == [
            ("n1", 100_000, True, 90_000 - 6_000),
            ("n2", 50_000, False, 0),
        ]

    def test_nodes_carry_eviction_pressure(self) -> None:
        """Each node's KV capacity and running requests (the ``evict`` rule's inputs) survive
        the wire."""
        snap, views = _snapshot()
        views = [replace(views[0], running=3), views[1]]
        snap = replace(snap, running={"n1": 3})
        wire = to_wire(snap, views)
        assert [(n.id, n.running) for n in wire.nodes] == [("n1", 3), ("n2", 0)]
        back = from_wire(codec.decode(codec.encode(wire), ValuationSnapshot))
        assert back.capacity == {"n1": 100_000, "n2": 50_000}
        assert back.running == {"n1": 3}

    def test_signatures_carry_version_and_digest(self) -> None:
        """Each candidate's signature holds its version and eligibility digest."""
        snap, views = _snapshot()
        wire = to_wire(snap, views)
        by_id = {c.id: c for c in wire.candidates}
        assert by_id["a"].signature.version == 3
        assert by_id["a"].signature.eligibility_digest == snap.candidates[0].digest
        assert wire.interrupt_candidates[0].signature.version == 7

    def test_eligible_none_means_every_node(self) -> None:
        """A wire candidate with eligible=None may go to every listed node."""
        snap, views = _snapshot()
        wire = to_wire(snap, views)
        wire = msgspec_replace_first_candidate(wire, eligible=None)
        assert from_wire(wire).candidates[0].eligible == frozenset({"n1", "n2"})

    def test_unknown_phase_is_a_decode_error(self) -> None:
        """A phase the core does not know is rejected with a DecodeError naming the field."""
        snap, views = _snapshot()
        wire = msgspec_replace_first_candidate(to_wire(snap, views), phase="sleeping")
        with pytest.raises(DecodeError, match=r"candidates\[0\]\.phase"):
            from_wire(wire)


def msgspec_replace_first_candidate(
    wire: ValuationSnapshot, **changes: object
) -> ValuationSnapshot:
    import msgspec

    first = msgspec.structs.replace(wire.candidates[0], **changes)
    return msgspec.structs.replace(wire, candidates=[first, *wire.candidates[1:]])
