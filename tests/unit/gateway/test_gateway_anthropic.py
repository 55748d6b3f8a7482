"""Unit tests of the gateway's Anthropic Messages API reading: ids, bodies, usage, streams."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from services.gateway.anthropic import (
    MessageStreamStats,
    claude_session_id,
    describe_messages,
    read_message_body,
    usage_of,
)
from services.gateway.apis import CHAT, MESSAGES
from services.gateway.requests import BadRequest
from shared.contracts import ToolCallInfo, Usage

SID = "54c1eb09-bc4c-4d2f-98eb-6d2ab2d5e2fe"
LEGACY = f"user_{'ab12' * 16}_account__session_{SID}"
LEGACY_ACCOUNT = f"user_{'ab12' * 16}_account_0e2b0a7c-1111-4222-8333-944445555666_session_{SID}"
JSON_ID = json.dumps({"device_id": "d" * 64, "account_uuid": "", "session_id": SID})


def U(prompt: int, completion: int, cached: int, total: int) -> Usage:
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, total_tokens=total
    )


def new_id() -> str:
    return "generated"


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + orjson.dumps({"type": kind, **obj}) + b"\n\n"


class TestClaudeSessionId:
    @pytest.mark.parametrize("user_id", [LEGACY, LEGACY_ACCOUNT, JSON_ID, f"  {JSON_ID} "])
    def test_both_formats_give_the_session_uuid(self, user_id: str) -> None:
        """The legacy string and the JSON string both yield the hook payloads' session id."""
        assert claude_session_id({"user_id": user_id}) == SID

    @pytest.mark.parametrize(
        "metadata",
        [
            {"user_id": "alice@example.com"},
            {"user_id": "{not json"},
            {"user_id": json.dumps({"device_id": "d"})},
            {"user_id": json.dumps({"session_id": "  "})},
            {"user_id": 42},
            {},
            None,
            "user_x",
        ],
    )
    def test_anything_else_names_no_session(self, metadata: object) -> None:
        """A plain user id, broken JSON or a missing session id gives no session."""
        assert claude_session_id(metadata) is None


class TestIdentity:
    def test_precedence_for_messages(self) -> None:
        """metadata.user_id, then X-Claude-Code-Session-Id, then X-Session-ID."""
        body = {"metadata": {"user_id": LEGACY}}
        headers = {"X-Claude-Code-Session-Id": "hdr", "X-Session-ID": "tao"}
        assert MESSAGES.identity(headers, body, new_id) == (SID, "metadata")
        assert MESSAGES.identity(headers, {}, new_id) == ("hdr", "claude_header")
        assert MESSAGES.identity({"X-Session-ID": "tao"}, {}, new_id) == ("tao", "header")
        assert MESSAGES.identity({}, {"metadata": {"user_id": "bob"}}, new_id) == (
            "generated",
            "generated",
        )

    def test_chat_ignores_claude_metadata(self) -> None:
        """Chat completions keep their own rules."""
        assert CHAT.identity({}, {"metadata": {"user_id": LEGACY}}, new_id)[1] == "generated"

    def test_harness_defaults_to_claude_code_for_its_ids(self) -> None:
        """Claude Code's own id implies the harness unless X-TAO-Harness names one."""
        assert MESSAGES.harness(None, "metadata") == "claude-code"
        assert MESSAGES.harness("mine", "claude_header") == "mine"
        assert MESSAGES.harness(None, "header") is None


class TestDescribeMessages:
    def test_reads_request_facts(self) -> None:
        """Model, stream, max_tokens, message count and a size estimate over all text."""
        body = {
            "model": "claude",
            "max_tokens": 512,
            "stream": True,
            "system": [{"type": "text", "text": "s" * 40}],
            "messages": [
                {"role": "user", "content": "u" * 40},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r" * 8}],
                },
            ],
        }
        info = describe_messages(body)
        assert (info.model, info.stream, info.max_tokens, info.messages_count) == (
            "claude",
            True,
            512,
            3,
        )
        assert info.prompt_tokens_estimate == -(-(40 + 40 + 4 + 2 + 8) // 4)

    @pytest.mark.parametrize(
        ("body", "needle"),
        [
            ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}, "'model'"),
            ({"model": "m", "messages": [], "max_tokens": 1}, "'messages'"),
            ({"model": "m", "messages": "hi", "max_tokens": 1}, "'messages'"),
            ({"model": "m", "messages": [{"role": "user"}], "max_tokens": 1}, r"messages\[0\]"),
            ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "'max_tokens'"),
            (
                {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
                "'max_tokens'",
            ),
        ],
    )
    def test_bad_bodies_name_the_field(self, body: dict[str, Any], needle: str) -> None:
        """An unservable Messages body raises BadRequest naming the field."""
        with pytest.raises(BadRequest, match=needle):
            describe_messages(body)


class TestUsage:
    @pytest.mark.parametrize(
        ("usage", "expected"),
        [
            # vLLM before PR #40912: the whole prompt in input_tokens, no cache fields
            ({"input_tokens": 100, "output_tokens": 7}, U(100, 7, 0, 107)),
            # vLLM since, and Anthropic: input after the cached part
            (
                {
                    "input_tokens": 36,
                    "cache_read_input_tokens": 64,
                    "cache_creation_input_tokens": 0,
                    "output_tokens": 7,
                },
                U(100, 7, 64, 107),
            ),
            (
                {
                    "input_tokens": 3,
                    "cache_read_input_tokens": 90,
                    "cache_creation_input_tokens": 7,
                    "output_tokens": 1,
                    "cache_creation": None,
                },
                U(100, 1, 90, 101),
            ),
        ],
    )
    def test_prompt_is_the_sum_of_input_fields(
        self, usage: dict[str, Any], expected: Usage
    ) -> None:
        """prompt = input + cache read + cache creation; cached = cache read."""
        assert usage_of(usage) == expected


class TestReadMessageBody:
    def test_tool_use_blocks_are_tool_calls(self) -> None:
        """A non-streaming answer gives usage, stop reason as finish reason, and tool calls."""
        raw = orjson.dumps(
            {
                "type": "message",
                "content": [
                    {"type": "text", "text": "listing"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"c": "ls"}},
                ],
                "stop_reason": "tool_use",
                "usage": {"input_tokens": 10, "output_tokens": 5},
            }
        )
        stats, out = read_message_body(raw)
        assert out is raw
        assert stats.finish_reason == "tool_calls"
        assert stats.tool_calls == [ToolCallInfo(id="toolu_1", name="Bash", arguments_bytes=10)]
        assert stats.usage.prompt_tokens == 10 and stats.usage.completion_tokens == 5


class TestMessageStream:
    def test_events_give_usage_tool_calls_and_finish(self) -> None:
        """message_start / tool_use block / input_json_delta / message_delta are read; every
        event passes unchanged; message_stop ends the stream."""
        stats = MessageStreamStats()
        events = [
            event(
                "message_start",
                {"message": {"usage": {"input_tokens": 40, "output_tokens": 0}}},
            ),
            event("content_block_start", {"index": 0, "content_block": {"type": "text"}}),
            event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": ""}}),
        ]
        for e in events:
            assert stats.observe(e) is e
        assert not stats.first_token_seen  # an empty text delta is no output
        tool = {"type": "tool_use", "id": "toolu_9", "name": "Bash", "input": {}}
        stats.observe(event("content_block_start", {"index": 1, "content_block": tool}))
        assert stats.first_token_seen
        for part in ('{"command":', '"ls"}'):
            delta = {"type": "input_json_delta", "partial_json": part}
            stats.observe(event("content_block_delta", {"index": 1, "delta": delta}))
        usage = {"input_tokens": 8, "cache_read_input_tokens": 32, "output_tokens": 12}
        stats.observe(
            event("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": usage})
        )
        assert not stats.done
        stats.observe(event("message_stop", {}))
        assert stats.done
        result = stats.result()
        assert result.tool_calls == [ToolCallInfo(id="toolu_9", name="Bash", arguments_bytes=16)]
        assert result.finish_reason == "tool_calls"
        assert (result.usage.prompt_tokens, result.usage.cached_tokens) == (40, 32)
        assert result.usage.completion_tokens == 12

    def test_delta_without_input_keeps_start_usage(self) -> None:
        """A message_delta carrying only output_tokens keeps the input side of message_start."""
        stats = MessageStreamStats()
        stats.observe(
            event("message_start", {"message": {"usage": {"input_tokens": 9, "output_tokens": 1}}})
        )
        stats.observe(
            event(
                "message_delta",
                {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}},
            )
        )
        result = stats.result()
        assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (9, 4)
        assert result.finish_reason == "stop"

    def test_error_page_and_comments_pass(self) -> None:
        """Events the gateway cannot read pass unchanged and change nothing."""
        stats = MessageStreamStats()
        assert stats.observe(b": ping\n\n") == b": ping\n\n"
        assert stats.observe(b"data: {oops\n\n") == b"data: {oops\n\n"
        assert stats.result().usage == Usage() and not stats.done


class TestErrors:
    def test_anthropic_error_shape(self) -> None:
        """Messages errors use Anthropic's shape, typed by status."""
        resp = MESSAGES.error(503, "later", "service_unavailable", headers={"Retry-After": "2"})
        assert resp.status == 503 and resp.headers["Retry-After"] == "2"
        assert resp.body is not None
        body = orjson.loads(resp.body)  # type: ignore[arg-type]
        assert body == {"type": "error", "error": {"type": "overloaded_error", "message": "later"}}
