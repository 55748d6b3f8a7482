"""The sim node's Responses API (``POST /v1/responses``): request and answer shapes.

Like vLLM (``vllm/entrypoints/openai/serving_responses.py``), the node turns the request into
chat messages and runs it as a chat completion: ``instructions`` becomes a system message, a
string ``input`` one user message; of a list, a message item (``type: "message"`` or none)
its role and text (``input_text`` / ``output_text`` parts joined), a ``function_call`` item the
assistant's ``tool_calls`` (consecutive calls go on one assistant message, after its text), a
``function_call_output`` a ``tool`` message; reasoning items are skipped. So the ids of turn N's
prompt and output are a token prefix of turn N+1's prompt, as for chat.

The answer follows the OpenAI Responses format: ``output`` holds a ``message`` item with one
``output_text`` part (when there is text) and a ``function_call`` item ``{id: "fc_…",
call_id: "call_…", name, arguments}`` for a scripted call; ``usage`` is ``input_tokens`` (the
whole prompt), ``input_tokens_details.cached_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens`` (0) and ``total_tokens``; ``status`` is
``completed``, or ``incomplete`` with ``incomplete_details.reason: "max_output_tokens"`` when
the length limit ended it. A stream sends ``event:`` + ``data:`` events, each with ``type`` and
``sequence_number``: ``response.created``, ``response.in_progress``,
``response.output_item.added`` / ``response.content_part.added`` /
``response.output_text.delta``… / ``response.output_text.done`` /
``response.content_part.done`` / ``response.output_item.done`` for the text,
``response.output_item.added`` / ``response.function_call_arguments.delta`` /
``response.function_call_arguments.done`` / ``response.output_item.done`` for a call, then
``response.completed`` (or ``response.incomplete``) with the whole response; no ``[DONE]``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from aiohttp import web

from services.simnode import tokenizer as tok
from services.simnode.tokenizer import TemplateError
from shared.core.engine import Completion

if TYPE_CHECKING:
    from services.simnode.runner import Waiter


class Reply(Protocol):
    """What the model will answer (:class:`services.simnode.handlers.Reply`; not imported:
    the handlers import this module)."""

    @property
    def output(self) -> list[int]: ...
    @property
    def content_len(self) -> int: ...
    @property
    def tool_name(self) -> str | None: ...
    @property
    def tool_args(self) -> str | None: ...
    @property
    def finish_reason(self) -> str: ...


__all__ = ["chat_messages", "response_object", "sse", "stream", "unary", "usage"]

_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text"})


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TemplateError(f"{where}: must be a string or a list of content parts")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, Mapping):
            raise TemplateError(f"{where}[{k}]: must be an object")
        if part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return "\n".join(texts)


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses request (module docstring); :class:`TemplateError`
    names the item that cannot be read."""
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        out.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        out.append({"role": "user", "content": raw})
        return out
    if not isinstance(raw, list) or not raw:
        raise TemplateError("input: required non-empty string or list of items")
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise TemplateError(f"{where}: must be an object")
        kind = item.get("type")
        if kind in (None, "message"):
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise TemplateError(f"{where}.role: must be user, assistant, system or developer")
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise TemplateError(f"{where}.name: must be a string")
            args = item.get("arguments")
            fn = {"name": item["name"], "arguments": args if isinstance(args, str) else "{}"}
            call = {"id": item.get("call_id"), "type": "function", "function": fn}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "content": text})
    if not out:
        raise TemplateError("input: no message to answer")
    return out


def usage(c: Completion) -> dict[str, Any]:
    """The ``usage`` of a finished request (module docstring)."""
    return {
        "input_tokens": c.prompt_tokens,
        "input_tokens_details": {"cached_tokens": c.cached_tokens},
        "output_tokens": c.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    }


def message_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    """The assistant message item of an answer."""
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": f"msg_{zlib.crc32(rid.encode()):08x}",
        "role": "assistant",
        "status": status,
        "content": [part] if text or status != "in_progress" else [],
    }


def call_item(rid: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    """The function-call item of an answer (``call_id`` as chat's tool-call ``id``)."""
    crc = zlib.crc32(rid.encode())
    return {
        "type": "function_call",
        "id": f"fc_{crc:08x}",
        "call_id": f"call_{crc:08x}",
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def response_object(
    rid: str,
    model: str,
    created: int,
    body: Mapping[str, Any],
    output: list[dict[str, Any]],
    *,
    status: str,
    use: dict[str, Any] | None,
    incomplete: str | None = None,
) -> dict[str, Any]:
    """The ``response`` object (module docstring)."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": status,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": use,
    }


def sse(kind: str, seq: int, data: Mapping[str, Any]) -> bytes:
    """One Responses SSE event: ``event:`` line, ``data:`` line (``type``, ``sequence_number``
    and ``data``), blank line."""
    payload = {"type": kind, "sequence_number": seq, **data}
    return f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode()


class Answering(Protocol):
    """What the writers need of the node (:class:`services.simnode.handlers.SimNode`)."""

    model: str
    created: int

    def _finished(self, request: web.Request, waiter: Waiter) -> Awaitable[Completion | None]: ...

    def _content_runs(
        self,
        request: web.Request,
        reply: Any,  # the node's own Reply (this Protocol's Reply is what it reads of it)
        waiter: Waiter,
    ) -> AsyncIterator[tuple[int, int]]: ...


def _ending(reply: Reply) -> tuple[str, str | None]:
    """The status and incomplete reason of a finished reply."""
    if reply.finish_reason == "length":
        return "incomplete", "max_output_tokens"
    return "completed", None


def _output(rid: str, reply: Reply, text: str) -> list[dict[str, Any]]:
    out = [message_item(rid, text)] if text else []
    if reply.tool_name is not None:
        out.append(call_item(rid, reply.tool_name, reply.tool_args or ""))
    return out


async def unary(
    node: Answering,
    request: web.Request,
    body: Mapping[str, Any],
    rid: str,
    reply: Reply,
    waiter: Waiter,
) -> web.StreamResponse:
    """The whole answer as one response object."""
    c = await node._finished(request, waiter)
    if c is None:
        error = {"message": f"engine failed: {waiter.error}", "type": "InternalServerError"}
        return web.json_response({"error": {**error, "param": None, "code": 500}}, status=500)
    text = tok.decode(reply.output[: reply.content_len])
    status, incomplete = _ending(reply)
    return web.json_response(
        response_object(
            rid,
            node.model,
            node.created,
            body,
            _output(rid, reply, text),
            status=status,
            use=usage(c),
            incomplete=incomplete,
        )
    )


async def stream(
    node: Answering,
    request: web.Request,
    body: Mapping[str, Any],
    rid: str,
    reply: Reply,
    waiter: Waiter,
) -> web.StreamResponse:
    """The answer as Responses events (module docstring)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.headers["Cache-Control"] = "no-cache"
    await resp.prepare(request)
    seq = 0

    async def send(kind: str, data: Mapping[str, Any]) -> None:
        nonlocal seq
        await resp.write(sse(kind, seq, data))
        seq += 1

    def obj(status: str, output: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
        return response_object(rid, node.model, node.created, body, output, status=status, **more)

    await send("response.created", {"response": obj("in_progress", [], use=None)})
    await send("response.in_progress", {"response": obj("in_progress", [], use=None)})
    msg = message_item(rid, "", "in_progress")
    texts: list[str] = []
    async for sent, upto in node._content_runs(request, reply, waiter):
        if not texts:
            await send("response.output_item.added", {"output_index": 0, "item": msg})
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": msg["id"], "output_index": 0, "content_index": 0}
            await send("response.content_part.added", {**where, "part": part})
        text = _text_of(reply.output[sent:upto], sent == 0)
        texts.append(text)
        where = {"item_id": msg["id"], "output_index": 0, "content_index": 0}
        await send("response.output_text.delta", {**where, "delta": text, "logprobs": []})
    full = "".join(texts)
    if texts:
        where = {"item_id": msg["id"], "output_index": 0, "content_index": 0}
        await send("response.output_text.done", {**where, "text": full, "logprobs": []})
        part = {"type": "output_text", "text": full, "annotations": []}
        await send("response.content_part.done", {**where, "part": part})
        item = message_item(rid, full)
        await send("response.output_item.done", {"output_index": 0, "item": item})
    c = waiter.completion
    if c is None:
        error = {"code": "engine_error", "message": f"engine failed: {waiter.error}", "param": None}
        await send("error", error)
        await resp.write_eof()
        return resp
    if reply.tool_name is not None:
        index = 1 if texts else 0
        call = call_item(rid, reply.tool_name, "", "in_progress")
        await send("response.output_item.added", {"output_index": index, "item": call})
        where = {"item_id": call["id"], "output_index": index}
        await send("response.function_call_arguments.delta", {**where, "delta": reply.tool_args})
        args = reply.tool_args or ""
        await send("response.function_call_arguments.done", {**where, "arguments": args})
        done = call_item(rid, reply.tool_name, args)
        await send("response.output_item.done", {"output_index": index, "item": done})
    status, incomplete = _ending(reply)
    final = obj(status, _output(rid, reply, full), use=usage(c), incomplete=incomplete)
    kind = "response.completed" if status == "completed" else "response.incomplete"
    await send(kind, {"response": final})
    await resp.write_eof()
    return resp


def _text_of(ids: list[int], first: bool) -> str:
    text = tok.decode(ids)
    return text if first or not text else " " + text
