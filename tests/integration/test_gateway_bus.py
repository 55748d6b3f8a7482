"""The gateway on the real bus (and the fake): a held request is admitted by a placement
published over NATS, forwarded to a stub node, and reported on the session stream."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import RELAY, create_app
from shared.contracts import (
    Message,
    Placement,
    SessionEvent,
    SessionRequest,
    SessionResponse,
    decode_session_event,
    subjects,
)
from shared.infra import Delivery, MessageBus, Settings

GW = "gwint"


async def node_chat(request: web.Request) -> web.Response:
    await request.json()
    return web.json_response(
        {
            "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        }
    )


class TestGatewayOnBus:
    async def test_placement_over_bus_releases_held_request(self, bus: MessageBus) -> None:
        """SessionRequest out, Placement in, request forwarded, SessionResponse out."""
        seen: asyncio.Queue[SessionEvent] = asyncio.Queue()

        async def record(msg: SessionEvent, delivery: Delivery) -> None:
            await seen.put(msg)

        await bus.subscribe(subjects.session_events(), "rec", decode_session_event, record)
        node_app = web.Application()
        node_app.router.add_post("/v1/chat/completions", node_chat)
        node = TestServer(node_app)
        await node.start_server()
        app = create_app(
            Settings(gateway_id=GW, hold_timeout_s=20),
            bus,
            node_urls={"n1": str(node.make_url("")).rstrip("/")},
        )
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
            task = asyncio.create_task(
                client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "s@1"})
            )
            req: Message = await asyncio.wait_for(seen.get(), 10)
            assert isinstance(req, SessionRequest) and req.session_id == "s@1"
            await bus.publish_msg(
                Placement(
                    kind="admit", session_id="s@1", version=1, tick=1, gateway_id=GW, node_id="n1"
                )
            )
            resp = await asyncio.wait_for(task, 10)
            assert (
                resp.status == 200
                and (await resp.json())["choices"][0]["message"]["content"] == "ok"
            )
            done = await asyncio.wait_for(seen.get(), 10)
            assert isinstance(done, SessionResponse)
            assert (done.node_id, done.usage.total_tokens, done.error) == ("n1", 3, None)
            assert app[RELAY].placements.node_of("s@1") == "n1"
        finally:
            await client.close()
            await node.close()
