"""The shared prefix counted once per node (paper App. B.1): weights, free room, pressure."""

from __future__ import annotations

import pytest

from shared.core.session import Session, on_request, on_response
from shared.core.tick import context_pressure, live_free, node_pressure
from shared.core.valuation import NodeView, build_nodes, session_weight


def _admitted(sid: str, node: str, tokens: int, shared: int) -> Session:
    return Session(id=sid, activity="tool", node=node, tokens=tokens, shared=shared, turns=1)


class TestWeight:
    """A session's weight leaves out the prefix it shares."""

    @pytest.mark.parametrize(
        ("tokens", "shared", "reserve", "weight"),
        [(20_000, 15_000, 512, 5_512), (20_000, 0, 512, 20_512), (1_000, 15_000, 512, 512)],
    )
    def test_session_weight(self, tokens: int, shared: int, reserve: int, weight: int) -> None:
        """``max(tokens − shared, 0) + reserve``."""
        assert session_weight(tokens, shared, reserve) == weight

    def test_request_sets_and_response_reweighs(self) -> None:
        """``on_request(shared=…)`` records it; an admitted session's reweigh leaves it out."""
        s, _ = on_request(Session(id="a"), "r1", 1.0, tokens_estimate=16_000, shared=15_000)
        assert s.shared == 15_000
        s = Session(**{**{f: getattr(s, f) for f in s.__struct_fields__}, "node": "n0"})
        s = on_response(s, 2.0, total_tokens=16_200, reserve=512)
        assert s.weight == 16_200 - 15_000 + 512
        again, _ = on_request(s, "r2", 3.0)
        assert again.shared == 15_000  # kept when not given


class TestNodeRoom:
    """A node holds its sessions' shared prefix once: off its free room and its pressure."""

    def test_free_and_live_free(self) -> None:
        """``free = usable − reserved − shared``; the apply step's room likewise."""
        nv = NodeView(id="n0", capacity_tokens=100_000, reserved=40_000, shared=15_000)
        assert build_nodes([nv])[0].free == 45_000
        assert live_free([nv]) == {"n0": 45_000}

    def test_context_pressure_counts_prefix_once(self) -> None:
        """Four 30k-token sessions sharing 15k hold 4·15k + 15k = 75k, not 120k."""
        sessions = [_admitted(f"s{i}", "n0", 30_000, 15_000) for i in range(4)]
        nv = NodeView(id="n0", capacity_tokens=70_000)
        assert context_pressure(sessions, [nv], 0, full=True) == {"n0": 5_000}
        unshared = [_admitted(f"s{i}", "n0", 30_000, 0) for i in range(4)]
        assert context_pressure(unshared, [nv], 0, full=True) == {"n0": 50_000}

    def test_node_totals_agree(self) -> None:
        """:func:`node_pressure` from the totals equals the per-session count when every
        session shares the node's prefix."""
        sessions = [_admitted(f"s{i}", "n0", 30_000, 15_000) for i in range(4)]
        nv = NodeView(id="n0", capacity_tokens=70_000, contexts=120_000, held=4, shared=15_000)
        assert node_pressure([nv], 100, full=True) == context_pressure(
            sessions, [nv], 100, full=True
        )
