"""HTTP handlers of the sim node: OpenAI-compatible endpoints, health and vLLM metrics.

Token ids: a chat or completions request with ``return_token_ids: true`` gets them the way
vLLM sends them (vllm/entrypoints/openai/chat_completion/protocol.py and serving.py; see
:mod:`services.gateway.tokenids`): chat puts ``prompt_token_ids`` at the top level (of the
response, or of the first chunk) and ``token_ids`` on the choice (each chunk: its new ids);
completions put both on the choice. They are the ids the engine caches: the rendered prompt
and the reply's output, so their full blocks are the node's KV blocks.

``POST /v1/responses`` serves the OpenAI Responses API (:mod:`services.simnode.responses`),
scripted like chat; ``max_output_tokens`` limits it as ``max_tokens`` does chat.

``POST /v1/messages`` serves the Anthropic Messages API (:mod:`services.simnode.anthropic`),
scripted like chat by ``tao_script``; unscripted, it writes ``min(max_tokens, 64)`` tokens
(Claude Code asks for up to 32,000), ``stop_reason`` ``max_tokens`` only when that is all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from services.simnode import anthropic as anth
from services.simnode import responses as resp_api
from services.simnode import tokenizer as tok
from services.simnode.runner import EngineRunner, Waiter
from shared.core.engine import Completion, EngineRequest, generated_token_ids

__all__ = ["BadRequest", "Reply", "SimNode", "anthropic_error", "error_response"]

PROCESS_START: Final = time.time()  # vLLM's process_start_time_seconds, here at import

DEFAULT_OUTPUT_TOKENS = 64
_DISCONNECT_POLL_S = 0.05


class BadRequest(ValueError):
    """A request the node refuses with HTTP 400 (the message names what was wrong)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def error_response(status: int, message: str, etype: str, param: str | None = None) -> web.Response:
    """An OpenAI-style error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": etype, "param": param, "code": status}}
    return web.json_response(body, status=status)


def anthropic_error(status: int, message: str, etype: str) -> web.Response:
    """An Anthropic-style error body: ``{"type": "error", "error": {"type", "message"}}``."""
    body = {"type": "error", "error": {"type": etype, "message": message}}
    return web.json_response(body, status=status)


async def _open_event_stream(request: web.Request) -> web.StreamResponse:
    """A prepared ``text/event-stream`` response, not cached."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    resp.headers["Cache-Control"] = "no-cache"
    await resp.prepare(request)
    return resp


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    """One Anthropic SSE event: ``event:`` line, ``data:`` line, blank line."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass(frozen=True, slots=True)
class Reply:
    """What the model will answer: output ids, the content part, the tool call and why it ends."""

    output: list[int]
    content_len: int
    tool_name: str | None
    tool_args: str | None
    finish_reason: str


def _int_field(body: Mapping[str, Any], name: str, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise BadRequest(f"{name}: must be an integer >= {lo}, got {value!r}", name)
    return value


def plan_reply(body: Mapping[str, Any], request_id: str) -> Reply:
    """The reply a request asks for: ``tao_script`` (top level or in ``extra_body``) or length."""
    script = body.get("tao_script")
    extra = body.get("extra_body")
    if script is None and isinstance(extra, Mapping):
        script = extra.get("tao_script")
    if script is None:
        limit = _int_field(body, "max_completion_tokens", 1) or _int_field(body, "max_tokens", 1)
        n = limit or DEFAULT_OUTPUT_TOKENS
        out = list(generated_token_ids(request_id, n))
        return Reply(out, n, None, None, "length" if limit else "stop")
    if not isinstance(script, Mapping):
        raise BadRequest("tao_script: must be an object", "tao_script")
    scripted = _int_field(script, "output_tokens", 1)
    if scripted is None:
        raise BadRequest("tao_script.output_tokens: required integer >= 1", "tao_script")
    n = scripted
    call = script.get("tool_call")
    if call is None:
        return Reply(list(generated_token_ids(request_id, n)), n, None, None, "stop")
    if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
        raise BadRequest("tao_script.tool_call: must be null or {name, arguments}", "tao_script")
    args = call.get("arguments", {})
    args_text = args if isinstance(args, str) else json.dumps(args, separators=(",", ":"))
    tail = tok.tool_call_ids(call["name"], args_text)
    filler = list(generated_token_ids(request_id, max(0, n - len(tail))))
    return Reply(filler + tail, len(filler), call["name"], args_text, "tool_calls")


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or :class:`BadRequest`."""
    try:
        body = await request.json(loads=json.loads)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    return body


def _usage(c: Completion) -> dict[str, Any]:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    }


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _text_of(ids: list[int], first: bool) -> str:
    text = tok.decode(ids)
    return text if first or not text else " " + text


class SimNode:
    """Request handling around one :class:`EngineRunner`."""

    def __init__(self, runner: EngineRunner, node_id: str, model: str) -> None:
        self.runner = runner
        self.node_id = node_id
        self.model = model
        self._seq = 0
        self.created = int(time.time())

    def _new_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}-{self.node_id}-{self._seq}"

    # -- chat ----------------------------------------------------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/chat/completions`` (stream or not)."""
        try:
            body = await read_json(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("messages: required non-empty list", "messages")
            try:
                prompt = tok.render_messages(messages, body.get("tools"))
            except tok.TemplateError as exc:
                raise BadRequest(str(exc), "messages") from None
            rid = self._new_id("chatcmpl")
            reply = plan_reply(body, rid)
        except BadRequest as exc:
            return error_response(400, str(exc), "BadRequestError", exc.param)
        return await self._serve(request, body, rid, prompt, reply, api="chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/completions`` with a string (or token-id list) prompt."""
        try:
            body = await read_json(request)
            raw = body.get("prompt")
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str):
                raw = raw[0]
            if isinstance(raw, str) and raw:
                prompt = tok.encode(raw) or [tok.IM_END]
            elif isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
                prompt = list(raw)
            else:
                raise BadRequest("prompt: required non-empty string or token-id list", "prompt")
            rid = self._new_id("cmpl")
            reply = plan_reply(body, rid)
        except BadRequest as exc:
            return error_response(400, str(exc), "BadRequestError", exc.param)
        return await self._serve(request, body, rid, prompt, reply, api="completions")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/messages``: the Anthropic Messages API (stream or not)."""
        try:
            body = await read_json(request)
            max_tokens = _int_field(body, "max_tokens", 1)
            if max_tokens is None:
                raise BadRequest("max_tokens: required integer >= 1", "max_tokens")
            try:
                prompt = tok.render_messages(anth.chat_messages(body), body.get("tools"))
            except tok.TemplateError as exc:
                raise BadRequest(str(exc), "messages") from None
            rid = self._new_id("msg")
            extra = body.get("extra_body")
            in_extra = isinstance(extra, Mapping) and "tao_script" in extra
            if "tao_script" not in body and not in_extra:
                n = min(max_tokens, DEFAULT_OUTPUT_TOKENS)
                out = list(generated_token_ids(rid, n))
                reply = Reply(out, n, None, None, "length" if n == max_tokens else "stop")
            else:
                reply = plan_reply(body, rid)
        except BadRequest as exc:
            return anthropic_error(400, str(exc), "invalid_request_error")
        return await self._serve(request, body, rid, prompt, reply, api="messages")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """``POST /v1/responses``: the OpenAI Responses API (stream or not)."""
        try:
            body = await read_json(request)
            try:
                prompt = tok.render_messages(resp_api.chat_messages(body), body.get("tools"))
            except tok.TemplateError as exc:
                raise BadRequest(str(exc), "input") from None
            rid = self._new_id("resp")
            limit = _int_field(body, "max_output_tokens", 1)
            reply = plan_reply({**body, "max_tokens": limit}, rid)
        except BadRequest as exc:
            return error_response(400, str(exc), "BadRequestError", exc.param)
        return await self._serve(request, body, rid, prompt, reply, api="responses")

    async def _serve(
        self,
        request: web.Request,
        body: Mapping[str, Any],
        rid: str,
        prompt: list[int],
        reply: Reply,
        *,
        api: str,
    ) -> web.StreamResponse:
        session = request.headers.get("X-Session-ID") or body.get("user") or "anon"
        ereq = EngineRequest(rid, str(session), prompt, len(reply.output), reply.output)
        streaming = bool(body.get("stream"))
        try:
            waiter = self.runner.submit(ereq, streaming=streaming)
        except ValueError as exc:
            if api == "messages":
                return anthropic_error(400, str(exc), "invalid_request_error")
            return error_response(400, str(exc), "BadRequestError", "messages")  # or input
        ids = prompt if body.get("return_token_ids") is True and api != "messages" else None
        chat = api == "chat"
        try:
            if api == "responses":
                serve = resp_api.stream if streaming else resp_api.unary
                return await serve(self, request, body, rid, reply, waiter)
            if api == "messages":
                if streaming:
                    return await self._stream_message(request, rid, prompt, reply, waiter)
                return await self._unary_message(request, rid, reply, waiter)
            if streaming:
                opts = body.get("stream_options")
                usage = isinstance(opts, Mapping) and bool(opts.get("include_usage"))
                return await self._stream(
                    request, rid, reply, waiter, chat=chat, usage=usage, prompt_ids=ids
                )
            return await self._unary(request, rid, reply, waiter, chat=chat, prompt_ids=ids)
        except (asyncio.CancelledError, ConnectionResetError):
            self.runner.abort(rid)
            raise

    async def _wait_change(self, request: web.Request, waiter: Waiter) -> None:
        """Wait for the waiter to change; abort and raise when the client disconnected."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.changed.wait(), _DISCONNECT_POLL_S)
                waiter.changed.clear()
                return
            if _client_gone(request):
                raise ConnectionResetError("client disconnected")

    async def _finished(self, request: web.Request, waiter: Waiter) -> Completion | None:
        """Wait until the engine is done with the request: its completion, ``None`` if it
        failed (``waiter.error`` says why)."""
        while not waiter.done:
            await self._wait_change(request, waiter)
        return waiter.completion

    async def _content_runs(
        self, request: web.Request, reply: Reply, waiter: Waiter
    ) -> AsyncIterator[tuple[int, int]]:
        """``(start, end)`` of each run of content tokens the engine has newly written, until
        it is done; a handler streams ``reply.output[start:end]`` for each."""
        sent = 0
        while True:
            if not waiter.done:
                await self._wait_change(request, waiter)
            upto = min(waiter.tokens, reply.content_len)
            if upto > sent:
                yield sent, upto
                sent = upto
            if waiter.done:
                return

    async def _unary(
        self,
        request: web.Request,
        rid: str,
        reply: Reply,
        waiter: Waiter,
        *,
        chat: bool,
        prompt_ids: list[int] | None = None,
    ) -> web.StreamResponse:
        c = await self._finished(request, waiter)
        if c is None:
            return error_response(500, f"engine failed: {waiter.error}", "InternalServerError")
        content = tok.decode(reply.output[: reply.content_len])
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": content or None}
            if reply.tool_name is not None:
                message["tool_calls"] = [self._tool_call(rid, reply)]
            choice: dict[str, Any] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": content}
        choice.update(logprobs=None, finish_reason=reply.finish_reason)
        answer: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(c),
        }
        if prompt_ids is not None:
            choice["token_ids"] = list(reply.output)
            (answer if chat else choice)["prompt_token_ids"] = prompt_ids
        return web.json_response(answer)

    @staticmethod
    def _tool_call(rid: str, reply: Reply) -> dict[str, Any]:
        return {
            "id": f"call_{zlib.crc32(rid.encode()):08x}",
            "type": "function",
            "function": {"name": reply.tool_name, "arguments": reply.tool_args},
        }

    async def _stream(
        self,
        request: web.Request,
        rid: str,
        reply: Reply,
        waiter: Waiter,
        *,
        chat: bool,
        usage: bool,
        prompt_ids: list[int] | None = None,
    ) -> web.StreamResponse:
        resp = await _open_event_stream(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        out = reply.output
        ids_sent = 0  # with prompt_ids: output ids already streamed (vLLM return_token_ids)
        prompt_due = prompt_ids is not None and not chat  # completions: on the first choice

        async def send(choices: list[dict[str, Any]], **extra: Any) -> None:
            chunk = {"id": rid, "object": obj, "created": self.created, "model": self.model}
            chunk["choices"] = choices
            chunk.update(extra)
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")

        def choice(
            delta: dict[str, Any], finish: str | None = None, ids_to: int | None = None
        ) -> dict[str, Any]:
            nonlocal ids_sent, prompt_due
            if chat:
                c = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                text = delta.get("content", "")
                c = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            if prompt_ids is not None and ids_to is not None:
                c["token_ids"] = list(out[ids_sent:ids_to])
                ids_sent = max(ids_sent, ids_to)
                if prompt_due:
                    c["prompt_token_ids"] = prompt_ids
                    prompt_due = False
            return c

        if chat:
            first = {} if prompt_ids is None else {"prompt_token_ids": prompt_ids}
            await send([choice({"role": "assistant", "content": ""})], **first)
        async for sent, upto in self._content_runs(request, reply, waiter):
            text = _text_of(out[sent:upto], sent == 0)
            await send([choice({"content": text}, ids_to=upto)])
        c = waiter.completion
        if c is None:
            await send([choice({}, "error")])
        else:
            if reply.tool_name is not None and chat:
                call = self._tool_call(rid, reply)
                head = {
                    "index": 0,
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": reply.tool_name, "arguments": ""},
                }
                await send([choice({"tool_calls": [head]}, ids_to=len(out))])
                args = {"index": 0, "function": {"arguments": reply.tool_args}}
                await send([choice({"tool_calls": [args]}, ids_to=len(out))])
            await send([choice({}, reply.finish_reason, ids_to=len(out))])
            if usage:
                await send([], usage=_usage(c))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # -- Anthropic messages ----------------------------------------------------------------

    def _message_content(self, rid: str, reply: Reply) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if reply.content_len:
            text = tok.decode(reply.output[: reply.content_len])
            content.append({"type": "text", "text": text})
        if reply.tool_name is not None:
            block: dict[str, Any] = {"type": "tool_use", "id": anth.tool_use_id(rid)}
            block.update(name=reply.tool_name, input=anth.tool_input(reply.tool_args))
            content.append(block)
        return content

    async def _unary_message(
        self, request: web.Request, rid: str, reply: Reply, waiter: Waiter
    ) -> web.StreamResponse:
        c = await self._finished(request, waiter)
        if c is None:
            return anthropic_error(500, f"engine failed: {waiter.error}", "api_error")
        return web.json_response(
            {
                "id": rid,
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": self._message_content(rid, reply),
                "stop_reason": anth.stop_reason(reply.finish_reason),
                "stop_sequence": None,
                "usage": anth.usage(c),
            }
        )

    async def _stream_message(
        self, request: web.Request, rid: str, prompt: list[int], reply: Reply, waiter: Waiter
    ) -> web.StreamResponse:
        """Anthropic's event sequence; the input usage is known at once, the cached part and
        the output at the end (``message_delta``), as vLLM streams it."""
        resp = await _open_event_stream(request)
        start: dict[str, Any] = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(prompt), "output_tokens": 0},
        }
        await resp.write(_sse("message_start", {"type": "message_start", "message": start}))
        block = -1  # index of the open content block
        async for sent, upto in self._content_runs(request, reply, waiter):
            if block < 0:
                block = 0
                opening = {"type": "text", "text": ""}
                event = {"type": "content_block_start", "index": 0, "content_block": opening}
                await resp.write(_sse("content_block_start", event))
            delta = {"type": "text_delta", "text": _text_of(reply.output[sent:upto], sent == 0)}
            event = {"type": "content_block_delta", "index": 0, "delta": delta}
            await resp.write(_sse("content_block_delta", event))
        if block >= 0:
            await resp.write(_sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
        c = waiter.completion
        if c is None:
            error = {"type": "api_error", "message": f"engine failed: {waiter.error}"}
            await resp.write(_sse("error", {"type": "error", "error": error}))
        else:
            if reply.tool_name is not None:
                block += 1
                use: dict[str, Any] = {"type": "tool_use", "id": anth.tool_use_id(rid)}
                use.update(name=reply.tool_name, input={})
                event = {"type": "content_block_start", "index": block, "content_block": use}
                await resp.write(_sse("content_block_start", event))
                delta = {"type": "input_json_delta", "partial_json": reply.tool_args or ""}
                event = {"type": "content_block_delta", "index": block, "delta": delta}
                await resp.write(_sse("content_block_delta", event))
                stop = {"type": "content_block_stop", "index": block}
                await resp.write(_sse("content_block_stop", stop))
            ending = {"stop_reason": anth.stop_reason(reply.finish_reason), "stop_sequence": None}
            event = {"type": "message_delta", "delta": ending, "usage": anth.usage(c)}
            await resp.write(_sse("message_delta", event))
            await resp.write(_sse("message_stop", {"type": "message_stop"}))
        await resp.write_eof()
        return resp

    # -- the rest ------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        """``GET /v1/models``."""
        card = {
            "id": self.model,
            "object": "model",
            "created": self.created,
            "owned_by": "tao-simnode",
            "root": self.model,
            "max_model_len": self.runner.engine.num_gpu_blocks * self.runner.engine.block_size,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        """``GET /health`` and ``/healthz``: 200 while the node serves."""
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        """``GET /metrics``: vLLM's metric names in Prometheus text format."""
        return web.Response(text=self.metrics_text(), content_type="text/plain")

    def metrics_text(self) -> str:
        """Prometheus exposition of the engine's state with vLLM v1 names and labels."""
        e = self.runner.engine
        labels = f'engine="0",model_name="{self.model}"'
        rows = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                e.running,
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                e.waiting,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                e.kv_usage,
            ),
            (
                "vllm:prefix_cache_queries",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                e.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                e.prefix_cache_hits,
            ),
            (
                "vllm:num_preemptions",
                "counter",
                "Cumulative number of preemption from the engine.",
                e.num_preemptions,
            ),
            (
                "vllm:prompt_tokens",
                "counter",
                "Number of prefill tokens processed.",
                e.prompt_tokens_total,
            ),
            (
                "vllm:generation_tokens",
                "counter",
                "Number of generation tokens processed.",
                e.generation_tokens_total,
            ),
        ]
        out: list[str] = []
        for name, kind, help_text, value in rows:
            sample = f"{name}_total" if kind == "counter" else name
            out.append(f"# HELP {sample} {help_text}")
            out.append(f"# TYPE {sample} {kind}")
            out.append(f"{sample}{{{labels}}} {float(value)!r}")
        info = {
            "block_size": str(e.block_size),
            "cache_dtype": "auto",
            "enable_prefix_caching": "True",
            "engine": "0",
            "gpu_memory_utilization": "0.9",
            "model_name": self.model,
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(e.num_gpu_blocks),
            "prefix_caching_hash_algo": "builtin",
        }
        label_text = ",".join(f'{k}="{v}"' for k, v in info.items())
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f"vllm:cache_config_info{{{label_text}}} 1.0")
        # The Prometheus client's process collector, which vLLM's page carries too: telemetry
        # reads a change as an engine restart (services.telemetry.handlers).
        out.append("# HELP process_start_time_seconds Start time of the process since unix epoch")
        out.append("# TYPE process_start_time_seconds gauge")
        out.append(f"process_start_time_seconds {PROCESS_START!r}")
        return "\n".join(out) + "\n"
