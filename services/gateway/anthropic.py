"""The Anthropic Messages API (``POST /v1/messages``) at the gateway (pure).

Claude Code talks to ``ANTHROPIC_BASE_URL`` with this API; the gateway holds and forwards it
like a chat completion and passes the answer through unchanged. vLLM serves it too
(vllm/entrypoints/anthropic/: ``AnthropicMessagesRequest`` in protocol.py, added by
vllm-project/vllm PR #22627 and mounted on ``vllm serve`` by PR #27882).

**Request** (Anthropic, "Messages" API reference): ``model`` and ``max_tokens`` (>= 1) are
required, ``messages`` is a list of ``{"role", "content"}`` where content is a string or a
list of blocks (``text``, ``image``, ``tool_use`` ``{id, name, input}``, ``tool_result``
``{tool_use_id, content}``, ``thinking``…); ``system`` is a string or text blocks; ``stream``;
``metadata.user_id``.

**Session id** (what Claude Code sends; its source is not public, so the formats are those
that proxies reading it document: coder/aibridge PR #241, ding113/claude-code-hub PR #939):
``metadata.user_id`` is ``"user_<sha256>_account_<uuid or empty>_session_<uuid>"`` before
Claude Code 2.1.78 and a JSON string ``{"device_id", "account_uuid", "session_id"}`` since;
2.1.86 added the header ``X-Claude-Code-Session-Id``. The session uuid is the ``session_id``
of Claude Code's hook payloads, so requests and tool hooks meet in one TAO session. Any other
``user_id`` (a plain end-user id from another client) names a user, not a session: ignored.
Claude Code 2.1.197, captured by tests/harness, sends both on every request, equal: the JSON
form ``{"device_id": <sha256 hex>, "account_uuid": "", "session_id": <uuid>}`` and the header
(the precedence of all the ids: :mod:`.requests`).

**Usage**: Anthropic counts ``input_tokens`` after the last cache breakpoint only, so the
prompt is ``input_tokens + cache_read_input_tokens + cache_creation_input_tokens`` and the
cached part is ``cache_read_input_tokens``. vLLM reported the whole prompt as
``input_tokens`` with no cache fields until PR #40912, and since then ``prompt - cached`` with
``cache_read_input_tokens = cached`` and ``cache_creation_input_tokens = 0``: the sum is the
prompt either way. ``stop_reason`` maps to OpenAI's finish reasons (``end_turn`` and
``stop_sequence`` → ``stop``, ``max_tokens`` → ``length``, ``tool_use`` → ``tool_calls``),
and ``tool_use`` content blocks are the tool calls.

**Streaming** (SSE with ``event:`` lines): ``message_start`` (``message.usage``: input side),
``content_block_start`` (a ``tool_use`` block names the call), ``content_block_delta``
(``text_delta``, ``thinking_delta``, ``input_json_delta``), ``content_block_stop``,
``message_delta`` (``delta.stop_reason``; ``usage`` with the final ``output_tokens``, and in
newer servers the input side again), ``message_stop``. Every event goes to the client as sent.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson
from aiohttp import web

from services.gateway.requests import CLAUDE_SESSION_HEADER, BadRequest, RequestInfo
from services.gateway.responses import (
    ResponseStats,
    StreamedCall,
    calls_in_order,
    event_data,
    int_or_zero,
    json_object,
)
from shared.contracts import ToolCallInfo, Usage

__all__ = [
    "CLAUDE_CODE",
    "CLAUDE_SESSION_HEADER",
    "MessageStreamStats",
    "anthropic_error",
    "claude_session_id",
    "describe_messages",
    "finish_reason",
    "read_message_body",
    "usage_of",
]

CLAUDE_CODE: Final = "claude-code"
"""The harness reported for a request that Claude Code's metadata or header identified."""

_LEGACY_USER_ID: Final = re.compile(r"^user_[0-9a-fA-F]*_account_[0-9a-fA-F-]*_session_([\w-]+)$")
_FINISH: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
_ERROR_TYPES: Final = {
    400: "invalid_request_error",
    404: "not_found_error",
    409: "invalid_request_error",
    502: "api_error",
    503: "overloaded_error",
}
_CHARS_PER_TOKEN: Final = 4


def claude_session_id(metadata: object) -> str | None:
    """The session uuid in Claude Code's ``metadata.user_id`` (either format), else ``None``."""
    user_id = metadata.get("user_id") if isinstance(metadata, Mapping) else None
    if not isinstance(user_id, str):
        return None
    user_id = user_id.strip()
    if user_id.startswith("{"):
        try:
            obj = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        sid = obj.get("session_id") if isinstance(obj, dict) else None
        return sid.strip() or None if isinstance(sid, str) else None
    legacy = _LEGACY_USER_ID.match(user_id)
    return legacy.group(1) if legacy else None


def anthropic_error(
    status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
) -> web.Response:
    """An Anthropic-style error: ``{"type": "error", "error": {"type", "message"}}``; the type
    follows the status (``overloaded_error`` for 503), else ``err_type``."""
    error = {"type": _ERROR_TYPES.get(status, err_type), "message": message}
    return web.json_response({"type": "error", "error": error}, status=status, headers=headers)


def _chars(value: object) -> int:
    """Characters of text in a content value: a string or a list of blocks."""
    if isinstance(value, str):
        return len(value)
    if not isinstance(value, list):
        return 0
    total = 0
    for block in value:
        if isinstance(block, str):
            total += len(block)
        elif isinstance(block, dict):
            for key in ("text", "thinking"):
                text = block.get(key)
                total += len(text) if isinstance(text, str) else 0
            if block.get("type") == "tool_use":
                total += _chars(block.get("name")) + len(orjson.dumps(block.get("input")))
            total += _chars(block.get("content"))  # tool_result
    return total


def describe_messages(body: Mapping[str, Any]) -> RequestInfo:
    """Read model, stream flag, ``max_tokens`` and size from a Messages request; raise
    :class:`BadRequest` naming the field that makes it unservable."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str | list):
            raise BadRequest(f"'messages[{i}]' must be an object with string or list 'content'")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(
            f"'max_tokens' is required and must be an integer >= 1, got {max_tokens!r}"
        )
    system = body.get("system")
    if system is not None and not isinstance(system, str | list):
        raise BadRequest("'system' must be a string or a list of blocks")
    chars = _chars(body.get("system")) + sum(_chars(m.get("content")) for m in messages)
    return RequestInfo(
        model=model,
        stream=body.get("stream") is True,
        max_tokens=max_tokens,
        messages_count=len(messages),
        prompt_tokens_estimate=-(-chars // _CHARS_PER_TOKEN),
        client_wants_usage=True,
    )


def usage_of(obj: object) -> Usage | None:
    """An Anthropic ``usage`` object as :class:`Usage` (module docstring); ``None`` if absent."""
    if not isinstance(obj, dict):
        return None
    cached = int_or_zero(obj.get("cache_read_input_tokens"))
    created = int_or_zero(obj.get("cache_creation_input_tokens"))
    prompt = int_or_zero(obj.get("input_tokens")) + cached + created
    completion = int_or_zero(obj.get("output_tokens"))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=cached,
        total_tokens=prompt + completion,
    )


def finish_reason(stop_reason: object) -> str | None:
    """OpenAI's finish reason for an Anthropic ``stop_reason`` (unknown ones pass as they are)."""
    if not isinstance(stop_reason, str):
        return None
    return _FINISH.get(stop_reason, stop_reason)


def read_message_body(body: bytes) -> tuple[ResponseStats, bytes]:
    """Usage, finish reason and tool calls of a non-streaming Messages response; the body goes
    to the client unchanged."""
    stats = ResponseStats()
    obj = json_object(body)
    if obj is None:
        return stats, body
    stats.usage = usage_of(obj.get("usage")) or Usage()
    stats.finish_reason = finish_reason(obj.get("stop_reason"))
    content = obj.get("content")
    if isinstance(content, list):
        stats.tool_calls = [
            ToolCallInfo(
                id=str(block.get("id") or ""),
                name=str(block.get("name") or ""),
                arguments_bytes=len(orjson.dumps(block.get("input", {}))),
            )
            for block in content
            if isinstance(block, dict) and block.get("type") == "tool_use"
        ]
    return stats, body


_OUTPUT_DELTAS: Final = {"text_delta": "text", "thinking_delta": "thinking"}


class MessageStreamStats:
    """Accumulates what a Messages SSE stream says (module docstring); passes every event."""

    def __init__(self) -> None:
        self.first_token_seen = False
        self.done = False
        self._usage: dict[str, Any] = {}
        self._finish: str | None = None
        self._calls: dict[int, StreamedCall] = {}

    def observe(self, event: bytes) -> bytes | None:
        """Record one whole event; it always goes to the client."""
        data = event_data(event)
        if data is None:
            return event
        obj = json_object(data)
        if obj is None:
            return event
        kind = obj.get("type")
        if kind == "content_block_delta":
            self._delta(obj)
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                index = int_or_zero(obj.get("index"))
                call = StreamedCall(str(block.get("id") or ""), str(block.get("name") or ""))
                self._calls[index] = call
                self.first_token_seen = True
        elif kind == "message_start":
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._usage.update(usage)
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("stop_reason") is not None:
                self._finish = finish_reason(delta["stop_reason"])
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self._usage.update({k: v for k, v in usage.items() if v is not None})
        elif kind == "message_stop":
            self.done = True
        return event

    def _delta(self, obj: dict[str, Any]) -> None:
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            return
        kind = delta.get("type")
        if kind == "input_json_delta":
            partial = delta.get("partial_json")
            call = self._calls.get(int_or_zero(obj.get("index")))
            if isinstance(partial, str):
                self.first_token_seen = True
                if call is not None:
                    call.arguments_bytes += len(partial.encode())
        elif kind in _OUTPUT_DELTAS and delta.get(_OUTPUT_DELTAS[kind]):
            self.first_token_seen = True

    def result(self) -> ResponseStats:
        """The usage, finish reason and tool calls seen so far (calls in block order)."""
        return ResponseStats(
            usage=usage_of(self._usage) or Usage(),
            finish_reason=self._finish,
            tool_calls=calls_in_order(self._calls),
        )
