"""The gateway's aiohttp application and its service entry point.

``create_app(settings, bus, store=...)`` builds the app; starting it (``AppRunner.setup()``)
opens the HTTP client to the nodes and starts the bus consumers, cleaning up closes them. Serve
it with ``handler_cancellation=True`` (as :func:`serve` does, and aiohttp's ``TestServer``): a
client that disconnects then cancels its handler, which releases a held request at once
(``SessionCancel(reason="client_closed")``). Without it a held request notices only at its
hold timeout.

Placements: an ephemeral JetStream consumer of ``tao.v1.placement.<gateway_id>`` that starts
with the placements published after it is created (``deliver="new"``). Held requests exist only
in this process, so a restarted gateway has no older placement to act on. Sessions admitted
before a restart (or whose placement was missed) are found in the state store instead: read
once when their request arrives, and re-read every ``store_recheck_s`` while it is held
(:mod:`.store_check`). Without a store (``store=None``, tests) the gateway relies on placements
alone. The service reads the store of ``settings.domain`` (read only).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import aiohttp
import anyio
from aiohttp import web

from services._common import serve_forever, store_from
from services.gateway import hooks
from services.gateway.handlers import BusHandlers, HttpHandlers, decode_placement
from services.gateway.hook_limit import HookLimiter
from services.gateway.nodes import NodeDirectory
from services.gateway.proxy import CONNECT_TIMEOUT_S
from services.gateway.relay import Relay
from services.gateway.store_check import STORE_RECHECK_S
from services.gateway.tokenids import TokenIdNodes
from shared.contracts import NodeStatus, SessionEnd, decode, subjects
from shared.infra.busapi import MessageBus, Subscription
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["NAME", "RELAY", "create_app", "main", "serve"]

NAME = "gateway"
RELAY = web.AppKey("relay", Relay)
_SUBSCRIPTIONS = web.AppKey("subscriptions", list[Subscription])


def _decode_node_status(data: bytes) -> NodeStatus:
    return decode(data, NodeStatus)


def _decode_session_end(data: bytes) -> SessionEnd:
    return decode(data, SessionEnd)


def create_app(
    settings: Settings,
    bus: MessageBus,
    *,
    node_urls: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.time,
    store: StateStore | None = None,
    store_recheck_s: float = STORE_RECHECK_S,
    name: str = NAME,
) -> web.Application:
    """The gateway app for ``settings`` on ``bus``; nodes from ``node_urls`` (else
    ``settings.nodes``) and from node status messages; admissions also read from ``store``
    (module docstring). Its lines are logged as ``component=name``, as each service's."""
    static = dict(node_urls) if node_urls is not None else {n.id: n.url for n in settings.nodes}
    relay = Relay(
        settings,
        bus,
        NodeDirectory(static),
        log=get_logger(name),
        clock=clock,
        store=store,
        store_recheck_s=store_recheck_s,
        token_ids=TokenIdNodes(n.id for n in settings.nodes if not n.return_token_ids),
    )
    http = HttpHandlers(relay)
    # aiohttp reads at most 1 MiB by default: an agent's prompt with its tools and history
    # passes that; the limit is TAO_MAX_BODY_BYTES, and a larger body is answered 413 (relay)
    app = web.Application(client_max_size=settings.max_body_bytes)
    app[RELAY] = relay
    app[_SUBSCRIPTIONS] = []
    app.router.add_post("/v1/chat/completions", http.chat_completions)
    app.router.add_post("/v1/completions", http.completions)
    app.router.add_post("/v1/messages", http.messages)
    app.router.add_get("/v1/models", http.models)
    app.router.add_delete("/v1/sessions/{session_id}", http.delete_session)
    app.router.add_get("/healthz", http.healthz)
    app.router.add_get("/metrics", http.metrics)
    limiter = HookLimiter(settings.hook_rate, settings.hook_burst)
    hooks.install(app, bus, relay.auth, relay.metrics, limiter, relay.log)  # /hooks/{harness}
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    relay = app[RELAY]
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
    relay.client = aiohttp.ClientSession(timeout=timeout)
    on = BusHandlers(relay)
    bus = relay.bus
    subs = app[_SUBSCRIPTIONS]
    subs.append(
        await bus.consume(
            subjects.STREAM_PLACEMENT,
            NAME,
            decode_placement,
            on.on_placement,
            filter_subject=subjects.placement(relay.settings.gateway_id),
            ephemeral=True,
            deliver="new",
        )
    )
    subs.append(
        await bus.subscribe(subjects.node_statuses(), NAME, _decode_node_status, on.on_node_status)
    )
    subs.append(
        await bus.subscribe(
            subjects.session_events("end"), NAME, _decode_session_end, on.on_session_end
        )
    )


async def _stop(app: web.Application) -> None:
    relay = app[RELAY]
    for sub in app[_SUBSCRIPTIONS]:
        await sub.stop()
    app[_SUBSCRIPTIONS].clear()
    await relay.stored.close()
    await relay.flush()
    if relay.client is not None:
        await relay.client.close()
        relay.client = None


async def serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start serving ``app`` on ``host:port`` (handler cancellation on); return the runner."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:  # a busy port: close what start-up opened (the upstream client)
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
        raise
    return runner


async def main(settings: Settings, ctx: ServiceContext) -> None:
    """Service entry point for ``shared.infra.runner.run_service``: serve until cancelled."""
    app = create_app(settings, ctx.require_bus(), store=store_from(settings, ctx), name=ctx.name)
    runner = await serve(app, settings.gateway_host, settings.gateway_port)
    app[RELAY].log.info(
        "gateway_listening",
        host=settings.gateway_host,
        port=settings.gateway_port,
        gateway_id=settings.gateway_id,
    )
    try:
        await serve_forever()
    finally:
        with anyio.CancelScope(shield=True):  # the runner cancels through an anyio scope
            await runner.cleanup()
