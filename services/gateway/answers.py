"""What a node answered, in words: the text and tool calls of an answer, streamed or not (pure).

Session continuation by content (:mod:`.continuation`) hashes a session's last request and the
answer the gateway returned; this module reads that answer out of each API's response: chat
(``choices[0].message``, or the stream's ``delta.content`` and ``delta.tool_calls``
fragments), Anthropic Messages (``text`` and ``tool_use`` blocks, or ``text_delta`` and
``input_json_delta`` events) and Responses (``output`` items, or the ``response.completed``
event, which carries the whole response). The Responses id (``resp_…``) is kept too: the
gateway maps it to the session for a later ``previous_response_id``.

:class:`Transcribing` wraps a stream tracker (:class:`.proxy.Tracker`) and a body reader
(:data:`.proxy.BodyReader`) so that the answer lands in :attr:`.responses.ResponseStats.answer`
without changing what the client gets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from services.gateway.responses import ResponseStats, event_data, int_or_zero, json_object

__all__ = [
    "Answer",
    "AnswerStream",
    "Transcribing",
    "answer_of",
    "transcribing_reader",
]

Dialect = Literal["chat", "completions", "messages", "responses"]


@dataclass(slots=True)
class Answer:
    """The words of one answer: text, tool calls ``(name, arguments)``, the Responses id."""

    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)
    response_id: str | None = None


def _chat(obj: dict[str, Any]) -> Answer:
    out = Answer()
    choices = obj.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        return out
    content = message.get("content")
    out.text = content if isinstance(content, str) else ""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.calls.append((str(fn.get("name") or ""), str(fn.get("arguments") or "")))
    return out


def _messages(obj: dict[str, Any]) -> Answer:
    out = Answer()
    texts: list[str] = []
    content = obj.get("content")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            args = orjson.dumps(block.get("input", {})).decode()
            out.calls.append((str(block.get("name") or ""), args))
    out.text = "\n".join(texts)
    return out


def _responses(obj: dict[str, Any]) -> Answer:
    out = Answer(response_id=obj.get("id") if isinstance(obj.get("id"), str) else None)
    texts: list[str] = []
    output = obj.get("output")
    for item in output if isinstance(output, list) else ():
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            content = item.get("content")
            for part in content if isinstance(content, list) else ():
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
        elif item.get("type") == "function_call":
            out.calls.append((str(item.get("name") or ""), str(item.get("arguments") or "")))
    out.text = "\n".join(texts)
    return out


_READERS: Final[dict[str, Callable[[dict[str, Any]], Answer]]] = {
    "chat": _chat,
    "messages": _messages,
    "responses": _responses,
}


def answer_of(dialect: Dialect, body: bytes) -> Answer | None:
    """The answer of a whole (non-streamed) response body; ``None`` when unreadable or the
    API has no conversation (completions)."""
    reader = _READERS.get(dialect)
    obj = json_object(body) if reader is not None else None
    return None if obj is None or reader is None else reader(obj)


class AnswerStream:
    """Puts an answer together from a stream's events, one API's way."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._text: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [name, arguments...]
        self._final: Answer | None = None
        self._response_id: str | None = None

    def feed(self, event: bytes) -> None:
        data = event_data(event)
        obj = json_object(data) if data is not None and data.strip() != "[DONE]" else None
        if obj is None:
            return
        if self.dialect == "chat":
            self._chat(obj)
        elif self.dialect == "messages":
            self._messages(obj)
        elif self.dialect == "responses":
            self._responses(obj)

    def _chat(self, obj: dict[str, Any]) -> None:
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict) or int_or_zero(choice.get("index")) != 0:
                continue
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            if isinstance(delta.get("content"), str):
                self._text.append(delta["content"])
            calls = delta.get("tool_calls")
            for frag in calls if isinstance(calls, list) else ():
                if not isinstance(frag, dict):
                    continue
                call = self._calls.setdefault(int_or_zero(frag.get("index")), [""])
                fn = frag.get("function")
                if isinstance(fn, dict):
                    if isinstance(fn.get("name"), str) and fn["name"]:
                        call[0] = fn["name"]
                    if isinstance(fn.get("arguments"), str):
                        call.append(fn["arguments"])

    def _messages(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        index = int_or_zero(obj.get("index"))
        if kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict) and block.get("type") == "tool_use":
                self._calls[index] = [str(block.get("name") or "")]
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                self._text.append(block["text"])
        elif kind == "content_block_delta":
            delta = obj.get("delta")
            if not isinstance(delta, dict):
                return
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self._text.append(delta["text"])
            elif delta.get("type") == "input_json_delta" and index in self._calls:
                partial = delta.get("partial_json")
                if isinstance(partial, str):
                    self._calls[index].append(partial)

    def _responses(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        response = obj.get("response")
        if isinstance(response, dict):
            if isinstance(response.get("id"), str):
                self._response_id = response["id"]
            if kind in ("response.completed", "response.incomplete"):
                self._final = _responses(response)
        elif kind == "response.output_text.delta" and isinstance(obj.get("delta"), str):
            self._text.append(obj["delta"])
        elif kind == "response.output_item.done":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") == "function_call":
                index = int_or_zero(obj.get("output_index"))
                self._calls[index] = [str(item.get("name") or ""), str(item.get("arguments") or "")]

    def answer(self) -> Answer:
        """The answer so far (the final response object's, when a Responses stream sent it)."""
        if self._final is not None:
            return self._final
        calls = [(c[0], "".join(c[1:])) for _, c in sorted(self._calls.items())]
        return Answer("".join(self._text), calls, self._response_id)


class Transcribing:
    """A stream tracker that also puts the answer together (module docstring)."""

    def __init__(self, inner: Any, dialect: Dialect) -> None:
        self.inner = inner
        self.stream = AnswerStream(dialect)
        self.first_token_seen = False
        self.done = False

    def observe(self, event: bytes) -> bytes | None:
        self.stream.feed(event)
        out: bytes | None = self.inner.observe(event)
        self.first_token_seen = bool(self.inner.first_token_seen)
        self.done = bool(self.inner.done)
        return out

    def result(self) -> ResponseStats:
        stats: ResponseStats = self.inner.result()
        stats.answer = self.stream.answer()
        return stats


def transcribing_reader(
    inner: Callable[[bytes], tuple[ResponseStats, bytes]], dialect: Dialect
) -> Callable[[bytes], tuple[ResponseStats, bytes]]:
    """A body reader that also reads the answer (module docstring)."""

    def read(body: bytes) -> tuple[ResponseStats, bytes]:
        stats, out = inner(body)
        stats.answer = answer_of(dialect, body)
        return stats, out

    return read
