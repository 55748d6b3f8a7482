"""Unit tests of the gateway's placement map, holds, node directory and metrics page."""

from __future__ import annotations

import asyncio

import pytest

from services.gateway.holds import HoldEnded, Holds, HoldTimeout
from services.gateway.metrics import GatewayMetrics
from services.gateway.nodes import NodeDirectory
from services.gateway.placements import PlacementMap
from shared.contracts import NodeStatus, Placement


def pl(kind: str, version: int, node: str | None = "n1", session: str = "s") -> Placement:
    return Placement(
        kind=kind,
        session_id=session,
        version=version,
        tick=0,  # type: ignore[arg-type]
        gateway_id="g",
        node_id=node,
    )


class TestPlacementMap:
    @pytest.mark.parametrize(
        ("steps", "node"),
        [
            ([("admit", 1, "admitted")], "n1"),
            ([("admit", 1, "admitted"), ("interrupt", 2, "released")], None),
            ([("admit", 3, "admitted"), ("revoke", 2, "stale")], "n1"),
            ([("admit", 3, "admitted"), ("admit", 3, "stale")], "n1"),
            ([("interrupt", 4, "released"), ("admit", 4, "stale"), ("admit", 5, "admitted")], "n1"),
        ],
    )
    def test_versions_order_placements(
        self, steps: list[tuple[str, int, str]], node: str | None
    ) -> None:
        """Only placements newer than the last applied one change the admission."""
        pm = PlacementMap()
        for kind, version, result in steps:
            assert pm.apply(pl(kind, version)) == result
        assert pm.node_of("s") == node

    def test_forget_starts_afresh(self) -> None:
        """A forgotten session accepts any version again."""
        pm = PlacementMap()
        pm.apply(pl("admit", 9))
        pm.forget("s")
        assert pm.node_of("s") is None and len(pm) == 0
        assert pm.apply(pl("admit", 1, "n2")) == "admitted" and pm.admitted_count() == 1

    @pytest.mark.parametrize(
        ("placed", "restored", "node"),
        [
            (None, ("admitted", 4), "n2"),
            (("interrupt", 6), ("stale", 5), None),
            (("admit", 5), ("stale", 5), "n1"),
            (("interrupt", 4), ("admitted", 5), "n2"),
        ],
    )
    def test_restore_is_ordered_by_version(
        self, placed: tuple[str, int] | None, restored: tuple[str, int], node: str | None
    ) -> None:
        """An admission read from the store applies only when newer than the last placement,
        and placements of its version or older are stale afterwards."""
        pm = PlacementMap()
        if placed is not None:
            pm.apply(pl(placed[0], placed[1]))
        result, version = restored
        assert pm.restore("s", version, "n2") == result
        assert pm.node_of("s") == node
        assert pm.apply(pl("interrupt", version)) == "stale"


class TestHolds:
    async def test_admit_wakes_every_held_request_of_the_session(self) -> None:
        """All held requests of the session get the node; others stay held."""
        holds = Holds()
        a = asyncio.create_task(holds.wait("s", 10))
        b = asyncio.create_task(holds.wait("s", 10))
        other = asyncio.create_task(holds.wait("t", 10))
        assert holds.held() == 3 and holds.is_held("s")
        assert holds.admit("s", "n1") == 2
        assert await a == "n1" and await b == "n1"
        assert holds.held() == 1
        other.cancel()
        with pytest.raises(asyncio.CancelledError):
            await other
        assert holds.held() == 0 and not holds.is_held("t")

    async def test_end_releases_the_session_with_hold_ended(self) -> None:
        """end() raises HoldEnded in every held request of the session and names them."""
        holds = Holds()
        a = asyncio.create_task(holds.wait("s", 10, "r1"))
        b = asyncio.create_task(holds.wait("s", 10, "r2"))
        other = asyncio.create_task(holds.wait("t", 10, "r3"))
        assert sorted(holds.end("s")) == ["r1", "r2"]
        for task in (a, b):
            with pytest.raises(HoldEnded, match="'s' was ended"):
                await task
        assert holds.held() == 1 and holds.end("s") == []
        assert holds.admit("t", "n1") == 1 and await other == "n1"

    async def test_timeout_raises_hold_timeout(self) -> None:
        """A hold that is not admitted in time raises HoldTimeout and is released."""
        holds = Holds()
        with pytest.raises(HoldTimeout, match="'s' not admitted"):
            await holds.wait("s", 0.001)
        assert holds.held() == 0


class TestNodeDirectory:
    def test_static_then_status_url_and_models(self) -> None:
        """Static URLs are used until a status brings a URL; older statuses are ignored."""
        nodes = NodeDirectory({"n1": "http://a:1/"})
        assert nodes.endpoint("n1", "/v1/completions") == "http://a:1/v1/completions"
        nodes.update(NodeStatus(node_id="n1", ts=5.0, models=["m"], url="http://b:2/v1"))
        nodes.update(NodeStatus(node_id="n1", ts=4.0, models=["old"], url="http://c:3"))
        assert nodes.endpoint("n1", "/v1/models") == "http://b:2/v1/models"
        assert nodes.models() == ["m"] and nodes.endpoint("zz", "/v1/models") is None


class TestMetrics:
    def test_page_has_counters_gauge_and_histogram(self) -> None:
        """The page renders labelled counters, gauges and cumulative histogram buckets."""
        metrics = GatewayMetrics(lambda: 2, lambda: 1)
        metrics.forwarded.inc(node='n"1')
        metrics.hold_seconds.observe(0.2)
        metrics.hold_seconds.observe(500.0)
        page = metrics.render()
        assert 'tao_gateway_forwarded_total{node="n\\"1"} 1' in page
        assert "tao_gateway_held_requests 2" in page
        assert 'tao_gateway_hold_seconds_bucket{le="0.25"} 1' in page
        assert 'tao_gateway_hold_seconds_bucket{le="+Inf"} 2' in page
        assert "tao_gateway_hold_seconds_count 2" in page
