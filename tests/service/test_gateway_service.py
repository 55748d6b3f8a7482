"""Service tests of the gateway: the real app on an in-memory bus, forwarding to a stub node.

The stub node is a small aiohttp app that answers like vLLM (JSON, or SSE ending with a
usage-only chunk when ``stream_options.include_usage`` is set, then ``data: [DONE]``).
Synchronisation is on events: the test awaits the bus messages the gateway publishes.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from openai import AsyncOpenAI

from services.gateway import RELAY, create_app
from shared.contracts import (
    NodeStatus,
    Placement,
    SessionCancel,
    SessionEnd,
    SessionRequest,
    SessionResponse,
    ToolCallInfo,
    decode_session_event,
    subjects,
)
from shared.infra import FakeBus, Settings
from shared.infra.embedded import free_port
from tests.service.gateway_util import Recorder

GW = "gwtest"
USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 3,
    "total_tokens": 43,
    "prompt_tokens_details": {"cached_tokens": 32},
}


def sse(obj: object) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


STREAM_CHUNKS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, "stop"),
]
TOOL_CHUNKS = [
    chunk({"role": "assistant", "content": None}),
    chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "bash", "arguments": ""},
                }
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"cmd":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"ls"}'}}]}),
    chunk({}, "tool_calls"),
]
USAGE_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [],
    "usage": USAGE,
}


class StubNode:
    """A vLLM stand-in: records requests; optionally waits on ``gate`` mid-stream."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.fail_status: int | None = None
        self.chunks = STREAM_CHUNKS
        self.message: dict[str, Any] = {"role": "assistant", "content": "Hello"}
        self.gate: asyncio.Event | None = None
        self.streaming = asyncio.Event()
        self.aborted = asyncio.Event()
        self.arrived = asyncio.Event()
        self.frozen: asyncio.Event | None = None  # set: answer nothing until it is set

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)  # as vLLM, no 1 MiB cap on prompts
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        self.paths.append(request.path)
        self.arrived.set()
        if self.frozen is not None:  # a SIGSTOPped engine: the socket is open, nothing comes
            await self.frozen.wait()
        if self.fail_status is not None:
            error = {"object": "error", "message": "bad", "code": self.fail_status}
            return web.json_response(error, status=self.fail_status)
        if not body.get("stream"):
            finish = "tool_calls" if self.message.get("tool_calls") else "stop"
            return web.json_response(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": "m",
                    "choices": [{"index": 0, "message": self.message, "finish_reason": finish}],
                    "usage": USAGE,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i, c in enumerate(self.chunks):
                data = sse(c)
                await resp.write(data[:7])  # split events across writes
                await resp.write(data[7:])
                if i == 1:
                    self.streaming.set()
                    if self.gate is not None:
                        await self.gate.wait()
            if (body.get("stream_options") or {}).get("include_usage"):
                await resp.write(sse(USAGE_CHUNK))
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            self.aborted.set()
            raise
        return resp


def expected_stream(chunks: list[dict[str, Any]], *, usage: bool) -> bytes:
    out = b"".join(sse(c) for c in chunks)
    return out + (sse(USAGE_CHUNK) if usage else b"") + b"data: [DONE]\n\n"


class Harness:
    def __init__(self, bus: FakeBus, client: TestClient, node: StubNode, rec: Recorder) -> None:
        self.bus, self.client, self.node, self.rec = bus, client, node, rec
        self.relay = client.server.app[RELAY]

    async def place(self, kind: str, session: str, version: int, node: str | None = "n1") -> None:
        await self.bus.publish_msg(
            Placement(
                kind=kind,
                session_id=session,
                version=version,
                tick=version,  # type: ignore[arg-type]
                gateway_id=GW,
                node_id=node,
            )
        )
        await self.bus.settle()

    async def chat(
        self, session: str | None = "s1", headers: dict[str, str] | None = None, **body: Any
    ) -> Any:
        headers = {**({"X-Session-ID": session} if session else {}), **(headers or {})}
        payload = {"model": "m", "messages": [{"role": "user", "content": "hi there"}], **body}
        return await self.client.post("/v1/chat/completions", json=payload, headers=headers)


async def make_harness(
    settings: Settings, node_url: str | None = None, node: StubNode | None = None
) -> AsyncIterator[Harness]:
    bus = FakeBus()
    rec = Recorder()
    await bus.subscribe(subjects.session_events(), "rec", decode_session_event, rec.handler)
    node = node or StubNode()
    node_server = TestServer(node.app())
    await node_server.start_server()
    url = node_url or str(node_server.make_url("")).rstrip("/")
    app = create_app(settings, bus, node_urls={"n1": url})
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield Harness(bus, client, node, rec)
    finally:
        await client.close()
        await node_server.close()
        await bus.drain()


SETTINGS = Settings(gateway_id=GW, hold_timeout_s=10.0, retry_after_s=2.5)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS):
        yield harness


@pytest.fixture
async def quick() -> AsyncIterator[Harness]:
    """A gateway whose holds time out after 50 ms."""
    async for harness in make_harness(SETTINGS.replace(hold_timeout_s=0.05)):
        yield harness


class TestHolding:
    async def test_held_until_admit_then_forwarded(self, h: Harness) -> None:
        """A request of a session not admitted waits, and is forwarded once an admit arrives."""
        task = asyncio.create_task(h.chat("s1"))
        [req] = await h.rec.next(SessionRequest)
        assert (req.session_id, req.gateway_id, req.model, req.messages_count) == ("s1", GW, "m", 1)
        assert req.prompt_tokens_estimate == 2  # "hi there": 8 chars / 4
        assert h.relay.holds.held() == 1 and h.node.bodies == []
        await h.place("admit", "s1", 1)
        resp = await task
        assert resp.status == 200
        assert (await resp.json())["choices"][0]["message"]["content"] == "Hello"
        [done] = await h.rec.next(SessionResponse)
        assert (done.node_id, done.request_id, done.error) == ("n1", req.request_id, None)
        assert done.usage.cached_tokens == 32 and done.usage.total_tokens == 43

    async def test_admitted_session_forwards_at_once(self, quick: Harness) -> None:
        """A session already admitted is forwarded without holding (a hold would give 503)."""
        await quick.place("admit", "s1", 1)
        resp = await quick.chat("s1")
        assert resp.status == 200
        assert len(quick.node.bodies) == 1

    async def test_hold_timeout_answers_503_with_retry_after(self, quick: Harness) -> None:
        """A hold past the limit answers 503, Retry-After, an OpenAI error, and a cancel."""
        resp = await quick.chat("s1")
        assert resp.status == 503
        assert resp.headers["Retry-After"] == "3"
        body = await resp.json()
        assert body["error"]["type"] == "service_unavailable" and "s1" in body["error"]["message"]
        [cancel] = await quick.rec.next(SessionCancel)
        assert (cancel.session_id, cancel.reason) == ("s1", "wait_timeout")
        assert quick.node.bodies == [] and quick.relay.holds.held() == 0
        assert quick.relay.metrics.unavailable.get() == 1

    async def test_client_disconnect_releases_held_request(self, h: Harness) -> None:
        """A client that goes away while held releases the hold and the gateway cancels."""
        task = asyncio.create_task(h.chat("s1"))
        await h.rec.next(SessionRequest)
        task.cancel()
        [cancel] = await h.rec.next(SessionCancel)
        assert (cancel.session_id, cancel.reason) == ("s1", "client_closed")
        assert h.relay.holds.held() == 0
        assert h.rec.of(SessionResponse) == []

    async def test_stale_placement_ignored(self, quick: Harness) -> None:
        """An interrupt older than the applied admit leaves the session admitted."""
        await quick.place("admit", "s1", 5)
        await quick.place("interrupt", "s1", 3)
        assert (await quick.chat("s1")).status == 200
        await quick.place("interrupt", "s1", 6)
        assert (await quick.chat("s1")).status == 503
        assert quick.relay.metrics.placements.get(kind="interrupt", result="stale") == 1

    async def test_session_ended_elsewhere_loses_admission(self, quick: Harness) -> None:
        """A SessionEnd from another service (idle timeout) clears the session's admission."""
        await quick.place("admit", "s1", 1)
        await quick.bus.publish_msg(
            SessionEnd(session_id="s1", ended_at=1.0, reason="idle_timeout")
        )
        await quick.bus.settle()
        assert quick.relay.placements.node_of("s1") is None
        assert (await quick.chat("s1")).status == 503

    async def test_interrupt_applies_after_request_in_flight(self, quick: Harness) -> None:
        """An interrupt during a forwarded request lets it finish; the next request holds."""
        quick.node.gate = asyncio.Event()
        await quick.place("admit", "s1", 1)
        first = await quick.chat("s1", stream=True)
        await quick.node.streaming.wait()
        await quick.place("interrupt", "s1", 2)
        quick.node.gate.set()
        assert first.status == 200
        assert (await first.read()).endswith(b"data: [DONE]\n\n")
        assert (await quick.chat("s1")).status == 503


class TestForwarding:
    async def test_stream_passthrough_strips_added_usage_chunk(self, h: Harness) -> None:
        """The client sees the node's stream byte for byte, without the usage chunk it did
        not ask for, while the gateway still reports usage."""
        await h.place("admit", "s1", 1)
        resp = await h.chat("s1", stream=True)
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        assert await resp.read() == expected_stream(STREAM_CHUNKS, usage=False)
        assert h.node.bodies[0]["stream_options"] == {"include_usage": True}
        [done] = await h.rec.next(SessionResponse)
        assert done.usage.prompt_tokens == 40 and done.usage.cached_tokens == 32
        assert done.finish_reason == "stop" and done.error is None
        assert done.ttft_s is not None and done.duration_s is not None
        assert done.ttft_s <= done.duration_s

    async def test_stream_keeps_usage_chunk_when_client_asked(self, h: Harness) -> None:
        """A client that asked for usage gets the whole stream unchanged."""
        await h.place("admit", "s1", 1)
        resp = await h.chat("s1", stream=True, stream_options={"include_usage": True})
        assert await resp.read() == expected_stream(STREAM_CHUNKS, usage=True)

    async def test_tool_calls_reported_non_stream(self, h: Harness) -> None:
        """Tool calls of a JSON response are reported with id, name and argument size."""
        h.node.message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"p":"a"}'},
                }
            ],
        }
        await h.place("admit", "s1", 1)
        assert (await h.chat("s1")).status == 200
        [done] = await h.rec.next(SessionResponse)
        assert done.tool_calls == [ToolCallInfo(id="call_9", name="read_file", arguments_bytes=9)]
        assert done.finish_reason == "tool_calls"

    async def test_tool_calls_reported_stream(self, h: Harness) -> None:
        """Streamed tool-call fragments are joined by index into one reported call."""
        h.node.chunks = TOOL_CHUNKS
        await h.place("admit", "s1", 1)
        resp = await h.chat("s1", stream=True)
        assert await resp.read() == expected_stream(TOOL_CHUNKS, usage=False)
        [done] = await h.rec.next(SessionResponse)
        assert done.tool_calls == [ToolCallInfo(id="call_1", name="bash", arguments_bytes=12)]

    async def test_client_disconnect_mid_stream_aborts_node(self, h: Harness) -> None:
        """A client leaving mid-stream closes the node connection and is reported."""
        h.node.gate = asyncio.Event()
        await h.place("admit", "s1", 1)
        async with ClientSession() as session:
            url = h.client.make_url("/v1/chat/completions")
            body = {"model": "m", "messages": [], "stream": True}
            resp = await session.post(url, json=body, headers={"X-Session-ID": "s1"})
            await resp.content.readany()
            await h.node.streaming.wait()
            resp.close()
        await h.node.aborted.wait()
        [done] = await h.rec.next(SessionResponse)
        assert (done.error, done.node_id) == ("client_closed", "n1")

    async def test_completions_endpoint_forwards_to_node_completions(self, h: Harness) -> None:
        """POST /v1/completions is held and forwarded to the node's /v1/completions."""
        await h.place("admit", "s1", 1)
        payload = {"model": "m", "prompt": "abcdefgh", "user": "s1"}
        resp = await h.client.post("/v1/completions", json=payload)
        assert resp.status == 200 and h.node.paths == ["/v1/completions"]
        [req] = await h.rec.next(SessionRequest)
        assert (req.prompt_tokens_estimate, req.messages_count) == (2, 0)

    async def test_node_error_status_passes_through_and_is_reported(self, h: Harness) -> None:
        """A node's 4xx answer reaches the client unchanged and is reported as an error."""
        h.node.fail_status = 400
        await h.place("admit", "s1", 1)
        resp = await h.chat("s1", stream=True)
        assert resp.status == 400 and (await resp.json())["message"] == "bad"
        [done] = await h.rec.next(SessionResponse)
        assert done.error == "upstream_status_400"

    async def test_upstream_down_answers_502_and_reports(self) -> None:
        """A node that cannot be reached gives 502 with an OpenAI error, and is reported."""
        dead = f"http://127.0.0.1:{free_port()}"
        async for h in make_harness(SETTINGS, node_url=dead):
            await h.place("admit", "s1", 1)
            resp = await h.chat("s1")
            assert resp.status == 502
            assert (await resp.json())["error"]["type"] == "upstream_error"
            [done] = await h.rec.next(SessionResponse)
            assert done.error is not None and done.error.startswith("upstream_unreachable")
            assert h.relay.metrics.upstream_errors.get(node="n1", kind="unreachable") == 1


class TestOpenAIClient:
    async def test_openai_client_reads_gateway_answers(self, h: Harness) -> None:
        """The OpenAI Python client streams, reads usage and lists models through the gateway."""
        await h.place("admit", "s1", 1)
        oai = AsyncOpenAI(base_url=str(h.client.make_url("/v1")), api_key="unused")
        try:
            args: dict[str, Any] = {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "extra_headers": {"X-Session-ID": "s1"},
            }
            stream = await oai.chat.completions.create(stream=True, **args)
            parts = [c.choices[0].delta.content async for c in stream if c.choices]
            assert "".join(p or "" for p in parts) == "Hello"
            reply = await oai.chat.completions.create(**args)
            assert reply.usage is not None and reply.usage.total_tokens == 43
            assert [m.id for m in (await oai.models.list()).data] == ["m"]
        finally:
            await oai.close()


class TestSessionIdentity:
    @pytest.mark.parametrize(
        ("header", "extra", "expected"),
        [
            ("hdr", {"session_id": "sid", "user": "u", "program_id": "p"}, "hdr"),
            (None, {"session_id": "sid", "user": "u", "program_id": "p"}, "sid"),
            (None, {"user": "u", "program_id": "p"}, "u"),
            (None, {"program_id": "p"}, "p"),
        ],
    )
    async def test_session_id_sources(
        self, h: Harness, header: str | None, extra: dict[str, str], expected: str
    ) -> None:
        """The session id comes from X-Session-ID, else the body's session_id (OpenRouter's
        field), else user, else program_id; the gateway's fields are not forwarded."""
        await h.place("admit", expected, 1)
        resp = await h.chat(header, tao_script={"k": 1}, tao_secret=1, **extra)
        assert resp.status == 200
        [req] = await h.rec.next(SessionRequest)
        assert req.session_id == expected
        sent = h.node.bodies[0]
        assert "program_id" not in sent and "tao_secret" not in sent and "session_id" not in sent
        assert sent["tao_script"] == {"k": 1}
        assert h.node.headers[0]["X-Session-ID"] == expected
        assert h.rec.of(SessionEnd) == []

    async def test_no_id_without_continuation_is_a_one_turn_session(self) -> None:
        """With continuation off (TAO_CONTINUATION_SESSIONS=0), a request without an id is a
        generated one-turn session, ended after its reply."""
        async for h in make_harness(SETTINGS.replace(continuation_sessions=0)):
            await self._one_turn(h)

    async def test_completions_without_id_is_a_one_turn_session(self, h: Harness) -> None:
        """A completions request has no conversation to continue: one turn, ended after it."""
        task = asyncio.create_task(
            h.client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
        )
        [req] = await h.rec.next(SessionRequest)
        await h.place("admit", req.session_id, 1)
        assert (await task).status == 200
        [end] = await h.rec.next(SessionEnd)
        assert (end.session_id, end.reason) == (req.session_id, "completed")

    async def test_no_id_chat_stays_open_for_its_continuation(self, h: Harness) -> None:
        """A chat request without an id starts a generated session that is not ended after its
        reply: its next turn continues it (TAO's idle timeout ends it)."""
        task = asyncio.create_task(h.chat(None))
        [req] = await h.rec.next(SessionRequest)
        assert req.session_id.startswith("gw-")
        await h.place("admit", req.session_id, 1)
        assert (await task).status == 200
        await h.rec.next(SessionResponse)
        await h.relay.flush()
        assert h.rec.of(SessionEnd) == []

    @staticmethod
    async def _one_turn(h: Harness) -> None:
        task = asyncio.create_task(h.chat(None))
        [req] = await h.rec.next(SessionRequest)
        assert req.session_id.startswith("gw-")
        await h.place("admit", req.session_id, 1)
        assert (await task).status == 200
        [end] = await h.rec.next(SessionEnd)
        assert (end.session_id, end.reason) == (req.session_id, "completed")
        kinds = [type(m).__name__ for m in h.rec.seen]
        assert kinds == ["SessionRequest", "SessionResponse", "SessionEnd"]


class TestHarnessHeader:
    async def test_harness_header_is_reported_not_forwarded(self, h: Harness) -> None:
        """X-TAO-Harness sets SessionRequest.harness and does not reach the node."""
        await h.place("admit", "s1", 1)
        resp = await h.chat("s1", headers={"X-TAO-Harness": " claude-code "})
        assert resp.status == 200
        [req] = await h.rec.next(SessionRequest)
        assert req.harness == "claude-code"
        assert "X-TAO-Harness" not in h.node.headers[0]

    async def test_without_header_harness_is_none(self, h: Harness) -> None:
        """A request without X-TAO-Harness (or with a blank one) reports no harness."""
        await h.place("admit", "s1", 1)
        await h.chat("s1")
        await h.chat("s1", headers={"X-TAO-Harness": "  "})
        reqs = await h.rec.next(SessionRequest, 2)
        assert [r.harness for r in reqs] == [None, None]

    async def test_overlong_harness_is_400(self, h: Harness) -> None:
        """A harness name over 128 characters is refused, naming the header."""
        resp = await h.chat("s1", headers={"X-TAO-Harness": "h" * 129})
        assert resp.status == 400
        assert "X-TAO-Harness" in (await resp.json())["error"]["message"]
        assert h.bus.published == []


class TestEndpoints:
    async def test_delete_session_publishes_end(self, h: Harness) -> None:
        """DELETE /v1/sessions/{id} ends the session and forgets its admission."""
        await h.place("admit", "s1", 1)
        resp = await h.client.delete("/v1/sessions/s1")
        assert (await resp.json()) == {"id": "s1", "object": "session.deleted", "deleted": True}
        [end] = await h.rec.next(SessionEnd)
        assert end.session_id == "s1" and end.gateway_id == GW
        assert h.relay.placements.node_of("s1") is None

    async def test_delete_answers_held_requests_at_once(self, h: Harness) -> None:
        """DELETE while requests are held answers each with 409 session_ended and reports a
        SessionCancel per request before the SessionEnd, without waiting for the timeout."""
        first = asyncio.create_task(h.chat("s1"))
        second = asyncio.create_task(h.chat("s1"))
        requests = await h.rec.next(SessionRequest, 2)
        assert h.relay.holds.held() == 2
        deleted = await h.client.delete("/v1/sessions/s1")
        assert deleted.status == 200
        for resp in await asyncio.gather(first, second):
            assert resp.status == 409
            error = (await resp.json())["error"]
            assert error["type"] == "session_ended" and "s1" in error["message"]
        cancels = await h.rec.next(SessionCancel, 2)
        assert {c.request_id for c in cancels} == {r.request_id for r in requests}
        assert {(c.session_id, c.reason) for c in cancels} == {("s1", "session_ended")}
        [end] = await h.rec.next(SessionEnd)
        assert end.session_id == "s1"
        kinds = [type(m).__name__ for m in h.rec.seen]
        assert kinds == ["SessionRequest"] * 2 + ["SessionCancel"] * 2 + ["SessionEnd"]
        assert h.relay.holds.held() == 0 and h.node.bodies == []
        assert h.relay.metrics.requests.get(endpoint="chat", outcome="session_ended") == 2

    async def test_delete_leaves_other_sessions_held(self, h: Harness) -> None:
        """DELETE of one session does not release the held requests of another."""
        other = asyncio.create_task(h.chat("s2"))
        await h.rec.next(SessionRequest)
        assert (await h.client.delete("/v1/sessions/s1")).status == 200
        await h.rec.next(SessionEnd)
        assert h.relay.holds.is_held("s2") and h.rec.of(SessionCancel) == []
        await h.place("admit", "s2", 1)
        assert (await other).status == 200

    async def test_models_from_node_status_else_nodes(self, h: Harness) -> None:
        """/v1/models lists the nodes' models: from node statuses, else asked from the nodes."""
        asked = await (await h.client.get("/v1/models")).json()
        assert [m["id"] for m in asked["data"]] == ["m"]
        await h.bus.publish_msg(NodeStatus(node_id="n2", ts=1.0, models=["b", "a"]))
        await h.bus.settle()
        listed = await (await h.client.get("/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["a", "b"]

    async def test_unknown_model_is_404_at_once(self, h: Harness) -> None:
        """A model no node reports serving is refused at once, as vLLM does; nothing is held."""
        await h.bus.publish_msg(NodeStatus(node_id="n2", ts=1.0, models=["a"]))
        await h.bus.settle()
        resp = await h.chat("s1", model="nope")
        assert resp.status == 404 and "nope" in (await resp.json())["error"]["message"]
        assert h.relay.holds.held() == 0 and h.rec.seen == []

    async def test_unusable_session_id_is_400(self, h: Harness) -> None:
        """A session id too long for a subject token is refused before anything is published."""
        resp = await h.chat("x" * 600)
        message = (await resp.json())["error"]["message"]
        assert resp.status == 400 and "header X-Session-ID must be at most 512" in message
        assert h.bus.published == []

    @pytest.mark.parametrize(
        ("session_id", "needle"),
        [("x" * 600, "'session_id' must be at most 512"), (42, "'session_id' must be a string")],
    )
    async def test_unusable_body_session_id_is_400(
        self, h: Harness, session_id: object, needle: str
    ) -> None:
        """The body's session_id is refused as a header id is: too long for a subject token, or
        not a string; nothing is published."""
        resp = await h.chat(None, session_id=session_id)
        assert resp.status == 400 and needle in (await resp.json())["error"]["message"]
        assert h.bus.published == []

    async def test_bus_down_answers_503_at_once(self, h: Harness) -> None:
        """When the request cannot be registered the client gets 503 + Retry-After at once."""
        await h.bus.drain()  # a closed bus refuses every publish
        resp = await h.chat("s1")
        assert resp.status == 503 and resp.headers["Retry-After"] == "3"
        assert h.relay.holds.held() == 0 and h.node.bodies == []

    async def test_bad_body_is_400(self, h: Harness) -> None:
        """A chat request without messages is refused with an OpenAI-style 400."""
        resp = await h.client.post("/v1/chat/completions", json={"model": "m"})
        assert resp.status == 400
        assert "messages" in (await resp.json())["error"]["message"]
        assert h.rec.seen == []

    async def test_metrics_and_health(self, h: Harness) -> None:
        """/metrics counts forwarded requests by node; /healthz reports held requests."""
        await h.place("admit", "s1", 1)
        await h.chat("s1")
        text = await (await h.client.get("/metrics")).text()
        assert 'tao_gateway_forwarded_total{node="n1"} 1' in text
        assert 'tao_gateway_requests_total{endpoint="chat",outcome="ok"} 1' in text
        health = await (await h.client.get("/healthz")).json()
        assert health == {"status": "ok", "gateway_id": GW, "held": 0, "admitted": 1}


class TestBodyLimit:
    async def test_large_prompt_under_the_default_limit_is_forwarded(self, h: Harness) -> None:
        """A 2 MiB prompt (an agent's long history; aiohttp alone stops at 1 MiB) goes through."""
        await h.place("admit", "s1", 1)
        resp = await h.chat("s1", messages=[{"role": "user", "content": "x" * (2 << 20)}])
        assert resp.status == 200

    async def test_body_over_the_limit_is_413_and_counted(self) -> None:
        """Past TAO_MAX_BODY_BYTES: 413 in the API's error shape, counted as too_large, and
        nothing is registered for the session."""
        async for small in make_harness(SETTINGS.replace(max_body_bytes=4096)):
            resp = await small.chat("s1", messages=[{"role": "user", "content": "x" * 10_000}])
            assert resp.status == 413
            err = (await resp.json())["error"]
            assert "TAO_MAX_BODY_BYTES" in err["message"] and err["type"] == "invalid_request_error"
            text = await (await small.client.get("/metrics")).text()
            assert 'tao_gateway_requests_total{endpoint="chat",outcome="too_large"} 1' in text
            assert small.rec.seen == []


class TestCalibratedEstimate:
    async def test_next_estimate_follows_the_nodes_usage(self, h: Harness) -> None:
        """The first request registers chars / 4; once the node's usage says how many prompt
        tokens that was, the next request's estimate is scaled by the ratio (a fixed ratio
        over-counted running contexts and made the pay-back release sessions needlessly)."""
        content = "word " * 40  # 200 characters: 50 by chars / 4; the stub's usage says 40
        await h.place("admit", "s1", 1)
        msgs = [{"role": "user", "content": content}]
        assert (await h.chat("s1", messages=msgs)).status == 200
        [first] = await h.rec.next(SessionRequest)
        raw = first.prompt_tokens_estimate
        assert raw >= 50
        assert (await h.chat("s1", messages=msgs)).status == 200
        _, second = await h.rec.next(SessionRequest, 2)
        assert second.prompt_tokens_estimate == math.ceil(raw * (USAGE["prompt_tokens"] / raw))
        assert second.prompt_tokens_estimate == 40 < raw
