"""A node that breaks off a stream: the client gets an error event in its own API's format."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest
from aiohttp import web

from shared.contracts.session import SessionResponse
from tests.service.test_gateway_node_ids import Env, make_env, reported


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


async def _complete_then_linger(request: web.Request) -> web.StreamResponse:
    """A whole answer (text, usage, ``[DONE]``), then the connection held open for a while,
    as a node whose last bytes are still in flight when the client has all it needs."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
    usage = {
        "id": "x",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await resp.write(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
    await asyncio.sleep(2.0)
    await resp.write_eof()
    return resp


@pytest.fixture
async def lingering() -> AsyncIterator[Env]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _complete_then_linger)
    async for e in make_env(app, ids_off=True):
        yield e


async def test_a_client_that_closes_after_done_is_served_not_closed(lingering: Env) -> None:
    """The OpenAI client closes the stream as soon as it reads ``[DONE]``, which cancels the
    handler: that request was served, so it counts as ``ok`` (not ``client_closed``) and its
    report carries no error."""
    body = {"model": "tao-sim", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    resp = await lingering.post("/v1/chat/completions", body)
    async for line in resp.content:
        if line.strip() == b"data: [DONE]":
            break
    resp.close()  # drop the connection, as the client does
    requests = lingering.relay.metrics.requests
    for _ in range(100):  # the handler ends (cancelled) once the gateway sees the close
        counted = sum(requests.get(endpoint="chat", outcome=o) for o in ("ok", "client_closed"))
        if counted:
            break
        await asyncio.sleep(0.05)
    assert requests.get(endpoint="chat", outcome="ok") == 1
    assert requests.get(endpoint="chat", outcome="client_closed") == 0
    await lingering.relay.flush()
    report: SessionResponse = reported(lingering.bus)[-1]
    assert report.error is None and report.usage.completion_tokens == 1
