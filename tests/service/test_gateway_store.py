"""Service tests of the gateway's state-store reads: admissions it learns without a placement.

The gateway runs on FakeBus with a FakeStore; the "planner" here only writes the session record
(as its apply step does) and publishes nothing, so whatever forwards the request came from the
store. A stub node answers every chat request with a fixed JSON completion.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import RELAY, Relay, create_app
from shared.contracts import (
    Placement,
    SessionCancel,
    SessionRequest,
    decode,
    decode_session_event,
    subjects,
)
from shared.core.session import Session
from shared.infra import FakeBus, Settings
from shared.infra.fake_store import FakeStore
from shared.infra.store_types import NodeUpdate, StoreError

GW = "gwstore"
BODY: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def node_chat(request: web.Request) -> web.Response:
    await request.json()
    return web.json_response(
        {
            "choices": [{"index": 0, "message": {"content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
        }
    )


class ReadSignalStore(FakeStore):
    """A FakeStore that queues the id of every session read, so a test awaits the read itself.
    The gateway registers a hold right after its arrival read, before it yields, so once the
    test sees the read the hold is registered."""

    def __init__(self, domain: str) -> None:
        super().__init__(domain)
        self.reads: asyncio.Queue[str] = asyncio.Queue()

    async def get_session(self, sid: str) -> Session | None:
        record = await super().get_session(sid)
        self.reads.put_nowait(sid)
        return record


class StuckStore(FakeStore):
    """A store whose session reads never finish; ``reading`` is set once one started."""

    def __init__(self, domain: str) -> None:
        super().__init__(domain)
        self.reading = asyncio.Event()

    async def get_session(self, sid: str) -> Session | None:
        self.reading.set()
        await asyncio.Event().wait()
        return None


class BrokenStore(FakeStore):
    """A store whose session reads fail (Redis down)."""

    async def get_session(self, sid: str) -> Session | None:
        raise StoreError("connection refused")


@dataclass
class Env:
    bus: FakeBus
    store: ReadSignalStore
    node_url: str
    clients: list[TestClient]

    async def gateway(
        self, *, hold_timeout_s: float, recheck_s: float, store: FakeStore | None = None
    ) -> TestClient:
        """Start a gateway on the shared bus and store (a restart is a second call)."""
        app = create_app(
            Settings(gateway_id=GW, hold_timeout_s=hold_timeout_s),
            self.bus,
            node_urls={"n1": self.node_url},
            store=store or self.store,
            store_recheck_s=recheck_s,
        )
        client = TestClient(TestServer(app))
        await client.start_server()
        self.clients.append(client)
        return client

    async def admit_in_store(self, sid: str, version: int, node: str = "n1") -> None:
        """Write the record as the planner's apply step leaves it: admitted on ``node``."""
        record = Session(id=sid, version=version, activity="running", node=node, weight=64)
        await self.store.update_session(sid, lambda _: record)

    def requests(self) -> list[SessionRequest]:
        prefix = subjects.session_events("request")[:-1]
        return [decode(d, SessionRequest) for s, d, _ in self.bus.published if s.startswith(prefix)]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    node_app = web.Application()
    node_app.router.add_post("/v1/chat/completions", node_chat)
    node = TestServer(node_app)
    await node.start_server()
    e = Env(FakeBus(), ReadSignalStore("gwtest"), str(node.make_url("")).rstrip("/"), [])
    try:
        yield e
    finally:
        for client in e.clients:
            await client.close()
        await node.close()
        await e.bus.drain()


def relay_of(client: TestClient) -> Relay:
    return client.server.app[RELAY]


async def chat(client: TestClient, sid: str) -> Any:
    return await client.post("/v1/chat/completions", json=BODY, headers={"X-Session-ID": sid})


class TestAdmittedOnArrival:
    async def test_restarted_gateway_forwards_admitted_session_at_once(self, env: Env) -> None:
        """A new gateway on the same store forwards a session admitted before it started,
        without a hold (a hold would time out into 503, and the watcher never runs)."""
        first = await env.gateway(hold_timeout_s=10, recheck_s=60)
        await env.admit_in_store("s1", 3)
        await env.bus.publish_msg(
            Placement(kind="admit", session_id="s1", version=3, tick=1, gateway_id=GW, node_id="n1")
        )
        await env.bus.settle()
        assert (await chat(first, "s1")).status == 200
        await first.close()
        restarted = await env.gateway(hold_timeout_s=0.05, recheck_s=60)
        resp = await chat(restarted, "s1")
        assert (
            resp.status == 200 and (await resp.json())["choices"][0]["message"]["content"] == "ok"
        )
        relay = relay_of(restarted)
        assert relay.metrics.store_admissions.get(when="arrival") == 1
        assert relay.metrics.hold_seconds.count == 0
        assert relay.placements.node_of("s1") == "n1"

    async def test_known_admission_skips_the_store(self, env: Env) -> None:
        """Once admitted, later requests of the session are forwarded without a store read."""
        gw = await env.gateway(hold_timeout_s=0.05, recheck_s=60)
        await env.admit_in_store("s1", 1)
        assert (await chat(gw, "s1")).status == 200
        assert (await chat(gw, "s1")).status == 200
        assert env.store.reads.qsize() == 1
        assert relay_of(gw).metrics.store_admissions.get(when="arrival") == 1

    @pytest.mark.parametrize(
        ("record", "why"),
        [
            (Session(id="s1", version=2, activity="waiting"), "not admitted"),
            (Session(id="s1", version=2, activity="running", node="n9", weight=8), "unknown URL"),
            (Session(id="s1", version=2, ended=True), "ended"),
        ],
    )
    async def test_unusable_record_holds(self, env: Env, record: Session, why: str) -> None:
        """A record that is not admitted, ended, or admitted on a node without a known URL
        leaves the request held (here: until its 50 ms timeout)."""
        gw = await env.gateway(hold_timeout_s=0.05, recheck_s=60)
        await env.store.update_session("s1", lambda _: record)
        assert (await chat(gw, "s1")).status == 503, why
        assert relay_of(gw).metrics.store_admissions.get(when="arrival") == 0

    async def test_newer_placement_beats_older_record(self, env: Env) -> None:
        """An interrupt placement newer than the stored admission keeps the session held."""
        gw = await env.gateway(hold_timeout_s=0.05, recheck_s=60)
        await env.bus.publish_msg(
            Placement(kind="interrupt", session_id="s1", version=6, tick=2, gateway_id=GW)
        )
        await env.bus.settle()
        await env.admit_in_store("s1", 5)
        assert (await chat(gw, "s1")).status == 503
        assert relay_of(gw).placements.node_of("s1") is None

    async def test_store_failure_holds_as_without_store(self) -> None:
        """A store that cannot be read is logged and the request holds as before."""
        bus = FakeBus()
        app = create_app(
            Settings(gateway_id=GW, hold_timeout_s=0.05),
            bus,
            node_urls={"n1": "http://127.0.0.1:9"},
            store=BrokenStore("gwtest"),
            store_recheck_s=0.01,
        )
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            resp = await chat(client, "s1")
            assert resp.status == 503
            assert (await resp.json())["error"]["type"] == "service_unavailable"
        finally:
            await client.close()
            await bus.drain()


class TestAdmittedWhileHeld:
    async def test_held_request_forwarded_when_store_shows_admission(self, env: Env) -> None:
        """A held request goes to the node once the store shows the session admitted, though
        its placement never arrives."""
        gw = await env.gateway(hold_timeout_s=10, recheck_s=0.01)
        task = asyncio.create_task(chat(gw, "s1"))
        relay = relay_of(gw)
        assert await env.store.reads.get() == "s1"  # the arrival read: nothing admitted yet
        assert relay.holds.is_held("s1")
        assert relay.metrics.store_admissions.get(when="arrival") == 0
        await env.admit_in_store("s1", 4)
        resp = await task
        assert resp.status == 200
        assert relay.metrics.store_admissions.get(when="held") == 1
        assert relay.placements.node_of("s1") == "n1" and relay.holds.held() == 0
        assert relay.stored.watching() == 0
        assert [r.session_id for r in env.requests()] == ["s1"]

    async def test_one_watcher_per_held_session(self, env: Env) -> None:
        """Several held requests of one session share one watcher and all go when admitted."""
        gw = await env.gateway(hold_timeout_s=10, recheck_s=0.01)
        tasks = [asyncio.create_task(chat(gw, "s1")) for _ in range(3)]
        relay = relay_of(gw)
        while relay.holds.held() < 3:  # each arrival read is followed by its hold
            await env.store.reads.get()
        assert relay.stored.watching() == 1
        await env.admit_in_store("s1", 2)
        assert [r.status for r in await asyncio.gather(*tasks)] == [200, 200, 200]
        assert relay.metrics.store_admissions.get(when="held") == 1


class TestClientLeavesDuringRead:
    async def test_client_gone_during_arrival_read_is_cancelled(self) -> None:
        """A client that leaves while the arrival read is in flight is reported as a cancel."""
        bus = FakeBus()
        seen: asyncio.Queue[object] = asyncio.Queue()

        async def record(msg: object, delivery: object) -> None:
            await seen.put(msg)

        await bus.subscribe(subjects.session_events(), "rec", decode_session_event, record)
        store = StuckStore("gwtest")
        app = create_app(
            Settings(gateway_id=GW, hold_timeout_s=10),
            bus,
            node_urls={"n1": "http://127.0.0.1:9"},
            store=store,
        )
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            task = asyncio.create_task(chat(client, "s1"))
            await store.reading.wait()
            task.cancel()
            assert isinstance(await asyncio.wait_for(seen.get(), 10), SessionRequest)
            cancel = await asyncio.wait_for(seen.get(), 10)
            assert isinstance(cancel, SessionCancel)
            assert (cancel.session_id, cancel.reason) == ("s1", "client_closed")
        finally:
            await client.close()
            await bus.drain()


class TestClusterMetrics:
    async def test_metrics_page_carries_the_domains_series(self, env: Env) -> None:
        """GET /metrics gives the gateway's own series and, read from the store, the nodes',
        the planner's and the pool's (the dashboard and alerts in deploy/ chart them)."""
        await env.store.put_node_status("n1", NodeUpdate(capacity_tokens=4096, healthy=True))
        await env.store.incr(ticks=3)
        await env.admit_in_store("s1", 1)
        client = await env.gateway(hold_timeout_s=5.0, recheck_s=0.05)
        text = await (await client.get("/metrics")).text()
        assert "# TYPE tao_gateway_requests_total counter" in text
        assert 'tao_node_capacity_tokens{node="n1"} 4096' in text
        assert 'tao_node_reserved_tokens{node="n1"} 64' in text
        assert "tao_planner_ticks_total 3" in text and "tao_cluster_scrape_ok 1" in text
