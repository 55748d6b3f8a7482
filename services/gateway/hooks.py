"""``POST /hooks/{harness}``: harness hooks over HTTP, forwarded to the tools service.

Claude Code can send a hook's JSON input as the body of a POST instead of running a command
(hook type ``http``, with ``url``, optional ``headers``, ``timeout``; a non-2xx answer or a
timeout is a non-blocking error for the agent: https://code.claude.com/docs/en/hooks, "HTTP
hook fields"). The gateway accepts the same body as ``tao hook <harness>`` reads on stdin and
forwards it the same way: bytes unparsed on ``tao.v1.hook.<token>``
(:func:`shared.contracts.subjects.hook_events`) with the receive time in ``Tao-Received-At``;
the tools service maps and validates it (:mod:`services.tools.hooks`).

With a tenants file (``TAO_TENANTS_FILE``, :mod:`.auth`) a post needs a hook token
(``Authorization: Bearer <token>`` or ``X-TAO-Hook-Token``), else 401; the payload goes out
with the token's tenant in the ``Tao-Tenant`` header, and the tools service serves its session
ids as that tenant's. A session posting faster than ``TAO_HOOK_RATE`` (burst
``TAO_HOOK_BURST``), or a tenant faster than ``TAO_HOOK_TENANT_RATE`` over all its sessions,
gets 429 with ``Retry-After`` (:mod:`.hook_limit`). A payload whose session id is no id (over
512 characters, or a control character: :mod:`.ids`) is 400 naming the field and the cap,
before anything is kept for it. Counted in
``tao_gateway_hooks_total{result}``: ``forwarded``, ``dropped``, ``unauthorized``,
``not_found``, ``bad_request``, ``rate_limited``.

The answer never waits for the bus: 200 ``{}`` (no decision, for Claude Code) at once, and the
payload goes to a queue that one task publishes in arrival order. A bus failure, or a full
queue (:data:`QUEUE_LIMIT` payloads waiting), drops the payload with a warning and still
answers 200: a hook must never block or fail its agent. An unknown harness is 404; a body
that is not a JSON object (not strict JSON, nested deeper than the model endpoints allow, an
array or a string) is 400 naming what is wrong and where, counted as ``bad_request``. At most
``MAX_HOOK_BYTES`` of the body are read; a longer body is forwarded as the same oversized
marker the hook process sends (:func:`shared.harness.hookclient.oversized_marker`), which the tools
service dead-letters as oversized.

``install(app, bus, auth, metrics)`` adds the route and stops the queue on the app's cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Final

from aiohttp import web
from structlog.typing import FilteringBoundLogger

from services.gateway.auth import Auth
from services.gateway.bodies import BodyRefused, body_limits, read_raw
from services.gateway.hook_limit import DEFAULT_BURST, DEFAULT_RATE, HookLimiter, named_session
from services.gateway.ids import id_problem
from services.gateway.metrics import GatewayMetrics
from services.gateway.requests import BadRequest, read_json
from shared.contracts import subjects
from shared.harness.base import MAX_HOOK_BYTES, RECEIVED_AT_HEADER
from shared.harness.hookclient import oversized_marker
from shared.harness.registry import UnknownHarnessError, find
from shared.infra.busapi import MessageBus
from shared.infra.logging import get_logger
from shared.infra.tenants import TENANT_HEADER

__all__ = ["QUEUE_LIMIT", "HookForwarder", "hook_problem", "install", "read_capped"]

QUEUE_LIMIT: Final = 4096
_STOP_WAIT_S: Final = 2.0
_RATE_LIMITED: Final = (
    "too many hook events of this session (TAO_HOOK_RATE, TAO_HOOK_BURST) or tenant "
    "(TAO_HOOK_TENANT_RATE, TAO_HOOK_TENANT_BURST)"
)
_NEEDS_TOKEN: Final = (
    "a valid hook token is required (Authorization: Bearer <token>, or X-TAO-Hook-Token)"
)
_log = get_logger("services.gateway.hooks")

_Item = tuple[str, bytes, dict[str, str]]


class HookForwarder:
    """The ``POST /hooks/{harness}`` handler and its ordered publishing queue."""

    def __init__(
        self,
        bus: MessageBus,
        *,
        auth: Auth | None = None,
        metrics: GatewayMetrics | None = None,
        limiter: HookLimiter | None = None,
        clock: Callable[[], float] = time.time,
        log: FilteringBoundLogger | None = None,
    ) -> None:
        self.bus = bus
        self.log = _log if log is None else log
        self.auth = Auth(None) if auth is None else auth
        self.metrics = metrics
        self.limiter = HookLimiter(DEFAULT_RATE, DEFAULT_BURST) if limiter is None else limiter
        self.clock = clock
        self.queue: asyncio.Queue[_Item] = asyncio.Queue(QUEUE_LIMIT)
        self.worker: asyncio.Task[None] | None = None
        self.forwarded = 0
        self.dropped = 0

    async def post(self, request: web.Request, body: bytes | None = None) -> web.Response:
        """Queue the body for ``tao.v1.hook.<token>`` and answer 200 ``{}`` (404: no harness);
        ``body``: already read by :func:`read_capped` (a gateway of several domains reads it
        to route the post)."""
        name = request.match_info["harness"]
        caller = self.auth.hook(request.headers)
        if caller is None:
            self._count("unauthorized")
            return _error(401, "unauthorized", _NEEDS_TOKEN)
        try:
            token = find(name).token
        except UnknownHarnessError as exc:
            self._count("not_found")
            return _error(404, "not_found", str(exc))
        at = self.clock()
        if body is None:
            body = await read_capped(request)
        if len(body) > MAX_HOOK_BYTES:
            body = oversized_marker(body, len(body))  # the tools service dead-letters it
        else:
            problem = hook_problem(body)
            if problem is not None:
                self._count("bad_request")
                return _error(400, "invalid_request_error", problem)
        field, session = named_session(body)
        problem = id_problem(session) if session else None
        if problem is not None:  # refused before any bucket is kept for it
            self._count("bad_request")
            return _error(400, "invalid_request_error", f"hook '{field}' {problem}")
        wait = self.limiter.take((caller.name, token, session), at)
        if wait > 0:
            self._count("rate_limited")
            return web.json_response(
                {"error": {"type": "rate_limited", "message": _RATE_LIMITED}},
                status=429,
                headers={"Retry-After": HookLimiter.retry_after(wait)},
            )
        headers = {RECEIVED_AT_HEADER: f"{at:.6f}"}
        if caller.name:
            headers[TENANT_HEADER] = caller.name
        try:
            self.queue.put_nowait((subjects.hook_events(token), body, headers))
        except asyncio.QueueFull:
            self.dropped += 1
            self._count("dropped")
            self.log.warning("hook_dropped", harness=token, reason="queue full", size=len(body))
        else:
            if self.worker is None or self.worker.done():
                self.worker = asyncio.create_task(self._publish_all())
        return web.json_response({})

    async def _publish_all(self) -> None:
        while True:
            subject, body, headers = await self.queue.get()
            try:
                await self.bus.publish(subject, body, headers)
                self.forwarded += 1
                self._count("forwarded")
            except Exception as exc:  # the agent was answered already: log and go on
                self.dropped += 1
                self._count("dropped")
                self.log.warning(
                    "hook_publish_failed", subject=subject, size=len(body), error=str(exc)
                )
            finally:
                self.queue.task_done()

    def _count(self, result: str) -> None:
        if self.metrics is not None:
            self.metrics.hooks.inc(result=result)

    async def stop(self) -> None:
        """Publish what is queued (for up to two seconds), then stop the task."""
        if self.worker is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.queue.join(), _STOP_WAIT_S)
        self.worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.worker
        self.worker = None


def hook_problem(body: bytes) -> str | None:
    """Why ``body`` is no hook payload (strict JSON, at most
    :data:`~.requests.MAX_BODY_DEPTH` levels deep, an object), naming what is wrong and
    where; ``None`` for a payload the tools service can map."""
    try:
        doc = read_json(body)
    except BadRequest as exc:
        return exc.message.replace("request body", "hook body", 1)
    if not isinstance(doc, dict):
        kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
        kind = kinds.get(type(doc), "a number")
        return f"hook body must be a JSON object (the harness's hook input), got {kind}"
    return None


async def read_capped(request: web.Request, limit: int = MAX_HOOK_BYTES) -> bytes:
    """Up to ``limit`` + 1 bytes of the body (more means oversized), inflated and in time as
    every body (:func:`.bodies.read_raw`); a body that cannot be read so is answered with
    the refusal's status (an ``HTTPException``: 400, 408 or 415)."""
    try:
        return await read_raw(request, body_limits(request), cap=limit, keep=True)
    except BodyRefused as exc:
        raise exc.http_error() from None


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"error": {"type": kind, "message": message}}, status=status)


def install(
    app: web.Application,
    bus: MessageBus,
    auth: Auth | None = None,
    metrics: GatewayMetrics | None = None,
    limiter: HookLimiter | None = None,
    log: FilteringBoundLogger | None = None,
) -> HookForwarder:
    """Serve ``POST /hooks/{harness}`` on ``app``, publishing on ``bus``; ``auth`` checks hook
    tokens (``None``: none needed), ``metrics`` counts the posts, ``limiter`` caps each
    session's rate (:mod:`.hook_limit`; default 20/s, burst 200), ``log`` is the service's
    logger (``None``: this module's, for a forwarder on its own)."""
    forwarder = HookForwarder(bus, auth=auth, metrics=metrics, limiter=limiter, log=log)
    app.router.add_post("/hooks/{harness}", forwarder.post)

    async def _stop(_: web.Application) -> None:
        await forwarder.stop()

    app.on_cleanup.append(_stop)
    return forwarder
