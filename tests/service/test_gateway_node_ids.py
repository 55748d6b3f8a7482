"""Token ids through the gateway: asked of the node, keyed into blocks, hidden from the client,
and a clean fallback for nodes that refuse the field or return no ids.

The sim node answers ``return_token_ids`` as vLLM does, with the ids its engine caches, so the
reported block keys must equal :func:`chain_keys` of its own tokenisation. Stub nodes stand in
for an older vLLM (or a proxy) that refuses the field, and for one that ignores it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import RELAY, create_app
from services.simnode import tokenizer as tok
from services.simnode.app import SimNodeConfig
from services.simnode.app import create_app as create_simnode
from shared.contracts import NodeStatus, SessionResponse
from shared.core.blockkeys import chain_keys
from shared.infra import FakeBus, NodeSpec, Settings
from tests.service.gateway_util import admit, reported

GW = "gwids"
BLOCK = 16
MESSAGES = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "List every file in the repository and then run the tests " * 3},
]


class Env:
    def __init__(
        self, bus: FakeBus, client: TestClient[web.Request, web.Application], node_url: str
    ) -> None:
        self.bus, self.client, self.node_url = bus, client, node_url
        self.relay = client.app[RELAY]

    async def describe_node(self, block_size: int = BLOCK) -> None:
        """Publish the node status telemetry would: URL, model and block size."""
        status = NodeStatus(
            node_id="n1", ts=1.0, models=["tao-sim"], url=self.node_url, block_size=block_size
        )
        await self.bus.publish_msg(status)
        await self.bus.settle()

    async def post(self, path: str, body: dict[str, Any], session: str = "s1") -> Any:
        return await self.client.post(path, json=body, headers={"X-Session-ID": session})

    async def last_report(self) -> SessionResponse:
        await self.relay.flush()
        return reported(self.bus)[-1]


async def make_env(node_app: web.Application, *, ids_off: bool = False) -> AsyncIterator[Env]:
    bus = FakeBus()
    node = TestServer(node_app)
    await node.start_server()
    url = str(node.make_url("")).rstrip("/")
    nodes = (NodeSpec("n1", url, return_token_ids=not ids_off),)
    settings = Settings(gateway_id=GW, hold_timeout_s=10, nodes=nodes)
    app = create_app(settings, bus)
    client = TestClient(TestServer(app))
    await client.start_server()
    await admit(bus, GW)
    try:
        yield Env(bus, client, url)
    finally:
        await client.close()
        await node.close()
        await bus.drain()


@pytest.fixture
async def sim() -> AsyncIterator[Env]:
    async for env in make_env(create_simnode(SimNodeConfig(node_id="n1", time_scale=100.0))):
        yield env


def data_chunks(raw: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]


class TestKeysFromSimNode:
    async def test_chat_keys_equal_chain_of_the_nodes_tokens(self, sim: Env) -> None:
        """Non-streaming chat: keys over the node's prompt ids (the reply is rendered again in
        the next prompt, so its blocks are not credited); the client sees no ids."""
        await sim.describe_node()
        body = {"model": "tao-sim", "messages": MESSAGES, "max_tokens": 21}
        resp = await sim.post("/v1/chat/completions", body)
        assert resp.status == 200
        answer = await resp.json()
        assert answer.get("prompt_token_ids") is None
        assert answer["choices"][0].get("token_ids") is None
        output = tok.encode(answer["choices"][0]["message"]["content"])
        prompt = tok.render_messages(MESSAGES)
        done = await sim.last_report()
        assert done.block_size == BLOCK and done.error is None
        assert done.model == "tao-sim"  # the scope the tools service counts its keys in
        assert resp.headers["X-TAO-Node"] == done.node_id  # the serving node, named
        assert len(output) == 21
        assert done.block_keys == chain_keys(prompt, BLOCK)
        assert len(done.block_keys) == len(prompt) // BLOCK > 0
        assert done.usage.prompt_tokens == len(prompt)

    async def test_streamed_tool_call_keys_and_clean_stream(self, sim: Env) -> None:
        """Streaming chat with a tool call: the keys cover the prompt; the client's stream
        carries no id fields and still parses into the same text and call."""
        await sim.describe_node()
        script = {"output_tokens": 40, "tool_call": {"name": "bash", "arguments": {"cmd": "ls"}}}
        body = {"model": "tao-sim", "messages": MESSAGES, "stream": True, "tao_script": script}
        resp = await sim.post("/v1/chat/completions", body)
        raw = await resp.read()
        assert b"token_ids" not in raw and raw.endswith(b"data: [DONE]\n\n")
        assert resp.headers["X-TAO-Node"]  # streamed answers name their node too
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in data_chunks(raw))
        output = tok.encode(text) + tok.tool_call_ids("bash", '{"cmd":"ls"}')
        assert len(output) == 40
        done = await sim.last_report()
        assert done.finish_reason == "tool_calls" and [c.name for c in done.tool_calls] == ["bash"]
        assert done.block_keys == chain_keys(tok.render_messages(MESSAGES), BLOCK)

    async def test_client_that_asked_gets_the_ids(self, sim: Env) -> None:
        """A client sending return_token_ids itself sees the node's ids, stream and not."""
        await sim.describe_node()
        prompt = tok.render_messages(MESSAGES)
        body = {"model": "tao-sim", "messages": MESSAGES, "max_tokens": 5, "return_token_ids": True}
        answer = await (await sim.post("/v1/chat/completions", body)).json()
        assert answer["prompt_token_ids"] == prompt
        assert answer["choices"][0]["token_ids"] == tok.encode(
            answer["choices"][0]["message"]["content"]
        )
        raw = await (await sim.post("/v1/chat/completions", {**body, "stream": True})).read()
        chunks = data_chunks(raw)
        assert chunks[0]["prompt_token_ids"] == prompt
        streamed = [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])]
        assert len(streamed) == 5
        done = await sim.last_report()
        assert done.block_keys == chain_keys(prompt, BLOCK)

    async def test_completions_keys(self, sim: Env) -> None:
        """Completions carry both id lists on the choice; keys cover the prompt's."""
        await sim.describe_node()
        text = "the quick brown fox jumps over the lazy dog " * 4
        for stream in (False, True):
            body = {"model": "tao-sim", "prompt": text, "max_tokens": 12, "stream": stream}
            raw = await (await sim.post("/v1/completions", body)).read()
            if stream:
                assert b"token_ids" not in raw
                out_text = " ".join(c["choices"][0]["text"].strip() for c in data_chunks(raw))
            else:
                choice = orjson.loads(raw)["choices"][0]
                assert choice["token_ids"] is None and choice["prompt_token_ids"] is None
                out_text = choice["text"]
            done = await sim.last_report()
            assert len(tok.encode(out_text)) == 12
            assert done.block_keys == chain_keys(tok.encode(text), BLOCK)

    async def test_unknown_block_size_gives_no_keys(self, sim: Env) -> None:
        """Before any node status the block size is unknown: no keys, usage still reported."""
        body = {"model": "tao-sim", "messages": MESSAGES, "max_tokens": 4}
        assert (await sim.post("/v1/chat/completions", body)).status == 200
        done = await sim.last_report()
        assert done.block_keys is None and done.block_size is None
        assert done.usage.completion_tokens == 4


class StubNode:
    """An OpenAI node that refuses ``return_token_ids`` (``refuse``) or ignores it."""

    def __init__(self, *, refuse: bool) -> None:
        self.refuse = refuse
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if self.refuse and "return_token_ids" in body:
            detail = "[{'type': 'extra_forbidden', 'loc': ('body', 'return_token_ids'), "
            detail += "'msg': 'Extra inputs are not permitted'}]"
            return web.json_response({"object": "error", "message": detail}, status=400)
        usage = {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"id": "c", "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for delta, finish in (({"content": "ok"}, None), ({}, "stop")):
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            await resp.write(b"data: " + orjson.dumps({"choices": [choice]}) + b"\n\n")
        final = {"choices": [], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(final) + b"\n\ndata: [DONE]\n\n")
        return resp


@pytest.fixture
async def refusing() -> AsyncIterator[tuple[Env, StubNode]]:
    node = StubNode(refuse=True)
    async for env in make_env(node.app()):
        yield env, node


@pytest.fixture
async def ignoring() -> AsyncIterator[tuple[Env, StubNode]]:
    node = StubNode(refuse=False)
    async for env in make_env(node.app()):
        yield env, node


@pytest.fixture
async def disabled() -> AsyncIterator[tuple[Env, StubNode]]:
    node = StubNode(refuse=True)
    async for env in make_env(node.app(), ids_off=True):
        yield env, node


CHAT = {"model": "tao-sim", "messages": [{"role": "user", "content": "hi"}]}


class TestFallback:
    @pytest.mark.parametrize("stream", [False, True])
    async def test_refusing_node_retried_once_then_never_asked(
        self, refusing: tuple[Env, StubNode], stream: bool
    ) -> None:
        """A 400 naming the field: the request goes again without it and succeeds; the node is
        not asked again; the report has no keys and no error."""
        env, node = refusing
        await env.describe_node()
        first = await env.post("/v1/chat/completions", {**CHAT, "stream": stream})
        assert first.status == 200
        assert b"ok" in await first.read()
        assert [("return_token_ids" in b) for b in node.bodies] == [True, False]
        done = await env.last_report()
        assert done.error is None and done.block_keys is None

    async def test_refusal_remembered(self, refusing: tuple[Env, StubNode]) -> None:
        """After one refusal the node gets plain requests only."""
        env, node = refusing
        await env.describe_node()
        for _ in range(2):
            assert (await env.post("/v1/chat/completions", CHAT)).status == 200
        assert [("return_token_ids" in b) for b in node.bodies] == [True, False, False]
        assert env.relay.token_ids.ask("n1") is False

    async def test_node_ignoring_the_field_gives_no_keys(
        self, ignoring: tuple[Env, StubNode]
    ) -> None:
        """A node that takes the field but returns no ids: one request, no keys, usage kept."""
        env, node = ignoring
        await env.describe_node()
        resp = await env.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert (await resp.read()).endswith(b"data: [DONE]\n\n")
        assert [b.get("return_token_ids") for b in node.bodies] == [True]
        done = await env.last_report()
        assert done.block_keys is None and done.error is None
        assert done.usage.prompt_tokens == 40

    async def test_disabled_node_never_asked(self, disabled: tuple[Env, StubNode]) -> None:
        """A node configured with ``return_token_ids = false`` never gets the field."""
        env, node = disabled
        await env.describe_node()
        replies = await asyncio.gather(*(env.post("/v1/chat/completions", CHAT) for _ in range(2)))
        assert [r.status for r in replies] == [200, 200]
        assert [("return_token_ids" in b) for b in node.bodies] == [False, False]
