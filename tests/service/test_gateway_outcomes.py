"""Every model request through the gateway is counted once, by the way it ended.

``tao_gateway_requests_total{endpoint, outcome}`` rises by exactly one per request, under the
right outcome, whichever path the request took: answered by the node (streaming or not, both
APIs), failed upstream (an error status, an unreachable node, a stream cut short), turned away
before a hold (no API key, a body that is not JSON), held and then timed out, ended by
``DELETE`` or left by the client (while held, while being registered, mid-stream), or broken
by an unexpected error. Each test compares the whole counter before and after its one request,
so a second count (of any label) or a missing one fails it. The same place logs the request's
one ``request_done`` line, with its outcome.

The real app on an in-memory bus; the nodes are the sim node (the answers) and a small node
made to fail in the way a test asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from structlog.testing import capture_logs

from services.gateway import RELAY, Relay, create_app
from services.simnode.app import SimNodeConfig
from services.simnode.app import create_app as create_simnode
from shared.contracts import (
    Placement,
    SessionCancel,
    SessionRequest,
    SessionResponse,
    decode_session_event,
    subjects,
)
from shared.infra import BusError, FakeBus, Settings
from shared.infra.embedded import free_port
from shared.infra.tenants import add_secret
from tests.service.gateway_util import Recorder

GW = "gwout"
SETTINGS = Settings(gateway_id=GW, hold_timeout_s=10.0, retry_after_s=1)
CHAT_BODY: dict[str, Any] = {"model": "tao-sim", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES_BODY: dict[str, Any] = {**CHAT_BODY, "max_tokens": 16}
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}
_REQUEST_SUBJECT = subjects.session_events("request")[:-1]


class GatedBus(FakeBus):
    """A bus whose publishes of :class:`SessionRequest` can wait on ``gate`` or fail."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.waiting = asyncio.Event()
        self.fail = False

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        if subject.startswith(_REQUEST_SUBJECT):
            if self.fail:
                raise BusError("nats: no servers available for connection")
            if self.gate is not None:
                self.waiting.set()
                await self.gate.wait()
        await super().publish(subject, data, headers)


class BadNode:
    """A node that fails as ``mode`` says: ``status`` (a 500), ``cut`` (a stream without its
    end), ``hang`` (a stream that stops after its first event, until ``release``)."""

    def __init__(self) -> None:
        self.mode = "status"
        self.streaming = asyncio.Event()
        self.release = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.answer)
        app.router.add_post("/v1/messages", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        if self.mode == "status":
            return web.json_response({"object": "error", "message": "boom"}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = b'{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,'
        await resp.write(b"data: " + chunk + b'"delta":{"content":"Hel"}}]}\n\n')
        self.streaming.set()
        if self.mode == "hang":
            await self.release.wait()
        return resp  # no finish reason, no [DONE]


class Env:
    def __init__(self, bus: GatedBus, client: TestClient[Any, Any], bad: BadNode, rec: Recorder):
        self.bus, self.client, self.bad, self.rec = bus, client, bad, rec
        self.relay: Relay = client.app[RELAY]

    async def admit(self, session: str, node: str) -> None:
        await self.bus.publish_msg(
            Placement(
                kind="admit", session_id=session, version=1, tick=1, gateway_id=GW, node_id=node
            )
        )
        await self.bus.settle()

    def post(
        self,
        endpoint: str,
        session: str | None = "s1",
        headers: dict[str, str] | None = None,
        **body: Any,
    ) -> Awaitable[Any]:
        payload = {**(MESSAGES_BODY if endpoint == "messages" else CHAT_BODY), **body}
        headers = {**({"X-Session-ID": session} if session else {}), **(headers or {})}
        return self.client.post(PATHS[endpoint], json=payload, headers=headers)

    def counts(self) -> dict[tuple[str, str], float]:
        return {
            (dict(k)["endpoint"], dict(k)["outcome"]): v
            for k, v in self.relay.metrics.requests.values.items()
        }

    async def counted(self, before: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        """What the counter gained since ``before``, once the request was counted and the
        gateway has nothing more in flight (a late second count would show here)."""
        for _ in range(200):
            if self.counts() != before:
                break
            await asyncio.sleep(0.025)
        await self.relay.flush()
        await asyncio.sleep(0.05)
        await self.relay.flush()
        after = self.counts()
        gained = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after.keys() | before}
        return {k: v for k, v in gained.items() if v}


async def make_env(settings: Settings) -> AsyncIterator[Env]:
    bus = GatedBus()
    rec = Recorder()
    await bus.subscribe(subjects.session_events(), "rec", decode_session_event, rec.handler)
    sim = TestServer(create_simnode(SimNodeConfig(node_id="sim", time_scale=100.0)))
    bad = BadNode()
    bad_server = TestServer(bad.app())
    await sim.start_server()
    await bad_server.start_server()
    urls = {
        "sim": str(sim.make_url("")).rstrip("/"),
        "bad": str(bad_server.make_url("")).rstrip("/"),
        "gone": f"http://127.0.0.1:{free_port()}",  # nothing listens there
    }
    client = TestClient(TestServer(create_app(settings, bus, node_urls=urls)))
    await client.start_server()
    try:
        yield Env(bus, client, bad, rec)
    finally:
        bad.release.set()
        if bus.gate is not None:
            bus.gate.set()
        await client.close()
        await bad_server.close()
        await sim.close()
        await bus.drain()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async for e in make_env(SETTINGS):
        yield e


@pytest.fixture
async def quick() -> AsyncIterator[Env]:
    """Holds time out after 50 ms."""
    async for e in make_env(SETTINGS.replace(hold_timeout_s=0.05)):
        yield e


ENDPOINTS = pytest.mark.parametrize("endpoint", ["chat", "messages"])
STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])


class TestForwarded:
    @ENDPOINTS
    @STREAMS
    async def test_answered(self, env: Env, endpoint: str, stream: bool) -> None:
        await env.admit("s1", "sim")
        before = env.counts()
        resp = await env.post(endpoint, stream=stream)
        assert resp.status == 200
        await resp.read()
        assert await env.counted(before) == {(endpoint, "ok"): 1}

    @ENDPOINTS
    @STREAMS
    async def test_error_status_from_the_node(self, env: Env, endpoint: str, stream: bool) -> None:
        await env.admit("s1", "bad")
        before = env.counts()
        resp = await env.post(endpoint, stream=stream)
        assert resp.status == 500
        assert await env.counted(before) == {(endpoint, "upstream_status_500"): 1}

    @ENDPOINTS
    async def test_node_unreachable(self, env: Env, endpoint: str) -> None:
        await env.admit("s1", "gone")
        before = env.counts()
        resp = await env.post(endpoint, stream=True)
        assert resp.status == 502
        assert await env.counted(before) == {(endpoint, "upstream_unreachable"): 1}

    async def test_stream_cut_short(self, env: Env) -> None:
        env.bad.mode = "cut"
        await env.admit("s1", "bad")
        before = env.counts()
        resp = await env.post("chat", stream=True)
        assert resp.status == 200
        await resp.read()
        assert await env.counted(before) == {("chat", "upstream_incomplete"): 1}

    async def test_client_leaves_mid_stream(self, env: Env) -> None:
        env.bad.mode = "hang"
        await env.admit("s1", "bad")
        before = env.counts()
        resp = await env.post("chat", stream=True)
        await asyncio.wait_for(env.bad.streaming.wait(), 5)
        resp.close()  # drop the connection before the stream ends
        assert await env.counted(before) == {("chat", "client_closed"): 1}
        [done] = await env.rec.next(SessionResponse)
        assert done.error == "client_closed"

    async def test_unexpected_error_is_counted_and_reported(self, env: Env) -> None:
        """A forward that raises what no path expects (here the gateway's client session is
        closed) answers 500 and still counts once, and its response is reported."""
        await env.admit("s1", "sim")
        assert env.relay.client is not None
        await env.relay.client.close()
        before = env.counts()
        resp = await env.post("chat")
        assert resp.status == 500
        assert await env.counted(before) == {("chat", "internal_error"): 1}
        [done] = await env.rec.next(SessionResponse)
        assert done.error is not None and done.error.startswith("internal_error: RuntimeError")


class TestNotForwarded:
    @ENDPOINTS
    async def test_body_not_json(self, env: Env, endpoint: str) -> None:
        before = env.counts()
        resp = await env.client.post(PATHS[endpoint], data=b"{nope", headers={"X-Session-ID": "s"})
        assert resp.status == 400
        assert await env.counted(before) == {(endpoint, "bad_request"): 1}

    async def test_scheduler_unreachable(self, env: Env) -> None:
        env.bus.fail = True
        before = env.counts()
        resp = await env.post("chat")
        assert resp.status == 503
        assert await env.counted(before) == {("chat", "bus_error"): 1}

    @ENDPOINTS
    async def test_hold_timeout(self, quick: Env, endpoint: str) -> None:
        before = quick.counts()
        resp = await quick.post(endpoint)
        assert resp.status == 503
        assert await quick.counted(before) == {(endpoint, "wait_timeout"): 1}

    async def test_session_ended_while_held(self, env: Env) -> None:
        before = env.counts()
        held = asyncio.create_task(env.post("chat"))
        await env.rec.next(SessionRequest)
        assert (await env.client.delete("/v1/sessions/s1")).status == 200
        assert (await held).status == 409
        assert await env.counted(before) == {("chat", "session_ended"): 1}

    @ENDPOINTS
    async def test_client_leaves_while_held(self, env: Env, endpoint: str) -> None:
        before = env.counts()
        held = asyncio.create_task(env.post(endpoint))
        await env.rec.next(SessionRequest)
        held.cancel()
        [cancel] = await env.rec.next(SessionCancel)
        assert cancel.reason == "client_closed"
        assert await env.counted(before) == {(endpoint, "client_closed"): 1}

    async def test_client_leaves_while_registered(self, env: Env) -> None:
        """The client goes while its request is being published: counted as it left."""
        env.bus.gate = asyncio.Event()
        before = env.counts()
        sent = asyncio.create_task(env.post("chat"))
        await asyncio.wait_for(env.bus.waiting.wait(), 5)
        sent.cancel()
        for _ in range(200):  # the gateway notices the closed connection
            if env.counts() != before:
                break
            await asyncio.sleep(0.025)
        env.bus.gate.set()
        assert await env.counted(before) == {("chat", "client_closed"): 1}
        [cancel] = await env.rec.next(SessionCancel)
        assert cancel.reason == "client_closed"


@pytest.fixture
async def keyed(tmp_path: Path) -> AsyncIterator[Env]:
    path = tmp_path / "tenants.toml"
    add_secret(path, "team-a", "api")
    async for e in make_env(SETTINGS.replace(tenants_file=str(path))):
        yield e


class TestUnauthorized:
    @ENDPOINTS
    async def test_no_key(self, keyed: Env, endpoint: str) -> None:
        before = keyed.counts()
        resp = await keyed.post(endpoint, headers={"Authorization": "Bearer forged"})
        assert resp.status == 401
        assert await keyed.counted(before) == {(endpoint, "unauthorized"): 1}

    async def test_other_endpoints_count_under_their_own_name(self, keyed: Env) -> None:
        before = keyed.counts()
        assert (await keyed.client.get("/v1/models")).status == 401
        assert await keyed.counted(before) == {("models", "unauthorized"): 1}


@pytest.mark.usefixtures("info_lines_kept")
class TestLogLine:
    async def test_one_request_done_line_per_request_with_its_outcome(self, quick: Env) -> None:
        """Turned away, timed out while held, and answered by the node: one ``request_done``
        line each, naming the endpoint and the outcome it was counted under."""
        await quick.admit("fast", "sim")
        with capture_logs() as logs:
            assert (await quick.client.post(PATHS["chat"], data=b"{")).status == 400
            assert (await quick.post("messages", session="slow")).status == 503
            assert (await quick.post("chat", session="fast")).status == 200
            await quick.relay.flush()
        done = [line for line in logs if line["event"] == "request_done"]
        assert [(d["endpoint"], d["outcome"], d["session_id"]) for d in done] == [
            ("chat", "bad_request", None),
            ("messages", "wait_timeout", "slow"),
            ("chat", "ok", "fast"),
        ]
        assert {d["component"] for d in done} == {"gateway"}  # as each service names its own
        assert done[1]["node_id"] is None and done[2]["node_id"] == "sim"
        assert done[2]["status"] == 200 and done[2]["error"] is None
