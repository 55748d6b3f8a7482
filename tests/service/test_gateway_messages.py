"""The Anthropic Messages API through the gateway to the sim node, as Claude Code uses it.

Claude Code sends ``POST /v1/messages`` (stream or not) with its session in
``metadata.user_id``; the gateway holds, forwards and reports it like a chat completion.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import RELAY, create_app
from services.simnode.app import SimNodeConfig
from services.simnode.app import create_app as create_simnode
from shared.contracts import (
    SessionCancel,
    SessionRequest,
    SessionResponse,
    ToolCallInfo,
    decode_session_event,
    subjects,
)
from shared.infra import FakeBus, Settings
from tests.service.gateway_util import Recorder, admit

GW = "gwmsg"
SID = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
LEGACY_USER_ID = f"user_{'0f' * 32}_account__session_{SID}"
JSON_USER_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SID})
SYSTEM = [{"type": "text", "text": "You are Claude Code, an agent for software tasks."}]
USER_TURN = {"role": "user", "content": [{"type": "text", "text": "Run the tests, then fix them."}]}
BASH = {"name": "Bash", "arguments": {"command": "pytest -x", "timeout": 120000}}


class Env:
    def __init__(
        self, bus: FakeBus, client: TestClient[web.Request, web.Application], rec: Recorder
    ) -> None:
        self.bus, self.client, self.rec = bus, client, rec
        self.relay = client.app[RELAY]

    async def admit(self, session: str, version: int = 1) -> None:
        await admit(self.bus, GW, session, version)

    async def messages(self, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        return await self.client.post("/v1/messages", json=body, headers=headers or {})


async def make_env(hold_timeout_s: float) -> AsyncIterator[Env]:
    bus = FakeBus()
    rec = Recorder()
    await bus.subscribe(subjects.session_events(), "rec", decode_session_event, rec.handler)
    node = TestServer(create_simnode(SimNodeConfig(node_id="n1", time_scale=100.0)))
    await node.start_server()
    settings = Settings(gateway_id=GW, hold_timeout_s=hold_timeout_s, retry_after_s=2)
    app = create_app(settings, bus, node_urls={"n1": str(node.make_url("")).rstrip("/")})
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield Env(bus, client, rec)
    finally:
        await client.close()
        await node.close()
        await bus.drain()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async for e in make_env(10.0):
        yield e


@pytest.fixture
async def quick() -> AsyncIterator[Env]:
    async for e in make_env(0.05):
        yield e


def request(user_id: str | None = LEGACY_USER_ID, **extra: Any) -> dict[str, Any]:
    """A Claude-Code-shaped Messages request."""
    body: dict[str, Any] = {
        "model": "tao-sim",
        "max_tokens": 32000,
        "system": SYSTEM,
        "messages": [USER_TURN],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
        **extra,
    }
    if user_id is not None:
        body["metadata"] = {"user_id": user_id}
    return body


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


class TestNonStreaming:
    async def test_session_from_legacy_user_id_and_usage_reported(self, env: Env) -> None:
        """The legacy user_id names the session (harness claude-code); the Anthropic answer
        passes through; usage, finish reason and timing are reported."""
        await env.admit(SID)
        resp = await env.messages(request())
        assert resp.status == 200
        answer = await resp.json()
        assert answer["type"] == "message" and answer["stop_reason"] == "end_turn"
        assert answer["content"][0]["type"] == "text"
        [req] = await env.rec.next(SessionRequest)
        assert (req.session_id, req.harness, req.max_tokens) == (SID, "claude-code", 32000)
        [done] = await env.rec.next(SessionResponse)
        usage = answer["usage"]
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert done.usage.prompt_tokens == prompt > 0
        assert done.usage.completion_tokens == usage["output_tokens"] == 64
        assert (done.finish_reason, done.error, done.block_keys) == ("stop", None, None)

    async def test_tool_use_second_turn_hits_cache(self, env: Env) -> None:
        """A scripted tool_use is reported as a tool call; echoing it back with its result
        (as Claude Code does) makes the next turn reuse the cached prefix."""
        await env.admit(SID)
        script = {"output_tokens": 30, "tool_call": BASH}
        first = await (await env.messages(request(tao_script=script))).json()
        assert first["stop_reason"] == "tool_use"
        use = first["content"][-1]
        assert (use["type"], use["name"], use["input"]) == ("tool_use", "Bash", BASH["arguments"])
        [done] = await env.rec.next(SessionResponse)
        assert done.finish_reason == "tool_calls"
        args = len(json.dumps(BASH["arguments"], separators=(",", ":")))
        assert done.tool_calls == [ToolCallInfo(id=use["id"], name="Bash", arguments_bytes=args)]
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": "3 passed"}
        turn2 = [
            USER_TURN,
            {"role": "assistant", "content": first["content"]},
            {"role": "user", "content": [result]},
        ]
        second = await (await env.messages(request(messages=turn2, max_tokens=8))).json()
        prompt1 = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
        assert second["usage"]["cache_read_input_tokens"] >= (prompt1 + 30 - 1) // 16 * 16 > 0
        [_, done2] = await env.rec.next(SessionResponse, 2)
        assert done2.usage.cached_tokens == second["usage"]["cache_read_input_tokens"]
        assert done2.finish_reason == "length"


class TestStreaming:
    async def test_stream_passes_through_and_reports_tool_use(self, env: Env) -> None:
        """The JSON user_id names the session; the event stream reaches the client as the
        node sent it; tool_use, stop reason and usage are reported."""
        await env.admit(SID)
        script = {"output_tokens": 24, "tool_call": BASH}
        resp = await env.messages(request(JSON_USER_ID, stream=True, tao_script=script))
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await resp.read())
        kinds = [k for k, _ in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        starts = [e["content_block"]["type"] for k, e in events if k == "content_block_start"]
        assert starts == ["text", "tool_use"]
        delta = events[-2][1]
        assert delta["delta"]["stop_reason"] == "tool_use"
        [done] = await env.rec.next(SessionResponse)
        assert done.session_id == SID and done.error is None and done.ttft_s is not None
        assert done.finish_reason == "tool_calls" and [c.name for c in done.tool_calls] == ["Bash"]
        usage = delta["usage"]
        assert done.usage.prompt_tokens == usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert done.usage.completion_tokens == 24

    async def test_header_names_session_without_claude_metadata(self, env: Env) -> None:
        """Without Claude Code's metadata the X-Session-ID header names the session."""
        await env.admit("plain")
        body = request(user_id="alice@example.com", stream=True, max_tokens=5)
        resp = await env.messages(body, headers={"X-Session-ID": "plain"})
        assert sse_events(await resp.read())[-1][0] == "message_stop"
        [req] = await env.rec.next(SessionRequest)
        assert (req.session_id, req.harness) == ("plain", None)
        [done] = await env.rec.next(SessionResponse)
        assert done.finish_reason == "length" and done.usage.completion_tokens == 5


class TestHolding:
    async def test_held_until_admitted(self, env: Env) -> None:
        """A request of a session not yet admitted waits for its placement."""
        task = asyncio.create_task(env.messages(request(max_tokens=3)))
        [req] = await env.rec.next(SessionRequest)
        assert req.session_id == SID and env.relay.holds.held() == 1
        await env.admit(SID)
        resp = await task
        assert resp.status == 200 and (await resp.json())["usage"]["output_tokens"] == 3

    async def test_hold_timeout_is_503_in_anthropic_format(self, quick: Env) -> None:
        """A hold past the limit: 503, Retry-After, an Anthropic overloaded error, a cancel."""
        resp = await quick.messages(request())
        assert resp.status == 503 and resp.headers["Retry-After"] == "2"
        body = await resp.json()
        assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
        [cancel] = await quick.rec.next(SessionCancel)
        assert (cancel.session_id, cancel.reason) == (SID, "wait_timeout")

    async def test_client_disconnect_releases_hold(self, env: Env) -> None:
        """A client that leaves while held releases the hold; the gateway cancels."""
        task = asyncio.create_task(env.messages(request()))
        await env.rec.next(SessionRequest)
        task.cancel()
        [cancel] = await env.rec.next(SessionCancel)
        assert (cancel.session_id, cancel.reason) == (SID, "client_closed")
        assert env.relay.holds.held() == 0


class TestBadBodies:
    @pytest.mark.parametrize(
        ("body", "needle"),
        [
            ({"model": "tao-sim", "messages": [USER_TURN]}, "max_tokens"),
            ({"model": "tao-sim", "max_tokens": 5, "messages": []}, "messages"),
            ({"max_tokens": 5, "messages": [USER_TURN]}, "model"),
        ],
    )
    async def test_refused_with_a_clear_anthropic_error(
        self, env: Env, body: dict[str, Any], needle: str
    ) -> None:
        """An unservable body is answered 400 at once, naming the field, in Anthropic's shape."""
        resp = await env.messages(body)
        assert resp.status == 400
        error = await resp.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert needle in error["error"]["message"]
        assert env.relay.holds.held() == 0

    async def test_not_json_is_400(self, env: Env) -> None:
        """A body that is not JSON is refused the same way."""
        resp = await env.client.post("/v1/messages", data=b"{nope")
        assert resp.status == 400 and (await resp.json())["type"] == "error"

    async def test_sim_node_refuses_bad_blocks(self, env: Env) -> None:
        """The sim node answers a malformed block with an Anthropic 400 naming the message."""
        await env.admit(SID)
        bad = {"role": "user", "content": [{"type": "tool_use", "input": {}}]}
        resp = await env.messages(request(messages=[bad]))
        assert resp.status == 400
        body = orjson.loads(await resp.read())
        assert "messages[0].content[0]" in body["error"]["message"]
