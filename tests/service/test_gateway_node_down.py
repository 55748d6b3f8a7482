"""The gateway when a node dies or freezes: forwards in flight end, new ones are turned away.

A node that telemetry marks unhealthy (``NodeStatus.healthy = false``, after three failed
scrapes) serves nobody: every request waiting on it is answered at once (502, or an SSE error
event once streaming), reported with ``error = upstream_node_down`` so the session goes idle
and the planner moves it; a request of a session still admitted there gets 503 with
``Retry-After`` (its retry is placed elsewhere). The real app on an in-memory bus, against the
stub node of ``test_gateway_service`` made to hang.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shared.contracts import NodeStatus, SessionRequest, SessionResponse
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness


@pytest.fixture
async def g() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS):
        yield harness


async def status(g: Harness, healthy: bool, ts: float) -> None:
    await g.bus.publish_msg(NodeStatus(node_id="n1", ts=ts, models=["m"], healthy=healthy))
    await g.bus.settle()


class TestNodeDown:
    async def test_a_request_waiting_on_a_frozen_node_ends_when_it_is_marked_down(
        self, g: Harness
    ) -> None:
        g.node.frozen = asyncio.Event()
        await g.place("admit", "s1", 1)
        task = asyncio.create_task(g.chat("s1"))
        await asyncio.wait_for(g.node.arrived.wait(), 5)
        await asyncio.sleep(0.05)
        assert not task.done()  # frozen: no answer, no timeout of its own
        await status(g, healthy=False, ts=2.0)
        resp = await asyncio.wait_for(task, 5)
        assert resp.status == 502
        assert "unhealthy" in (await resp.json())["error"]["message"]
        [done] = await g.rec.next(SessionResponse)
        assert done.error is not None and done.error.startswith("upstream_node_down"), done.error
        assert g.relay.metrics.upstream_errors.get(node="n1", kind="node_down") == 1

    async def test_a_stream_on_a_frozen_node_ends_with_an_error_event(self, g: Harness) -> None:
        g.node.gate = asyncio.Event()  # streams two chunks, then waits
        await g.place("admit", "s1", 1)
        resp = await g.chat("s1", stream=True)
        assert resp.status == 200
        await asyncio.wait_for(g.node.streaming.wait(), 5)
        await status(g, healthy=False, ts=2.0)
        body = await asyncio.wait_for(resp.read(), 5)
        assert b"Hel" in body and b'"upstream_error"' in body and b"[DONE]" not in body
        [done] = await g.rec.next(SessionResponse)
        assert done.error is not None and done.error.startswith("upstream_node_down"), done.error
        await asyncio.wait_for(g.node.aborted.wait(), 5)  # the connection to it was closed

    async def test_requests_for_a_down_node_get_503_until_it_is_back(self, g: Harness) -> None:
        await g.place("admit", "s1", 1)
        await status(g, healthy=False, ts=2.0)
        resp = await g.chat("s1")
        assert resp.status == 503 and resp.headers["Retry-After"] == "3"
        assert g.node.bodies == []  # never sent to the dead node
        [req] = await g.rec.next(SessionRequest)
        [done] = await g.rec.next(SessionResponse)
        assert done.request_id == req.request_id and done.error is not None
        assert done.error.startswith("node_down")
        await status(g, healthy=False, ts=1.0)  # an older status changes nothing
        await status(g, healthy=True, ts=3.0)
        again = await g.chat("s1")
        assert again.status == 200 and len(g.node.bodies) == 1
