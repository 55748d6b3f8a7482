"""The gateway on the real bus (and the fake): a held request is admitted by a placement
published over NATS, forwarded to a stub node, and reported on the session stream. On real NATS
and Redis: a restarted gateway finds admissions in the store, and a held request is released by
an admission whose placement never came."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import RELAY, Relay, create_app
from shared.contracts import (
    Message,
    Placement,
    SessionEvent,
    SessionRequest,
    SessionResponse,
    decode_session_event,
    subjects,
)
from shared.core.session import Session
from shared.infra import Bus, Delivery, MessageBus, Settings
from shared.infra.store import Store

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


class ReadSignalStore(Store):
    """The real store, queueing the id of every session read so the test awaits the read (the
    gateway registers a hold right after its arrival read, before it yields)."""

    def __init__(self, client: aioredis.Redis, domain: str) -> None:
        super().__init__(client, domain)
        self.reads: asyncio.Queue[str] = asyncio.Queue()

    async def get_session(self, sid: str) -> Session | None:
        record = await super().get_session(sid)
        self.reads.put_nowait(sid)
        return record


@pytest.fixture
async def real(
    nats_url: str, redis_url: str, namespace: str
) -> AsyncIterator[tuple[Bus, ReadSignalStore]]:
    bus = await Bus.connect(nats_url, name="test-gw", namespace=namespace)
    await bus.ensure_streams()
    client = aioredis.Redis.from_url(redis_url)
    store = ReadSignalStore(client, namespace)
    try:
        yield bus, store
    finally:
        await store.clear()
        await client.aclose()
        await bus.drain()
        admin = await Bus.connect(nats_url, name="test-gw-cleanup", namespace=namespace)
        await admin.delete_streams()
        await admin.drain()


async def admit_in_store(store: Store, sid: str, version: int) -> None:
    """Write the record as the planner's apply step leaves it: admitted on n1."""
    record = Session(id=sid, version=version, activity="running", node="n1", weight=64)
    await store.update_session(sid, lambda _: record)


class TestGatewayOnRealStore:
    async def test_restart_and_missed_placement(self, real: tuple[Bus, ReadSignalStore]) -> None:
        """After a restart an admitted session is forwarded at once (no hold: it would time
        out), and a held request goes when the store shows an admission never placed."""
        bus, store = real
        node_app = web.Application()
        node_app.router.add_post("/v1/chat/completions", node_chat)
        node = TestServer(node_app)
        await node.start_server()
        urls = {"n1": str(node.make_url("")).rstrip("/")}
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        clients: list[TestClient] = []

        async def gateway(hold_timeout_s: float, recheck_s: float) -> tuple[TestClient, Relay]:
            settings = Settings(gateway_id=GW, hold_timeout_s=hold_timeout_s)
            app = create_app(settings, bus, node_urls=urls, store=store, store_recheck_s=recheck_s)
            client = TestClient(TestServer(app))
            await client.start_server()
            clients.append(client)
            return client, app[RELAY]

        def post(client: TestClient, sid: str) -> Any:
            return client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": sid})

        try:
            first, _ = await gateway(20, 60)
            await admit_in_store(store, "s1", 2)
            await bus.publish_msg(
                Placement(
                    kind="admit", session_id="s1", version=2, tick=1, gateway_id=GW, node_id="n1"
                )
            )
            assert (await asyncio.wait_for(post(first, "s1"), 10)).status == 200
            await first.close()

            restarted, relay = await gateway(0.2, 60)
            resp = await asyncio.wait_for(post(restarted, "s1"), 10)
            assert resp.status == 200
            assert relay.metrics.store_admissions.get(when="arrival") == 1
            assert relay.metrics.hold_seconds.count == 0
            await restarted.close()

            watching, relay = await gateway(20, 0.05)
            while not store.reads.empty():
                store.reads.get_nowait()
            task = asyncio.create_task(post(watching, "s2"))
            assert await asyncio.wait_for(store.reads.get(), 10) == "s2"
            assert relay.holds.is_held("s2")
            await admit_in_store(store, "s2", 3)
            resp = await asyncio.wait_for(task, 10)
            assert resp.status == 200
            assert relay.metrics.store_admissions.get(when="held") == 1
            assert relay.placements.node_of("s2") == "n1"
        finally:
            for client in clients:
                await client.close()
            await node.close()
