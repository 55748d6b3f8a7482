"""Client connections: a header deadline, a cap below the file limit, and who gives way.

aiohttp's server (3.14, ``aiohttp/web_protocol.py``) bounds a connection only by its
keep-alive timeout (``RequestHandler.__init__``, 3,630 s by default), armed at the accept
(``connection_made``) and after each response (``start``); it has no deadline for a request's
headers and no bound on open connections. 300 clients that send a request line and one header
each then hold 300 file descriptors for an hour, and past the process's file limit the accept
loop fails (``Too many open files``) while ``/healthz`` waits in the listen backlog. So the
gateway serves through :class:`GuardedSite`, whose connections (:class:`GuardedHandler`) add:

* **a header deadline**: a request's headers must be complete ``TAO_HEADER_TIMEOUT_S`` after
  the accept, or after the first byte of a later request on the connection; else the
  connection is closed. The keep-alive timeout (``TAO_KEEPALIVE_S``, ``server_args``) bounds an
  idle connection; a body is bounded where it is read (:mod:`.bodies`).
* **a cap on open connections**: ``TAO_MAX_CONNECTIONS``, and at most half of the file
  descriptors the limit leaves after :data:`OTHER_FDS` (each client connection may need one
  connection to a node). At the cap a new connection takes the place of the oldest one that
  is not serving a request (idle, or still sending its headers); when every one is serving,
  the new one is answered 503 with ``Retry-After`` and closed. A client that opens many
  connections and sends nothing therefore never locks others out: its oldest give way.

:func:`raise_file_limit` raises the process's soft ``RLIMIT_NOFILE`` to its hard limit at
start-up (where the platform has one), as servers that hold many sockets do.
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = [
    "OTHER_FDS",
    "ConnectionGuard",
    "GuardedHandler",
    "GuardedSite",
    "connection_cap",
    "raise_file_limit",
]

OTHER_FDS: Final = 64
"""Descriptors kept for everything but client connections and their node connections: the
listening socket, NATS, Redis, the event loop's own, logs."""
_NO_ROOM_BODY: Final = (
    b'{"error":{"type":"service_unavailable","message":"too many open connections; retry"}}'
)
_NO_ROOM: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_NO_ROOM_BODY), _NO_ROOM_BODY)
)
"""The answer to a connection there is no room for (written before its request is read)."""


def raise_file_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit where allowed; the ``(soft, hard)``
    limits in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):  # a platform that refuses: keep what we have
            pass
    return soft, hard


def connection_cap(wanted: int, soft_limit: int) -> int:
    """Open client connections allowed: ``wanted``, and at most half of what ``soft_limit``
    leaves after :data:`OTHER_FDS` (at least 1)."""
    if soft_limit == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, (soft_limit - OTHER_FDS) // 2))


@dataclass(slots=True)
class ConnectionGuard:
    """The open connections of one server and their bounds (module docstring)."""

    cap: int
    header_timeout_s: float
    open: dict[GuardedHandler, None] = field(default_factory=dict)
    evicted: int = 0
    refused: int = 0
    header_timeouts: int = 0

    def opened(self, conn: GuardedHandler) -> bool:
        """Make room for ``conn``; ``False``: there is none (every connection serves)."""
        if len(self.open) >= self.cap:
            victim = next((c for c in self.open if not c.busy), None)
            if victim is None:
                self.refused += 1
                return False
            self.evicted += 1
            self.open.pop(victim, None)
            victim.force_close()
        self.open[conn] = None
        return True

    def closed(self, conn: GuardedHandler) -> None:
        self.open.pop(conn, None)


class GuardedHandler(RequestHandler):
    """aiohttp's connection protocol with a header deadline and a place in a
    :class:`ConnectionGuard`."""

    def __init__(self, manager: web.Server, *, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.guard = guard
        self.busy = False
        """A request's headers are in and its handler has not finished answering."""
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if not self.guard.opened(self):
            assert isinstance(transport, asyncio.Transport)
            transport.write(_NO_ROOM)
            self.force_close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if data and not self.busy and self._header_timer is None:
            self._arm()  # the first byte of a later request on this connection
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.guard.closed(self)
        self._disarm()
        super().connection_lost(exc)

    def headers_done(self) -> None:
        """A request's headers are complete: its handler starts."""
        self.busy = True
        self._disarm()

    async def finish_response(self, request: Any, resp: Any, start_time: Any) -> Any:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self.busy = False

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self._header_timer = loop.call_later(self.guard.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if not self.busy:
            self.guard.header_timeouts += 1
            self.force_close()


def _marking(factory: Callable[..., web.BaseRequest]) -> Callable[..., web.BaseRequest]:
    """``factory`` (the server's request factory, called once a request's headers are in)
    that first tells a :class:`GuardedHandler` so."""

    def make(message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        if isinstance(protocol, GuardedHandler):
            protocol.headers_done()
        return factory(message, payload, protocol, writer, task)

    return make


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are :class:`GuardedHandler` under ``guard``;
    ``handler_args``: the request handlers' arguments (``keepalive_timeout``, …)."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        guard: ConnectionGuard,
        handler_args: dict[str, Any],
    ) -> None:
        super().__init__(runner)
        self.host, self.port, self.guard, self.handler_args = host, port, guard, handler_args

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None, "runner.setup() makes the server"
        server.request_factory = _marking(server.request_factory)
        loop = asyncio.get_running_loop()

        def protocol() -> GuardedHandler:
            return GuardedHandler(server, guard=self.guard, loop=loop, **self.handler_args)

        # a listen backlog as deep as the cap (the kernel clamps it to net.core.somaxconn):
        # with asyncio's 100, a burst of 300 connects overflowed it and a /healthz SYN was
        # dropped and sent again a second later (benchmarks/gateway_abuse.py)
        backlog = max(128, self.guard.cap)
        self._server = await loop.create_server(protocol, self.host, self.port, backlog=backlog)
        sockets = getattr(self._server, "sockets", None)
        if sockets:
            self.port = sockets[0].getsockname()[1]
