"""Forwarding one request to a node and relaying the answer to the client.

Non-streaming: the node's status, content type and body go back unchanged. Every forwarded
answer carries the header ``X-TAO-Node`` naming the node that served it, and
``X-TAO-Session-Id`` naming the session it was served in (the client's own id, or the one the
gateway gave an unnamed conversation: what ``DELETE /v1/sessions/{id}`` takes).

Streaming: the node's SSE events go back one by one as they arrive (flushed per upstream
read), unchanged, except the usage-only chunk the gateway asked for on the client's behalf
(see :mod:`.responses`). In both, token ids the gateway asked for on its own behalf are taken
out (:mod:`.tokenids`). What a response says is read by a :data:`BodyReader` (non-streaming) or
a :class:`Tracker` (per SSE event), one pair per API (OpenAI here, Anthropic in
:mod:`.anthropic`, Responses in :mod:`.openai_responses`).

Timing: ``ttft_s`` is measured from the moment the gateway sends the request to the first
streamed chunk that carries output (see :class:`.responses.StreamStats`);
a non-streaming response shows no first token, so its ``ttft_s`` is ``None``. ``duration_s``
runs to the last byte.

Failures: a connection error before any answer raises :class:`UpstreamError` (the caller answers
502); a stream that breaks off after the client got its headers ends with one SSE ``error``
event and is reported with ``error`` set; ``abort`` (the node's
:meth:`.nodes.NodeDirectory.down` event) set while a forward waits ends it the same way, the
waiting request at once and the connection closed (a frozen engine answers nothing),
reported as ``upstream_node_down``; a client that goes away ends the forward at once and
closes the upstream connection, which makes vLLM abort the request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

import aiohttp
import orjson
from aiohttp import web

from services.gateway.responses import ResponseStats, SSESplitter, read_body

__all__ = [
    "CLIENT_CLOSED",
    "CONNECT_TIMEOUT_S",
    "NODE_HEADER",
    "SESSION_REPLY_HEADER",
    "BodyReader",
    "ForwardError",
    "Forwarded",
    "NodeDown",
    "Tracker",
    "UpstreamError",
    "anthropic_error_event",
    "describe",
    "forward_json",
    "forward_stream",
    "openai_error_event",
]

_T = TypeVar("_T")
NODE_HEADER: Final = "X-TAO-Node"
SESSION_REPLY_HEADER: Final = "X-TAO-Session-Id"
CONNECT_TIMEOUT_S: Final = 10.0
"""Longest wait for a TCP connection to a node; generation itself has no time limit."""

_PASS_HEADERS: Final = ("anthropic-version", "anthropic-beta")

BodyReader = Callable[[bytes], tuple[ResponseStats, bytes]]
"""Reads a whole response: what it says, and the bytes for the client."""


class Tracker(Protocol):
    """Reads a streamed response event by event (:class:`.responses.StreamStats`)."""

    first_token_seen: bool
    done: bool

    def observe(self, event: bytes) -> bytes | None:
        """Record one whole SSE event; the bytes for the client, or ``None`` to drop it."""
        ...

    def result(self) -> ResponseStats:
        """What the events so far said."""
        ...


class UpstreamError(Exception):
    """The node could not be reached or broke off before answering; ``kind`` names the failure."""

    def __init__(self, node_id: str, kind: str, detail: str) -> None:
        self.node_id = node_id
        self.kind = kind
        self.detail = detail
        super().__init__(f"node {node_id!r}: {kind}: {detail}")


@dataclass(frozen=True, slots=True)
class ForwardError:
    """Why one forward did not give the client a whole answer. ``kind`` is the outcome the
    request metrics count (``upstream_status_<n>``, ``upstream_<failure>`` of an
    :class:`UpstreamError`, ``upstream_incomplete``, ``unknown_node``, ``node_down``,
    ``client_closed``, ``internal_error``); ``detail`` says more. ``str()`` is the text the
    log line and the session's response event carry: ``"<kind>: <detail>"``, or the kind
    alone."""

    kind: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


CLIENT_CLOSED: Final = ForwardError("client_closed")


@dataclass(slots=True)
class Forwarded:
    """How one forward to ``node_id`` went: status (0 before an answer), what the node
    reported, timing, and the error if any. Filled in as the forward proceeds."""

    node_id: str
    session_id: str | None = None
    """The session's id as its client knows it (:data:`SESSION_REPLY_HEADER`)."""
    status: int = 0
    stats: ResponseStats = field(default_factory=ResponseStats)
    ttft_s: float | None = None
    duration_s: float = 0.0
    error: ForwardError | None = None

    @property
    def error_text(self) -> str | None:
        """The error as the log line and the session's response event carry it."""
        return None if self.error is None else str(self.error)

    def restart(self) -> None:
        """Forget an answer before the request is sent again (same node)."""
        self.status = 0
        self.stats = ResponseStats()
        self.ttft_s = None
        self.error = None


def upstream_headers(
    client_headers: Mapping[str, str], credentials: Mapping[str, str], extra: Mapping[str, str]
) -> dict[str, str]:
    """Headers sent to the node: JSON content type, ``credentials`` (:meth:`.auth.Auth.
    node_headers`: the client's ``Authorization`` / ``x-api-key``, or the gateway's own),
    Anthropic's ``anthropic-version`` / ``anthropic-beta``, and ``extra``."""
    out = {"Content-Type": "application/json", **credentials}
    for name in _PASS_HEADERS:
        value = client_headers.get(name)
        if value:
            out[name] = value
    out.update(extra)
    return out


class NodeDown(aiohttp.ClientConnectionError):
    """The node turned unhealthy while the forward waited on it."""

    def __init__(self) -> None:
        super().__init__("the node became unhealthy")


async def _unless(aw: Awaitable[_T], abort: asyncio.Event | None) -> _T:
    """``await aw``, or raise :class:`NodeDown` as soon as ``abort`` is set (``aw`` cancelled)."""
    if abort is None:
        return await aw
    task = asyncio.ensure_future(aw)
    if abort.is_set():
        task.cancel()
        raise NodeDown()
    waiter = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # cancelled from outside: take both down with it
        if task.done() and not task.cancelled() and task.exception() is None:
            close = getattr(task.result(), "close", None)
            if close is not None:  # a response that came at the same instant: let it go
                close()
        task.cancel()
        raise
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        raise NodeDown()
    return task.result()


def _close_on(abort: asyncio.Event | None, up: aiohttp.ClientResponse) -> asyncio.Task[None] | None:
    """A task that closes ``up`` when ``abort`` is set (its pending read then fails)."""
    if abort is None:
        return None

    async def watch() -> None:
        await abort.wait()
        up.close()

    return asyncio.create_task(watch())


def _kind(exc: BaseException, abort: asyncio.Event | None) -> str:
    """``node_down`` when the forward ended because the node turned unhealthy."""
    return "node_down" if isinstance(exc, NodeDown) or (abort and abort.is_set()) else "unreachable"


def describe(exc: BaseException) -> str:
    """An exception as an error text: its type, and its message when it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def forward_json(
    client: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    clock: Callable[[], float],
    done: Forwarded,
    read: BodyReader = read_body,
    abort: asyncio.Event | None = None,
) -> web.Response:
    """POST ``body`` to ``url``; fill ``done`` and return the node's answer for the client
    (the body as ``read`` gives it back for a 200, else unchanged); ``abort`` ends the wait
    (module docstring)."""
    start = clock()
    try:
        up = await _unless(client.post(url, data=orjson.dumps(body), headers=headers), abort)
        watch = _close_on(abort, up)
        try:
            data = await up.read()
            content_type = up.headers.get("Content-Type", "application/json")
            status = up.status
        finally:
            up.release()
            if watch is not None:
                watch.cancel()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamError(done.node_id, _kind(exc, abort), describe(exc)) from exc
    finally:
        done.duration_s = clock() - start
    done.status = status
    done.stats, out = read(data)
    if status >= 400:
        done.error = ForwardError(f"upstream_status_{status}")
    elif status == 200:
        data = out
    return web.Response(status=status, body=data, headers=_headers(content_type, done))


def _headers(content_type: str, done: Forwarded, **more: str) -> dict[str, str]:
    """A forwarded answer's headers: its type and :data:`NODE_HEADER`, the node that served it
    (what a client or ``tao demo`` reads to count node moves; vLLM's own ids name no node)."""
    out = {"Content-Type": content_type, NODE_HEADER: done.node_id, **more}
    if done.session_id is not None:
        out[SESSION_REPLY_HEADER] = done.session_id
    return out


def openai_error_event(message: str) -> bytes:
    """The SSE event an OpenAI client reads as a broken-off stream."""
    payload = {"error": {"message": message, "type": "upstream_error", "code": 502}}
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def anthropic_error_event(message: str) -> bytes:
    """The SSE ``error`` event of Anthropic's Messages streaming format."""
    payload = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


async def forward_stream(
    request: web.Request,
    client: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    clock: Callable[[], float],
    done: Forwarded,
    *,
    tracker: Tracker,
    read: BodyReader = read_body,
    before_done: Callable[[], None] | None = None,
    error_event: Callable[[str], bytes] = openai_error_event,
    abort: asyncio.Event | None = None,
) -> web.StreamResponse:
    """POST a streaming ``body`` to ``url``; relay the SSE events to the client as ``tracker``
    passes them, filling ``done`` as they pass (so a cancelled caller still reads what
    happened); an answer that is not an event stream is read whole by ``read``.

    ``before_done`` is called once, with ``done`` complete, just before the final ``[DONE]``
    event is written to the client (the caller starts its report there). ``error_event``
    writes the event that tells the client the node broke off (in the client's API format)."""
    start = clock()
    try:
        up = await _unless(client.post(url, data=orjson.dumps(body), headers=headers), abort)
        watch = _close_on(abort, up)
        try:
            content_type = up.headers.get("Content-Type", "")
            if up.status != 200 or not content_type.startswith("text/event-stream"):
                data = await up.read()
                done.status = up.status
                done.stats, _ = read(data)
                if up.status >= 400:
                    done.error = ForwardError(f"upstream_status_{up.status}")
                ctype = content_type or "application/json"
                return web.Response(status=up.status, body=data, headers=_headers(ctype, done))
            return await _relay_events(
                request, up, start, clock, done, tracker, before_done, error_event, abort
            )
        finally:
            if watch is not None:
                watch.cancel()
            up.close()  # no-op once fully read; else drops the connection: the node aborts
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise UpstreamError(done.node_id, _kind(exc, abort), describe(exc)) from exc
    finally:
        done.duration_s = clock() - start


async def _relay_events(
    request: web.Request,
    up: aiohttp.ClientResponse,
    start: float,
    clock: Callable[[], float],
    done: Forwarded,
    tracker: Tracker,
    before_done: Callable[[], None] | None,
    error_event: Callable[[str], bytes],
    abort: asyncio.Event | None = None,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200,
        headers=_headers(
            up.headers.get("Content-Type", "text/event-stream"),
            done,
            **{"Cache-Control": "no-cache"},
        ),
    )
    done.status = 200
    splitter = SSESplitter()
    try:
        await response.prepare(request)
        try:
            async for chunk in up.content.iter_any():
                out = [o for e in splitter.feed(chunk) if (o := tracker.observe(e)) is not None]
                if done.ttft_s is None and tracker.first_token_seen:
                    done.ttft_s = clock() - start
                done.stats = tracker.result()
                if tracker.done and before_done is not None:
                    done.duration_s = clock() - start
                    before_done()
                    before_done = None
                if out:
                    await response.write(b"".join(out))
            rest = splitter.rest()
            if rest:
                await response.write(rest)
        except (aiohttp.ClientError, TimeoutError) as exc:
            if isinstance(exc, ConnectionResetError):  # writing to the client failed
                raise
            kind = "node_down" if abort is not None and abort.is_set() else "broken"
            done.error = ForwardError(f"upstream_{kind}", describe(exc))
            await response.write(error_event("the model node broke off the stream"))
        await response.write_eof()
    except ConnectionResetError:
        done.error = CLIENT_CLOSED
    done.stats = tracker.result()
    if done.error is None and not tracker.done:
        done.error = ForwardError("upstream_incomplete")
    return response
