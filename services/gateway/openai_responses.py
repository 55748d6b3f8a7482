"""OpenAI's Responses API (``POST /v1/responses``) at the gateway (pure).

Codex CLI speaks it (a model provider with ``wire_api = "responses"``), and vLLM serves it
(``vllm/entrypoints/openai/serving_responses.py``, mounted as ``/v1/responses`` by ``vllm
serve``): the gateway holds and forwards it like a chat completion and passes the answer
through unchanged.

**Request** (OpenAI, "Responses" API reference): ``model``; ``input`` a string (one user
message) or a list of items: messages ``{"role", "content"}`` (``type: "message"`` or none;
content a string or a list of ``input_text`` / ``output_text`` / ``input_image`` parts),
``function_call`` ``{call_id, name, arguments}``, ``function_call_output`` ``{call_id,
output}``, ``reasoning``…; ``instructions`` (the system prompt); ``max_output_tokens``;
``stream``; ``tools``; ``previous_response_id`` (chains turns: the gateway maps it to the
session of the response it names, :mod:`.requests`); ``store``; ``prompt_cache_key``.

**Answer**: ``{"id": "resp_…", "object": "response", "status", "output": [items], "usage":
{"input_tokens", "input_tokens_details": {"cached_tokens"}, "output_tokens",
"output_tokens_details": {"reasoning_tokens"}, "total_tokens"}}``. ``input_tokens`` is the whole
prompt, cached part included (as chat's ``prompt_tokens``). The finish reason, which the
Responses API does not name: ``tool_calls`` when the output holds a ``function_call`` item,
``length`` when ``status`` is ``incomplete`` for ``max_output_tokens``, else ``stop``.

**Streaming** (SSE with ``event:`` lines, no ``[DONE]``): ``response.created`` and
``response.in_progress`` (the response so far, its id), ``response.output_item.added`` (a
``function_call`` item names the call), ``response.content_part.added``,
``response.output_text.delta``, ``response.reasoning_text.delta``,
``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``,
``response.completed`` (the whole response, with ``usage``), or ``response.incomplete`` /
``response.failed``; an ``error`` event reports a failure. Every event goes to the client as
sent; the first token is the first output delta or function-call item.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson

from services.gateway.requests import BadRequest, RequestInfo, estimate_prompt_tokens
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
    "ResponsesStreamStats",
    "describe_responses",
    "finish_of",
    "read_responses_body",
    "responses_error_event",
    "usage_of",
]

_CHARS_PER_TOKEN: Final = 4
_DONE_EVENTS: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})
_OUTPUT_DELTAS: Final = frozenset(
    {
        "response.output_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.function_call_arguments.delta",
        "response.refusal.delta",
    }
)


def _chars(value: object) -> int:
    """Characters of text in an ``input`` value, item or content part."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    if not isinstance(value, dict):
        return 0
    total = 0
    for key in ("text", "arguments", "name"):
        text = value.get(key)
        total += len(text) if isinstance(text, str) else 0
    total += _chars(value.get("content")) + _chars(value.get("output"))
    return total


def describe_responses(body: Mapping[str, Any]) -> RequestInfo:
    """Read model, stream flag, ``max_output_tokens`` and size from a Responses request;
    raise :class:`BadRequest` naming the field that makes it unservable."""
    raw = body.get("input")
    if raw is None:
        raise BadRequest("'input' is required: a string or a list of input items")
    items = [raw] if isinstance(raw, str) else raw
    for i, item in enumerate(items if isinstance(raw, list) else ()):
        if not isinstance(item, dict):
            raise BadRequest(f"'input[{i}]' must be an object, got {type(item).__name__}")
        content = item.get("content")
        if item.get("type") in (None, "message") and not isinstance(content, str | list):
            raise BadRequest(f"'input[{i}].content' must be a string or a list of content parts")
        kind = item.get("type")
        if kind is not None and not isinstance(kind, str):
            raise BadRequest(f"'input[{i}].type' must be a string")
    chars = _chars(body.get("instructions")) + _chars(items)
    max_tokens = body.get("max_output_tokens")
    model = body.get("model")
    return RequestInfo(
        model=model if isinstance(model, str) else "",
        stream=body.get("stream") is True,
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
        messages_count=len(items) if isinstance(items, list) else 1,
        prompt_tokens_estimate=-(-chars // _CHARS_PER_TOKEN) or estimate_prompt_tokens(body),
        client_wants_usage=True,
    )


def usage_of(obj: object) -> Usage | None:
    """A Responses ``usage`` object as :class:`Usage` (module docstring); ``None`` if absent."""
    if not isinstance(obj, dict):
        return None
    details = obj.get("input_tokens_details")
    cached = int_or_zero(details.get("cached_tokens")) if isinstance(details, dict) else 0
    prompt = int_or_zero(obj.get("input_tokens"))
    completion = int_or_zero(obj.get("output_tokens"))
    total = int_or_zero(obj.get("total_tokens")) or prompt + completion
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, total_tokens=total
    )


def _calls(output: object) -> list[ToolCallInfo]:
    return [
        ToolCallInfo(
            id=str(item.get("call_id") or item.get("id") or ""),
            name=str(item.get("name") or ""),
            arguments_bytes=len(str(item.get("arguments") or "").encode()),
        )
        for item in (output if isinstance(output, list) else ())
        if isinstance(item, dict) and item.get("type") == "function_call"
    ]


def finish_of(response: Mapping[str, Any], calls: int) -> str | None:
    """The finish reason of a response object (module docstring)."""
    status = response.get("status")
    if calls:
        return "tool_calls"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    if status == "completed":
        return "stop"
    return status if isinstance(status, str) else None


def _stats(response: Mapping[str, Any]) -> ResponseStats:
    calls = _calls(response.get("output"))
    return ResponseStats(
        usage=usage_of(response.get("usage")) or Usage(),
        finish_reason=finish_of(response, len(calls)),
        tool_calls=calls,
    )


def read_responses_body(body: bytes) -> tuple[ResponseStats, bytes]:
    """Usage, finish reason and tool calls of a non-streaming response; the body goes to the
    client unchanged."""
    obj = json_object(body)
    return (ResponseStats() if obj is None else _stats(obj)), body


def responses_error_event(message: str) -> bytes:
    """The SSE ``error`` event of the Responses streaming format."""
    payload = {"type": "error", "code": "upstream_error", "message": message, "param": None}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponsesStreamStats:
    """Accumulates what a Responses SSE stream says (module docstring); passes every event."""

    def __init__(self) -> None:
        self.first_token_seen = False
        self.done = False
        self._final: ResponseStats | None = None
        self._calls: dict[int, StreamedCall] = {}

    def observe(self, event: bytes) -> bytes | None:
        """Record one whole event; it always goes to the client."""
        data = event_data(event)
        obj = json_object(data) if data is not None else None
        if obj is None:
            return event
        kind = obj.get("type")
        if kind in _OUTPUT_DELTAS:
            self.first_token_seen = True
            if kind == "response.function_call_arguments.delta":
                call = self._calls.get(int_or_zero(obj.get("output_index")))
                delta = obj.get("delta")
                if call is not None and isinstance(delta, str):
                    call.arguments_bytes += len(delta.encode())
        elif kind == "response.output_item.added":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                self.first_token_seen = True
                call = StreamedCall(
                    str(item.get("call_id") or item.get("id") or ""), str(item.get("name") or "")
                )
                self._calls[int_or_zero(obj.get("output_index"))] = call
        elif kind in _DONE_EVENTS:
            self.done = True
            response = obj.get("response")
            if isinstance(response, dict):
                self._final = _stats(response)
        return event

    def result(self) -> ResponseStats:
        """What the stream said: the final response's stats once it came, else the calls so
        far."""
        if self._final is not None:
            return ResponseStats(
                usage=self._final.usage,
                finish_reason=self._final.finish_reason,
                tool_calls=list(self._final.tool_calls) or calls_in_order(self._calls),
            )
        calls = calls_in_order(self._calls)
        return ResponseStats(tool_calls=calls, finish_reason="tool_calls" if calls else None)
