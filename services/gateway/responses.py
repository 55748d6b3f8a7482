"""Reading a node's responses: SSE framing, usage, finish reason and tool calls (pure).

Streaming (``text/event-stream``): events are separated by a blank line (WHATWG HTML, "Server-sent
events", §9.2.6 "Interpreting an event stream"); each ``data:`` line carries one JSON chunk and
the stream ends with ``data: [DONE]``. :class:`SSESplitter` cuts the byte stream into whole
events, byte for byte, so the gateway forwards exactly what the node sent. The first token is
the first chunk with output (text, reasoning or tool calls) or a finish reason; the role-only
opening chunk does not count.

:class:`StreamStats` watches the chunks. When the client did not ask for usage, the gateway asked
for it anyway (``stream_options.include_usage``); vLLM then sends one extra chunk with
``"choices": []`` and the ``usage`` just before ``[DONE]``, and serialises its other chunks
without a ``usage`` key (``model_dump_json(exclude_unset=True)`` in
vllm/entrypoints/openai/serving_chat.py), so dropping that one chunk gives the client exactly
the stream it asked for. Tool calls stream as ``delta.tool_calls`` fragments keyed by
``index``: the first fragment of an index carries ``id`` and ``function.name``, later ones append
``function.arguments``.

Non-streaming: :func:`read_body` reads ``usage``, ``choices[0].finish_reason`` and
``choices[0].message.tool_calls`` from the JSON response.

Token ids (``return_token_ids``, see :mod:`.tokenids`): both readers collect the prompt ids
and choice 0's output ids, and remove the id fields from what the client gets when asked to
(``strip_ids``); only a response or chunk that carried ids is re-serialised. A chunk left with
nothing but an empty delta after that (vLLM streams one for ids a parser held back) is dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from services.gateway.tokenids import take_ids
from shared.contracts import ToolCallInfo, Usage

__all__ = [
    "DONE",
    "ResponseStats",
    "SSESplitter",
    "StreamStats",
    "StreamedCall",
    "calls_in_order",
    "event_data",
    "int_or_zero",
    "json_object",
    "read_body",
    "stats_from_body",
    "usage_from",
]

DONE: Final = "[DONE]"
_SEPARATORS: Final = (b"\r\n\r\n", b"\n\n", b"\r\r")
_OUTPUT_KEYS: Final = ("content", "reasoning_content", "reasoning", "tool_calls")


@dataclass(slots=True)
class ResponseStats:
    """What the gateway reports about one response."""

    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    tool_calls: list[ToolCallInfo] = field(default_factory=list)
    prompt_ids: list[Any] | None = None
    """The node's prompt token ids (``return_token_ids``), ``None`` when it sent none."""
    output_ids: list[Any] | None = None
    """Choice 0's output token ids, ``None`` when the node sent none."""
    answer: Any = None
    """The answer's words (:class:`.answers.Answer`) when the API's reader was asked for them
    (session continuation by content), else ``None``."""


def int_or_zero(value: object) -> int:
    """``value`` when it is an integer (not a bool), else 0: for counts a node may leave out."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def json_object(data: bytes | str) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object; ``None`` when it is not JSON or not an object."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def usage_from(obj: object) -> Usage | None:
    """An OpenAI ``usage`` object as :class:`Usage`; ``None`` when absent or not an object."""
    if not isinstance(obj, dict):
        return None
    details = obj.get("prompt_tokens_details")
    cached = int_or_zero(details.get("cached_tokens")) if isinstance(details, dict) else 0
    prompt = int_or_zero(obj.get("prompt_tokens"))
    completion = int_or_zero(obj.get("completion_tokens"))
    total = int_or_zero(obj.get("total_tokens")) or prompt + completion
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached, total_tokens=total
    )


def _call_info(call: object) -> ToolCallInfo | None:
    if not isinstance(call, dict):
        return None
    fn = call.get("function")
    fn = fn if isinstance(fn, dict) else {}
    name = fn.get("name")
    args = fn.get("arguments")
    return ToolCallInfo(
        id=str(call.get("id") or ""),
        name=name if isinstance(name, str) else "",
        arguments_bytes=len(args.encode()) if isinstance(args, str) else 0,
    )


def stats_from_body(body: bytes) -> ResponseStats:
    """Usage, finish reason and tool calls of a non-streaming response (empty if unreadable)."""
    return read_body(body)[0]


def read_body(body: bytes, *, strip_ids: bool = False) -> tuple[ResponseStats, bytes]:
    """What a non-streaming response says, and the bytes for the client: ``body`` unchanged,
    or re-serialised without token-id values when ``strip_ids`` and it had some."""
    stats = ResponseStats()
    obj = json_object(body)
    if obj is None:
        return stats, body
    stats.prompt_ids, stats.output_ids, found = take_ids(obj, "null" if strip_ids else None)
    if strip_ids and found:
        body = orjson.dumps(obj)
    stats.usage = usage_from(obj.get("usage")) or Usage()
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        reason = first.get("finish_reason")
        stats.finish_reason = reason if isinstance(reason, str) else None
        message = first.get("message")
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if isinstance(calls, list):
            stats.tool_calls = [c for c in map(_call_info, calls) if c is not None]
    return stats, body


class SSESplitter:
    """Cuts a byte stream into whole SSE events (each with its blank-line terminator)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add ``chunk``; return the events it completed, bytes unchanged."""
        self._buf += chunk
        events: list[bytes] = []
        while True:
            cut = -1
            sep_len = 0
            for sep in _SEPARATORS:
                at = self._buf.find(sep)
                if at != -1 and (cut == -1 or at < cut):
                    cut, sep_len = at, len(sep)
            if cut == -1:
                return events
            events.append(self._buf[: cut + sep_len])
            self._buf = self._buf[cut + sep_len :]

    def rest(self) -> bytes:
        """Bytes after the last complete event (a stream that ended without a blank line)."""
        rest, self._buf = self._buf, b""
        return rest


def event_data(event: bytes) -> str | None:
    """The joined ``data:`` lines of one SSE event, or ``None`` if it has none."""
    lines = event.decode("utf-8", errors="replace").splitlines()
    data = [
        line[5:].removeprefix(" ")
        for line in lines
        if line.startswith("data:")  # field name exactly "data" (WHATWG §9.2.6)
    ]
    return "\n".join(data) if data else None


@dataclass(slots=True)
class StreamedCall:
    """A tool call put together from the fragments of a stream."""

    id: str = ""
    name: str = ""
    arguments_bytes: int = 0


def calls_in_order(calls: Mapping[Any, StreamedCall]) -> list[ToolCallInfo]:
    """The streamed calls as :class:`ToolCallInfo`, in the order of their keys."""
    return [
        ToolCallInfo(id=c.id, name=c.name, arguments_bytes=c.arguments_bytes)
        for _, c in sorted(calls.items())
    ]


def _has_output(choice: dict[str, Any], delta: object) -> bool:
    """Whether a streamed choice carries generated output (text, reasoning or tool calls)."""
    if isinstance(choice.get("text"), str) and choice["text"]:
        return True  # /v1/completions
    if not isinstance(delta, dict):
        return False
    return any(delta.get(k) for k in _OUTPUT_KEYS)


def _idle(choice: object) -> bool:
    """Whether a streamed choice says nothing: no output, role, finish reason or logprobs."""
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    if choice.get("logprobs") or choice.get("text"):
        return False
    delta = choice.get("delta")
    return not delta or (isinstance(delta, dict) and not any(delta.values()))


class StreamStats:
    """Accumulates what a chat/completions SSE stream says (module docstring)."""

    def __init__(self, *, keep_usage_chunk: bool, strip_ids: bool = False) -> None:
        self.keep_usage_chunk = keep_usage_chunk
        self.strip_ids = strip_ids
        self.usage: Usage | None = None
        self.finish_reason: str | None = None
        self.first_token_seen = False
        self.done = False
        self._calls: dict[tuple[int, int], StreamedCall] = {}
        self._prompt_ids: list[Any] | None = None
        self._output_ids: list[Any] | None = None

    def observe(self, event: bytes) -> bytes | None:
        """Record one whole event; return the bytes the client should see (``event`` itself,
        or the chunk without token ids), or ``None`` to drop it."""
        data = event_data(event)
        if data is None:
            return event
        if data.strip() == DONE:
            self.done = True
            return event
        chunk = json_object(data)
        if chunk is None:
            return event
        usage = usage_from(chunk.get("usage"))
        if usage is not None:
            self.usage = usage
        prompt, output, found = take_ids(chunk, "drop" if self.strip_ids else None)
        if prompt is not None and self._prompt_ids is None:
            self._prompt_ids = prompt
        if output:
            if self._output_ids is None:
                self._output_ids = []
            self._output_ids.extend(output)
        choices = chunk.get("choices")
        if isinstance(choices, list):
            for choice in choices:
                self._choice(choice)
            if not choices and usage is not None and not self.keep_usage_chunk:
                return None
        if not (self.strip_ids and found):
            return event
        if usage is None and isinstance(choices, list) and choices and all(map(_idle, choices)):
            return None  # only ids were in it
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _choice(self, choice: object) -> None:
        if not isinstance(choice, dict):
            return
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason
        delta = choice.get("delta")
        if not self.first_token_seen:
            self.first_token_seen = reason is not None or _has_output(choice, delta)
        calls = delta.get("tool_calls") if isinstance(delta, dict) else None
        if not isinstance(calls, list):
            return
        choice_index = int_or_zero(choice.get("index"))
        for frag in calls:
            if not isinstance(frag, dict):
                continue
            key = (choice_index, int_or_zero(frag.get("index")))
            call = self._calls.setdefault(key, StreamedCall())
            if isinstance(frag.get("id"), str) and frag["id"]:
                call.id = frag["id"]
            fn = frag.get("function")
            if isinstance(fn, dict):
                if isinstance(fn.get("name"), str) and fn["name"]:
                    call.name = fn["name"]
                if isinstance(fn.get("arguments"), str):
                    call.arguments_bytes += len(fn["arguments"].encode())

    def result(self) -> ResponseStats:
        """The usage, finish reason and tool calls seen so far (calls of choice 0 first)."""
        return ResponseStats(
            usage=self.usage or Usage(),
            finish_reason=self.finish_reason,
            tool_calls=calls_in_order(self._calls),
            prompt_ids=self._prompt_ids,
            output_ids=self._output_ids,
        )
