"""The real ``openai`` client against a sim node listening on a real TCP port."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web

from services.simnode import SimNodeConfig, create_app
from shared.infra.embedded import free_port


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    app = create_app(SimNodeConfig(node_id="oa", time_scale=1000.0, model="qwen-sim"))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


class TestOpenAIClient:
    """Chat round trips through the official client, unary and streaming."""

    async def test_two_turns_with_streaming(self, base_url: str) -> None:
        """Turn 1 unary, turn 2 streamed with usage: the client parses both, turn 2 hits cache."""
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        messages: list[Any] = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "List the files."},
        ]
        r1 = await client.chat.completions.create(
            model="qwen-sim",
            messages=messages,
            max_tokens=48,
        )
        assert r1.usage is not None and r1.usage.completion_tokens == 48
        content = r1.choices[0].message.content
        assert content is not None and len(content.split()) == 48
        messages += [
            {"role": "assistant", "content": content},
            {"role": "user", "content": "Now the tests."},
        ]
        stream = await client.chat.completions.create(
            model="qwen-sim",
            messages=messages,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        text = ""
        usage = None
        finish = None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert len(text.split()) == 16 and finish == "length"
        assert usage is not None and usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached is not None and cached >= (r1.usage.prompt_tokens + 47) // 16 * 16 > 0
        await client.close()

    async def test_scripted_tool_call_via_extra_body(self, base_url: str) -> None:
        """extra_body tao_script yields a parsed tool call in the client's types."""
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        r = await client.chat.completions.create(
            model="qwen-sim",
            messages=[{"role": "user", "content": "run ls"}],
            extra_body={
                "tao_script": {
                    "output_tokens": 20,
                    "tool_call": {"name": "bash", "arguments": {"c": "ls"}},
                }
            },
        )
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls is not None
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "bash"
        assert json.loads(call.function.arguments) == {"c": "ls"}
        await client.close()

    async def test_bad_request_is_client_error(self, base_url: str) -> None:
        """A 400 surfaces as openai.BadRequestError with the node's message."""
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="messages"):
            await client.chat.completions.create(model="qwen-sim", messages=[])
        await client.close()


class TestCommandLine:
    """Bad command lines exit 2 with one line on stderr."""

    @pytest.mark.parametrize(
        ("args", "match"),
        [
            ([], "required"),
            (["--port", "x", "--node-id", "a"], "--port"),
            (["--port", "0", "--node-id", "a"], "--port"),
            (["--port", "8000", "--node-id", "a", "--time-scale", "0"], "--time-scale"),
            (["--port", "8000", "--node-id", "a", "--profile", "nope"], "--profile"),
            (["--port", "8000", "--node-id", "a", "--kv-tokens", "3"], "kv_tokens"),
        ],
    )
    def test_bad_args(self, args: list[str], match: str) -> None:
        """Each bad argument is named in a single stderr line, exit status 2."""
        out = subprocess.run(
            [sys.executable, "-m", "services.simnode", *args], capture_output=True, text=True
        )
        assert out.returncode == 2
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and match in lines[0]
