"""Sim node HTTP API through aiohttp's test server: OpenAI shapes, SSE, scripts, errors."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import ClientSession, ClientTimeout
from aiohttp.test_utils import TestClient, TestServer

from services.simnode import NODE_KEY, SimNodeConfig, create_app
from services.simnode.runner import EngineRunner
from shared.core.engine import PROFILES, Engine, EngineRequest

MSGS = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Go"}]


@pytest.fixture
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    app = create_app(SimNodeConfig(node_id="n1", time_scale=1000.0, model="m1"))
    async with TestClient(TestServer(app)) as c:
        yield c


async def sse_events(body: bytes) -> list[str]:
    text = body.decode()
    assert text.endswith("\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


class TestChat:
    """Chat completions: usage, cached tokens on the next turn, determinism."""

    async def test_round_trip_and_cache_hit(self, client: TestClient[Any, Any]) -> None:
        """A second turn that extends the first reports cached_tokens > 0."""
        r1 = await client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 40})
        assert r1.status == 200
        b1 = await r1.json()
        msg = b1["choices"][0]["message"]
        assert b1["object"] == "chat.completion" and b1["model"] == "m1"
        assert b1["choices"][0]["finish_reason"] == "length"
        u1 = b1["usage"]
        assert u1["completion_tokens"] == 40
        assert u1["total_tokens"] == u1["prompt_tokens"] + 40
        assert u1["prompt_tokens_details"]["cached_tokens"] == 0
        turn2 = [*MSGS, msg, {"role": "user", "content": "continue " * 30}]
        r2 = await client.post("/v1/chat/completions", json={"messages": turn2, "max_tokens": 5})
        u2 = (await r2.json())["usage"]
        expected = (u1["prompt_tokens"] + 40 - 1) // 16 * 16
        assert u2["prompt_tokens_details"]["cached_tokens"] == expected > 0

    async def test_default_length_and_stop(self, client: TestClient[Any, Any]) -> None:
        """Without max_tokens or a script the reply has 64 tokens and finish_reason stop."""
        r = await client.post("/v1/chat/completions", json={"messages": MSGS})
        body = await r.json()
        assert body["usage"]["completion_tokens"] == 64
        assert body["choices"][0]["finish_reason"] == "stop"
        assert len(body["choices"][0]["message"]["content"].split()) == 64

    async def test_streaming_chunks(self, client: TestClient[Any, Any]) -> None:
        """SSE: role chunk, content chunks, finish chunk, usage chunk, then [DONE]."""
        r = await client.post(
            "/v1/chat/completions",
            json={
                "messages": MSGS,
                "max_tokens": 20,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = await sse_events(await r.read())
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert len(text.split()) == 20
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20

    async def test_scripted_tool_call(self, client: TestClient[Any, Any]) -> None:
        """tao_script with a tool_call answers finish_reason tool_calls and the call itself."""
        script = {"output_tokens": 30, "tool_call": {"name": "bash", "arguments": {"cmd": "ls"}}}
        r = await client.post(
            "/v1/chat/completions", json={"messages": MSGS, "extra_body": {"tao_script": script}}
        )
        body = await r.json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"]["name"] == "bash"
        assert json.loads(call["function"]["arguments"]) == {"cmd": "ls"}
        assert body["usage"]["completion_tokens"] == 30

    async def test_scripted_tool_call_streamed(self, client: TestClient[Any, Any]) -> None:
        """Streaming a tool call sends delta.tool_calls chunks and finish_reason tool_calls."""
        script = {"output_tokens": 12, "tool_call": {"name": "read", "arguments": {"p": "a.py"}}}
        r = await client.post(
            "/v1/chat/completions",
            json={"messages": MSGS, "stream": True, "tao_script": script},
        )
        chunks = [json.loads(e) for e in (await sse_events(await r.read()))[:-1]]
        calls = [
            c["choices"][0]["delta"]["tool_calls"][0]
            for c in chunks
            if "tool_calls" in c["choices"][0]["delta"]
        ]
        assert calls[0]["function"]["name"] == "read" and calls[0]["id"].startswith("call_")
        args = "".join(c["function"]["arguments"] for c in calls)
        assert json.loads(args) == {"p": "a.py"}
        assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    async def test_completions_endpoint(self, client: TestClient[Any, Any]) -> None:
        """/v1/completions takes a string prompt and returns text with usage."""
        r = await client.post("/v1/completions", json={"prompt": "def main():", "max_tokens": 7})
        body = await r.json()
        assert body["object"] == "text_completion"
        assert len(body["choices"][0]["text"].split()) == 7
        assert body["usage"]["prompt_tokens"] == 5


class TestErrors:
    """Bad input gets a 400 with an OpenAI-style error body, never a traceback."""

    @pytest.mark.parametrize(
        ("payload", "match"),
        [
            (b"{not json", "valid JSON"),
            (b"[1, 2]", "JSON object"),
            (b"{}", "messages"),
            (b'{"messages": []}', "messages"),
            (b'{"messages": [{"role": "x", "content": "a"}]}', "role"),
            (b'{"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}', "max_tokens"),
            (
                b'{"messages": [{"role": "user", "content": "a"}], "tao_script": {}}',
                "output_tokens",
            ),
        ],
    )
    async def test_bad_chat(self, client: TestClient[Any, Any], payload: bytes, match: str) -> None:
        """Each malformed body is refused with a message naming the problem."""
        r = await client.post("/v1/chat/completions", data=payload)
        assert r.status == 400
        err = (await r.json())["error"]
        assert match in err["message"] and err["code"] == 400 and err["type"]

    async def test_too_long_prompt(self) -> None:
        """A prompt larger than the KV cache is a 400, not a crash."""
        app = create_app(SimNodeConfig(node_id="n", kv_tokens=64, time_scale=1000.0))
        async with TestClient(TestServer(app)) as c:
            r = await c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "a " * 100}]}
            )
            assert r.status == 400
            assert "never fit" in (await r.json())["error"]["message"]

    async def test_unknown_route_is_json(self, client: TestClient[Any, Any]) -> None:
        """An unknown path answers a JSON 404 error."""
        r = await client.get("/v1/nope")
        assert r.status == 404
        assert (await r.json())["error"]["code"] == 404


class TestOps:
    """Health, models and metrics endpoints."""

    async def test_health_and_models(self, client: TestClient[Any, Any]) -> None:
        """/health, /healthz answer 200 and /v1/models lists the served model."""
        assert (await client.get("/health")).status == 200
        assert (await client.get("/healthz")).status == 200
        models = await (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["m1"]

    async def test_metrics_names_and_values(self, client: TestClient[Any, Any]) -> None:
        """vLLM metric names with model_name labels; counters move after a cached second turn."""
        r1 = await client.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 40})
        msg = (await r1.json())["choices"][0]["message"]
        await client.post(
            "/v1/chat/completions",
            json={"messages": [*MSGS, msg, {"role": "user", "content": "x"}], "max_tokens": 1},
        )
        text = await (await client.get("/metrics")).text()
        samples: dict[str, tuple[str, float]] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line:
                continue
            head, value = line.rsplit(" ", 1)
            name, _, labels = head.partition("{")
            samples[name] = (labels.rstrip("}"), float(value))
        for name in (
            "vllm:kv_cache_usage_perc",
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:prefix_cache_queries_total",
            "vllm:prefix_cache_hits_total",
            "vllm:cache_config_info",
        ):
            assert name in samples, name
            assert 'model_name="m1"' in samples[name][0]
        assert samples["vllm:prefix_cache_hits_total"][1] > 0
        assert (
            samples["vllm:prefix_cache_queries_total"][1]
            > samples["vllm:prefix_cache_hits_total"][1]
        )
        info = samples["vllm:cache_config_info"]
        assert 'block_size="16"' in info[0] and 'num_gpu_blocks="16384"' in info[0]
        assert info[1] == 1.0
        assert "# TYPE vllm:prefix_cache_hits_total counter" in text
        # as vLLM 0.32's page: the process start time, which tells telemetry of a restart
        assert 0 < samples["process_start_time_seconds"][1] <= time.time()


class TestLifecycle:
    """Disconnects free blocks; the time scale speeds up virtual time."""

    async def test_disconnect_aborts_and_frees_blocks(self) -> None:
        """Closing a streaming connection mid-reply aborts the request and frees its blocks."""
        app = create_app(SimNodeConfig(node_id="n", time_scale=1.0))
        async with TestServer(app) as server:
            node = app[NODE_KEY]
            async with ClientSession() as session:
                resp = await session.post(
                    server.make_url("/v1/chat/completions"),
                    json={"messages": MSGS, "max_tokens": 5000, "stream": True},
                )
                await resp.content.readuntil(b"\n\n")
                assert node.runner.engine.running == 1
                assert node.runner.engine.kv_usage > 0
                resp.close()
            await asyncio.wait_for(node.runner.aborted.wait(), 10)
            assert node.runner.engine.running == 0 and node.runner.engine.kv_usage == 0.0
            assert node.runner.requests_aborted == 1

    async def test_disconnect_unary_aborts(self) -> None:
        """A non-streaming client that gives up (timeout) gets its request aborted too."""
        app = create_app(SimNodeConfig(node_id="n", time_scale=1.0))
        async with TestServer(app) as server:
            node = app[NODE_KEY]
            async with ClientSession(timeout=ClientTimeout(total=0.3)) as session:
                with pytest.raises(asyncio.TimeoutError):
                    await session.post(
                        server.make_url("/v1/chat/completions"),
                        json={"messages": MSGS, "max_tokens": 5000},
                    )
            await asyncio.wait_for(node.runner.aborted.wait(), 10)
            assert node.runner.engine.running == 0 and node.runner.engine.kv_usage == 0.0

    async def test_time_scale_with_fake_clock(self) -> None:
        """Virtual time runs time_scale times faster than the wall clock, and so do sleeps."""
        wall = [100.0]
        for scale in (1.0, 50.0):
            engine = Engine("n", PROFILES["qwen3-32b-tp2"])
            runner = EngineRunner(engine, time_scale=scale, clock=lambda: wall[0])
            wall[0] += 2.0
            assert runner.vnow() == pytest.approx(2.0 * scale)
            runner.submit(EngineRequest("r", "s", list(range(1000)), 10), streaming=False)
            sleep = runner._tick()
            nxt = engine.next_event_time()
            assert sleep is not None and nxt is not None
            assert sleep == pytest.approx((nxt - runner.vnow()) / scale)

    async def test_fast_time_scale_completes_long_reply(self) -> None:
        """At time_scale 10000 a reply of ~15 virtual seconds comes back promptly."""
        app = create_app(SimNodeConfig(node_id="n", time_scale=10_000.0))
        async with TestClient(TestServer(app)) as c:
            node = c.app[NODE_KEY]
            t0 = node.runner.vnow()
            r = await asyncio.wait_for(
                c.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 1000}), 30
            )
            assert (await r.json())["usage"]["completion_tokens"] == 1000
            assert node.runner.vnow() - t0 >= 1000 * 0.015
