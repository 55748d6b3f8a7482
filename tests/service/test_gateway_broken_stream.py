"""A node that breaks off a stream: the client gets an error event in its own API's format."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from tests.service.test_gateway_node_ids import Env, make_env


async def _breaks_off(request: web.Request) -> web.StreamResponse:
    """Start an event stream, send one event, then drop the connection mid-stream."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
    assert request.transport is not None
    request.transport.close()
    return resp


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _breaks_off)
    app.router.add_post("/v1/messages", _breaks_off)
    async for e in make_env(app, ids_off=True):
        yield e


async def test_messages_stream_ends_with_an_anthropic_error_event(env: Env) -> None:
    body = {
        "model": "tao-sim",
        "max_tokens": 20,
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    resp = await env.post("/v1/messages", body)
    raw = await resp.read()
    last = raw.strip().split(b"\n\n")[-1]
    event, data = last.split(b"\n", 1)
    assert event == b"event: error"
    assert orjson.loads(data.removeprefix(b"data: ")) == {
        "type": "error",
        "error": {"type": "api_error", "message": "the model node broke off the stream"},
    }
    report = await env.last_report()
    assert report.error is not None and report.error.startswith("upstream_broken")


async def test_chat_stream_ends_with_an_openai_error_event(env: Env) -> None:
    body = {"model": "tao-sim", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    raw = await (await env.post("/v1/chat/completions", body)).read()
    last = raw.strip().split(b"\n\n")[-1]
    assert orjson.loads(last.removeprefix(b"data: "))["error"]["type"] == "upstream_error"
