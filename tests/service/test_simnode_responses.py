"""The sim node's Responses API (``POST /v1/responses``), through the stock ``openai`` client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp import web

from services.simnode import SimNodeConfig, create_app
from services.simnode import responses as resp_api
from services.simnode.tokenizer import TemplateError
from shared.infra.embedded import free_port


@pytest.fixture
async def client() -> AsyncIterator[openai.AsyncOpenAI]:
    app = create_app(SimNodeConfig(node_id="rs", time_scale=1000.0, model="qwen-sim"))
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x") as c:
            yield c
    finally:
        await runner.cleanup()


CALL: dict[str, Any] = {"tao_script": {"output_tokens": 40, "tool_call": {"name": "shell"}}}
CALL["tao_script"]["tool_call"]["arguments"] = {"command": ["ls"]}


class TestResponses:
    async def test_text_answer_with_usage(self, client: openai.AsyncOpenAI) -> None:
        """A string input gets a completed response: one output_text message and usage."""
        r = await client.responses.create(
            model="qwen-sim", instructions="be brief", input="hello", max_output_tokens=5
        )
        assert r.id.startswith("resp-") and r.status == "incomplete"
        assert r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
        assert r.output_text and r.usage is not None and r.usage.output_tokens == 5

    async def test_second_turn_hits_the_cache(self, client: openai.AsyncOpenAI) -> None:
        """Turn 2 re-sends turn 1 and its answer as input items: the node's prefix cache holds
        them (cached_tokens > 0), as chat's second turn does."""
        first = await client.responses.create(
            model="qwen-sim", input="fix the bug", extra_body=CALL
        )
        [call] = [o for o in first.output if o.type == "function_call"]
        assert (call.name, call.arguments) == ("shell", '{"command":["ls"]}')
        history: list[Any] = [{"role": "user", "content": "fix the bug"}]
        history += [o.model_dump(exclude_none=True) for o in first.output]
        history.append({"type": "function_call_output", "call_id": call.call_id, "output": "ok"})
        second = await client.responses.create(model="qwen-sim", input=history)
        assert second.usage is not None
        assert second.usage.input_tokens_details.cached_tokens > 0

    async def test_stream_events(self, client: openai.AsyncOpenAI) -> None:
        """A stream sends created … deltas … a function call … completed, with the usage."""
        kinds = []
        final = None
        stream = await client.responses.create(
            model="qwen-sim", input="hi", stream=True, extra_body=CALL
        )
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.completed":
                final = event.response
        assert kinds[:2] == ["response.created", "response.in_progress"]
        assert "response.output_text.delta" in kinds
        assert "response.function_call_arguments.done" in kinds
        assert kinds[-1] == "response.completed"
        assert final is not None and final.usage is not None and final.usage.output_tokens == 40

    async def test_bad_input_is_400_naming_it(self, client: openai.AsyncOpenAI) -> None:
        """An input the node cannot read is a 400 naming the item."""
        with pytest.raises(openai.BadRequestError, match=r"input\[0\]"):
            await client.responses.create(model="qwen-sim", input=[{"role": "tool"}])  # type: ignore[list-item]


def test_items_become_chat_messages() -> None:
    """Instructions, messages, calls and their outputs map to chat messages in order."""
    body = {
        "instructions": "sys",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "reasoning", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "done"},
        ],
    }
    out = resp_api.chat_messages(body)
    assert [(m["role"], m["content"]) for m in out] == [
        ("system", "sys"),
        ("user", "go"),
        ("assistant", "ok"),
        ("tool", "done"),
    ]
    assert out[2]["tool_calls"][0]["function"]["name"] == "shell"


def test_unreadable_item_is_named() -> None:
    with pytest.raises(TemplateError, match=r"input\[0\]\.role"):
        resp_api.chat_messages({"input": [{"role": "tool", "content": "x"}]})
