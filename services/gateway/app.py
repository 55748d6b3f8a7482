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

import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
import anyio
import orjson
from aiohttp import web

from services._common import serve_forever, store_from
from services.gateway import gatewaykey, hooks, jsonscan
from services.gateway.apis import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Api
from services.gateway.bodies import BODY_LIMITS, BodyLimits, server_args
from services.gateway.cluster_metrics import cluster_lines
from services.gateway.connections import (
    ConnectionGuard,
    GuardedSite,
    connection_cap,
    raise_file_limit,
)
from services.gateway.domains import DomainRouter
from services.gateway.gatewaykey import KeyPolicy
from services.gateway.handlers import (
    BusHandlers,
    HttpHandlers,
    bad_delete,
    decode_placement,
    ready_response,
)
from services.gateway.hook_limit import HookLimiter
from services.gateway.hook_limit import session_of as hook_session
from services.gateway.metrics import labelled_union
from services.gateway.nodes import NodeDirectory
from services.gateway.proxy import CONNECT_TIMEOUT_S
from services.gateway.ready import readiness
from services.gateway.relay import Relay
from services.gateway.store_check import STORE_RECHECK_S
from services.gateway.tokenids import TokenIdNodes
from shared.contracts import NodeStatus, SessionEnd, decode, subjects
from shared.contracts.domain import DomainLoadReport
from shared.infra.bus import Bus
from shared.infra.busapi import Delivery, MessageBus, Subscription
from shared.infra.logging import get_logger
from shared.infra.nodesfile import domain_nodes
from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["HOOKS", "NAME", "RELAY", "ROUTER", "create_app", "create_domains_app", "main", "serve"]

NAME = "gateway"
RELAY = web.AppKey("relay", Relay)
HOOKS = web.AppKey("hooks", hooks.HookForwarder)
ROUTER = web.AppKey("router", DomainRouter)
_SUBSCRIPTIONS = web.AppKey("subscriptions", list[Subscription])
_DOMAIN_APPS = web.AppKey("domain_apps", dict[str, web.Application])


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
    keys: KeyPolicy | None = None,
) -> web.Application:
    """The gateway app for ``settings`` on ``bus``; nodes from ``node_urls`` (else
    ``settings.nodes``) and from node status messages; admissions also read from ``store``
    (module docstring). Its lines are logged as ``component=name``, as each service's.
    ``keys``: who may call (:mod:`.gatewaykey`; ``None``: resolved from ``settings``)."""
    keys = keys if keys is not None else gatewaykey.resolve(settings)
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
        key=keys.key if keys.mode == "key" else None,
    )
    http = HttpHandlers(relay)
    # aiohttp reads at most 1 MiB by default: an agent's prompt with its tools and history
    # passes that; the limit is TAO_MAX_BODY_BYTES, and a larger body is answered 413 (relay)
    app = web.Application(
        client_max_size=settings.max_body_bytes, handler_args=server_args(settings)
    )
    app[BODY_LIMITS] = BodyLimits.of(settings)
    app[RELAY] = relay
    app[_SUBSCRIPTIONS] = []
    app.router.add_post("/v1/chat/completions", http.chat_completions)
    app.router.add_post("/v1/completions", http.completions)
    app.router.add_post("/v1/messages", http.messages)
    app.router.add_post("/v1/responses", http.responses)
    app.router.add_get("/v1/models", http.models)
    app.router.add_delete("/v1/sessions/{session_id}", http.delete_session)
    app.router.add_get("/healthz", http.healthz)
    app.router.add_get("/readyz", http.readyz)
    app.router.add_get("/metrics", http.metrics)
    limiter = HookLimiter(
        settings.hook_rate,
        settings.hook_burst,
        tenant_rate=settings.hook_tenant_rate,
        tenant_burst=settings.hook_tenant_burst,
    )
    app[HOOKS] = hooks.install(app, bus, relay.auth, relay.metrics, limiter, relay.log)
    app.on_startup.append(_start)
    app.on_cleanup.append(_stop)
    return app


async def _start(app: web.Application) -> None:
    await anyio.to_thread.run_sync(jsonscan.warm)  # compiled (or loaded) before any request
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


def create_domains_app(
    settings: Settings,
    links: Mapping[str, tuple[Settings, MessageBus, StateStore | None]],
    *,
    clock: Callable[[], float] = time.time,
    name: str = NAME,
    keys: KeyPolicy | None = None,
) -> web.Application:
    """One gateway for several domains (:mod:`.domains`): ``links`` maps each domain, in
    order, to its settings (its nodes, namespace and domain), bus and store. Each domain gets
    the app :func:`create_app` builds, started and cleaned up with this one; this app routes
    each request to one of them. ``keys``: as :func:`create_app`'s, the same for every
    domain."""
    keys = keys if keys is not None else gatewaykey.resolve(settings)
    apps = {
        d: create_app(dsettings, bus, store=store, clock=clock, name=name, keys=keys)
        for d, (dsettings, bus, store) in links.items()
    }
    router = DomainRouter({d: a[RELAY] for d, a in apps.items()}, reserve=settings.reserve_tokens)
    http = {d: HttpHandlers(a[RELAY]) for d, a in apps.items()}
    front = web.Application(
        client_max_size=settings.max_body_bytes, handler_args=server_args(settings)
    )
    front[BODY_LIMITS] = BodyLimits.of(settings)
    front[ROUTER] = router
    front[_DOMAIN_APPS] = apps
    front[_SUBSCRIPTIONS] = []

    def model_endpoint(api: Api) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            domain = await router.for_request(request, api, clock())
            return await router.relays[domain].handle(request, api)

        return handle

    async def hook(request: web.Request) -> web.StreamResponse:
        body = await hooks.read_capped(request)
        domain = await router.for_hook(request.headers, hook_session(body), clock())
        return await apps[domain][HOOKS].post(request, body)

    async def delete_session(request: web.Request) -> web.StreamResponse:
        first = router.relays[router.names[0]]
        caller = first.auth.client(request.headers)
        if caller is None:
            return first.unauthorized(CHAT, "delete")
        named = request.match_info["session_id"]
        refused = bad_delete(first, named)
        if refused is not None:
            return refused
        session_id = caller.session(named)
        for domain in router.for_session(session_id, caller.name):
            relay = router.relays[domain]
            released = await relay.end_session(session_id)
            relay.log.info("session_deleted", session_id=session_id, held_released=released)
        return web.json_response({"id": named, "object": "session.deleted", "deleted": True})

    async def models(request: web.Request) -> web.StreamResponse:
        merged: dict[str, Any] = {}
        for handlers in http.values():
            answer = await handlers.models(request)
            if answer.status != 200:
                return answer
            assert isinstance(answer, web.Response) and isinstance(answer.body, bytes)
            for model in orjson.loads(answer.body)["data"]:
                merged.setdefault(str(model.get("id")), model)
        return web.json_response({"object": "list", "data": [merged[k] for k in sorted(merged)]})

    async def healthz(request: web.Request) -> web.StreamResponse:
        per = {
            d: {"held": r.holds.held(), "admitted": r.placements.admitted_count()}
            for d, r in router.relays.items()
        }
        return web.json_response(
            {
                "status": "ok",
                "gateway_id": settings.gateway_id,
                "held": sum(p["held"] for p in per.values()),
                "admitted": sum(p["admitted"] for p in per.values()),
                "domains": per,
            }
        )

    async def readyz(request: web.Request) -> web.StreamResponse:
        per: dict[str, object] = {}
        why: list[str] = []
        for d, r in router.relays.items():
            reason, detail = await readiness(r.stored.store, clock())
            per[d] = {"ready": reason is None, "reason": reason, **detail}
            if reason is not None:
                why.append(f"{d}: {reason}")
        return ready_response(settings.gateway_id, "; ".join(why) or None, {"domains": per})

    async def metrics(request: web.Request) -> web.StreamResponse:
        pages: dict[str, str] = {}
        for d, r in router.relays.items():
            cluster = await cluster_lines(r.stored.store)
            pages[d] = r.metrics.render() + "".join(f"{line}\n" for line in cluster)
        routed = [
            "# HELP tao_gateway_routed_sessions_total Sessions routed to a domain, by reason."
        ]
        routed.append("# TYPE tao_gateway_routed_sessions_total counter")
        for (d, reason), n in sorted(router.routed.items()):
            routed.append(
                f'tao_gateway_routed_sessions_total{{domain="{d}",reason="{reason}"}} {n}'
            )
        text = labelled_union(pages, "domain") + "\n".join(routed) + "\n"
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    for api in (CHAT, COMPLETIONS, MESSAGES, RESPONSES):
        front.router.add_post(api.path, model_endpoint(api))
    front.router.add_get("/v1/models", models)
    front.router.add_delete("/v1/sessions/{session_id}", delete_session)
    front.router.add_get("/healthz", healthz)
    front.router.add_get("/readyz", readyz)
    front.router.add_get("/metrics", metrics)
    front.router.add_post("/hooks/{harness}", hook)
    front.on_startup.append(_start_domains)
    front.on_cleanup.append(_stop_domains)
    return front


def _decode_load(data: bytes) -> DomainLoadReport:
    return decode(data, DomainLoadReport)


async def _start_domains(front: web.Application) -> None:
    router = front[ROUTER]

    async def on_load(report: DomainLoadReport, _: Delivery) -> None:
        router.on_load(report)

    for app in front[_DOMAIN_APPS].values():
        app.freeze()
        await app.startup()
        bus = app[RELAY].bus
        front[_SUBSCRIPTIONS].append(
            await bus.subscribe(subjects.domain_load(), NAME, _decode_load, on_load)
        )


async def _stop_domains(front: web.Application) -> None:
    for sub in front[_SUBSCRIPTIONS]:
        await sub.stop()
    front[_SUBSCRIPTIONS].clear()
    for app in front[_DOMAIN_APPS].values():
        await app.cleanup()


async def serve(
    app: web.Application, host: str, port: int, settings: Settings | None = None
) -> web.AppRunner:
    """Start serving ``app`` on ``host:port`` (handler cancellation on) through a
    :class:`.connections.GuardedSite` bounded by ``settings`` (default: the defaults) and the
    process's file limit; return the runner."""
    settings = settings or Settings()
    soft, _ = raise_file_limit()
    guard = ConnectionGuard(
        connection_cap(settings.max_connections, soft), settings.header_timeout_s
    )
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        args = {**server_args(settings), "access_log": None}
        await GuardedSite(runner, host, port, guard, args).start()
    except BaseException:  # a busy port: close what start-up opened (the upstream client)
        with anyio.CancelScope(shield=True):
            await runner.cleanup()
        raise
    return runner


async def main(settings: Settings, ctx: ServiceContext) -> None:
    """Service entry point for ``shared.infra.runner.run_service``: serve until cancelled;
    with ``TAO_GATEWAY_DOMAINS``, one app over each listed domain (:func:`create_domains_app`,
    one bus connection per domain namespace, each closed on the way out)."""
    keys = gatewaykey.resolve(settings)  # a SettingsError names the variable
    buses: list[MessageBus] = []
    if settings.gateway_domains:
        links: dict[str, tuple[Settings, MessageBus, StateStore | None]] = {}
        for domain in settings.gateway_domains:
            local = settings.replace(
                domain=domain, namespace=domain, nodes=domain_nodes(settings.nodes, domain)
            )
            bus = await Bus.from_settings(local, name=ctx.name)
            buses.append(bus)
            await bus.ensure_streams()
            links[domain] = (local, bus, store_from(local, ctx))
        app = create_domains_app(settings, links, name=ctx.name, keys=keys)
        log = next(iter(app[ROUTER].relays.values())).log
    else:
        app = create_app(
            settings, ctx.require_bus(), store=store_from(settings, ctx), name=ctx.name, keys=keys
        )
        log = app[RELAY].log
    try:
        runner = await serve(app, settings.gateway_host, settings.gateway_port, settings)
        log.info(
            "gateway_listening",
            host=settings.gateway_host,
            port=settings.gateway_port,
            gateway_id=settings.gateway_id,
            domains=list(settings.gateway_domains) or None,
            auth=keys.mode,
            key_source=keys.source or None,
            key_file=str(keys.path) if keys.path is not None else None,
        )
        if keys.mode == "off" and not gatewaykey.is_loopback(settings.gateway_host):
            log.warning(
                "gateway_auth_off",
                host=settings.gateway_host,
                note="TAO_GATEWAY_AUTH=off: anyone who reaches this port may send requests "
                "and post hook events for any session",
            )
        url = f"http://{settings.gateway_host}:{settings.gateway_port}"
        gatewaykey.announce(keys, url, sys.stdout)
        try:
            await serve_forever()
        finally:
            with anyio.CancelScope(shield=True):  # the runner cancels through an anyio scope
                await runner.cleanup()
    finally:
        with anyio.CancelScope(shield=True):
            for opened in buses:
                await opened.drain()
