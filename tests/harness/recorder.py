"""A recording, scripting HTTP proxy in front of TAO's gateway, for the real-client tests.

A real harness client (Claude Code, mini-swe-agent, OpenCode) cannot be told to send the sim
node's ``tao_script``, so this proxy adds it: the client talks to the proxy, the proxy records
the request exactly as the client sent it (method, path, headers, JSON body), adds a
``tao_script`` to model requests and forwards everything to the gateway, streaming the answer
back unchanged. The script asks for the shell tool (``Bash`` or ``bash``, whichever the request
offers) to run ``commands[n]``, ``n`` being the number of tool results the conversation holds,
and for a short text answer once they have all run: so each client runs exactly those real
commands, in order, and stops (mini-swe-agent stops on its submit command instead).

It runs on its own event loop in a daemon thread (the tests drive blocking subprocesses).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from shared.infra.embedded import free_port

__all__ = [
    "TEXT",
    "Recorded",
    "Recorder",
    "Scripter",
    "script_for",
    "tool_results",
    "tool_script",
]

_HOP: frozenset[str] = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding"}
)
MODEL_PATHS: frozenset[str] = frozenset({"/v1/messages", "/v1/chat/completions", "/v1/responses"})
"""Model endpoints whose requests get a ``tao_script``."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the client sent it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    scripted: dict[str, Any] | None
    status: int | None = None

    def header(self, name: str) -> str | None:
        """A header's value, the name matched case-insensitively (as HTTP does)."""
        low = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == low), None)


def _tool_names(tools: object) -> list[str]:
    """Names of the tools a request offers (Anthropic ``{name}`` or OpenAI ``{function}``)."""
    names: list[str] = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else tool.get("name")
        if isinstance(name, str):
            names.append(name)
    return names


def _properties(tools: object, name: str) -> set[str]:
    """The argument names tool ``name``'s JSON schema declares."""
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        fn = tool.get("function")
        spec = fn if isinstance(fn, Mapping) else tool
        if spec.get("name") != name:
            continue
        schema = spec.get("input_schema") or spec.get("parameters")
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        return set(props) if isinstance(props, Mapping) else set()
    return set()


def tool_results(messages: object) -> int:
    """How many tool results the conversation carries (OpenAI ``tool`` messages, Anthropic
    ``tool_result`` blocks, Responses ``function_call_output`` items)."""
    count = 0
    for msg in messages if isinstance(messages, list) else ():
        if not isinstance(msg, Mapping):
            continue
        if msg.get("role") == "tool" or msg.get("type") == "function_call_output":
            count += 1
        content = msg.get("content")
        if isinstance(content, list):
            count += sum(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)
    return count


TEXT: dict[str, Any] = {"output_tokens": 6, "tool_call": None}
"""The script of a plain text answer (no tool call)."""


def tool_script(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The script of an answer that calls tool ``name``."""
    return {"output_tokens": 6, "tool_call": {"name": name, "arguments": dict(arguments)}}


def script_for(body: Mapping[str, Any], commands: Sequence[str]) -> dict[str, Any]:
    """The sim node's script for a model request: the next of ``commands`` as a shell tool
    call while the request offers one, then text (module docstring)."""
    names = _tool_names(body.get("tools"))
    shell = next((n for n in SHELL_TOOLS if n in names), None)
    done = tool_results(body.get("messages", body.get("input")))
    if shell is None or done >= len(commands):
        return TEXT
    props = _properties(body.get("tools"), shell)
    args: dict[str, Any] = {"command": commands[done]}
    if "cmd" in props:  # Codex's exec_command
        args = {"cmd": commands[done]}
    elif shell == "shell":  # Codex's shell: argv
        args = {"command": ["bash", "-lc", commands[done]]}
    if "description" in props:
        args["description"] = "Wait one second"
    return tool_script(shell, args)


SHELL_TOOLS = ("Bash", "bash", "exec_command", "shell_command", "shell")
"""Shell tools by name: Claude Code's, OpenCode's and mini-swe-agent's, Codex's."""


Scripter = Callable[[Mapping[str, Any], Mapping[str, str]], dict[str, Any]]
"""Chooses the script of a model request from its body and headers."""


@dataclass
class Recorder:
    """The proxy: ``url`` to give the client, ``requests`` what it sent (in arrival order)."""

    upstream: str
    commands: tuple[str, ...] = ("sleep 1",)
    scripter: Scripter | None = None
    """Overrides ``commands`` (e.g. a parent agent that starts a sub-agent)."""
    requests: list[Recorded] = field(default_factory=list)
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def model_requests(self) -> list[Recorded]:
        with self._lock:
            return [r for r in self.requests if r.path in MODEL_PATHS and r.method == "POST"]

    def all(self) -> list[Recorded]:
        with self._lock:
            return list(self.requests)

    def start(self) -> Recorder:
        self.port = free_port()
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="harness-recorder", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("recorder did not start in 10 s")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        self._loop = None

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = raw.decode(errors="replace")
        scripted: dict[str, Any] | None = None
        out = raw
        if request.method == "POST" and request.path in MODEL_PATHS and isinstance(body, dict):
            if self.scripter is not None:
                scripted = self.scripter(body, request.headers)
            else:
                scripted = script_for(body, self.commands)
            out = json.dumps({**body, "tao_script": scripted}).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        index = self._record(request, body, scripted)
        target = self.upstream + request.path_qs
        timeout = aiohttp.ClientTimeout(total=300)
        async with (
            aiohttp.ClientSession(auto_decompress=False) as client,
            client.request(
                request.method, target, data=out or None, headers=headers, timeout=timeout
            ) as up,
        ):
            self._set_status(index, up.status)
            resp = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in _HOP and k.lower() != "content-encoding":
                    resp.headers[k] = v
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    def _record(self, request: web.Request, body: Any, scripted: dict[str, Any] | None) -> int:
        rec = Recorded(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers=dict(request.headers.items()),
            body=body,
            scripted=scripted,
        )
        with self._lock:
            self.requests.append(rec)
            return len(self.requests) - 1

    def _set_status(self, index: int, status: int) -> None:
        with self._lock:
            old = self.requests[index]
            self.requests[index] = Recorded(
                old.method, old.path, old.query, old.headers, old.body, old.scripted, status
            )
