"""The telemetry service: node status from vLLM ``/metrics`` and residency from responses.

Every ``TAO_SCRAPE_S`` (default 1 s) it scrapes each node of ``TAO_NODES`` (``id=url,…``):
capacity, usage, queue lengths and prefix-cache counters from ``/metrics``, models from
``/v1/models``; writes the node record and publishes ``NodeStatus`` on
``tao.v1.node.status.<node>``. A scrape that finds the engine restarted clears the node's
residency (:mod:`services.telemetry.handlers`). With ``TAO_SHARD=i/N`` the process takes the
nodes whose id hashes to shard ``i`` (:mod:`shared.infra.shard`): it scrapes them, follows their
KV events and answers ``tao inspect`` about them; every shard reads every response (the chains
of all sessions, walked against its own nodes' blocks), and shard 0 stores the chains.
Residency comes from a :class:`ResidencySource`: by default
:class:`~services.telemetry.kvresidency.KvResidency` (vLLM KV events over ZMQ or bridged on
NATS, walked against the sessions' block-key chains; usage-based observations where there are
no KV events or no token ids). It also answers ``tao inspect node|prefix``
(:mod:`services.telemetry.inspect`). Run: ``python -m services.telemetry`` (needs NATS and
Redis).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import anyio
from structlog.typing import FilteringBoundLogger

from services._common import store_from
from services.telemetry.handlers import NodeScrapers, RestartHook
from services.telemetry.inspect import Inspector
from services.telemetry.kvresidency import KvResidency
from services.telemetry.residency import ResidencySource
from services.telemetry.scrape import Fetch, HttpFetch
from shared.infra.busapi import MessageBus
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from shared.infra.settings import NodeSpec, Settings
from shared.infra.store_types import StateStore

__all__ = ["NAME", "main", "run"]

NAME = "telemetry"


async def run(
    settings: Settings,
    store: StateStore,
    bus: MessageBus,
    fetch: Fetch,
    *,
    name: str = NAME,
    residency: ResidencySource | None = None,
) -> None:
    """Start the residency source and the inspection responder, then scrape forever (until
    cancelled). A :class:`KvResidency` source also runs its ZMQ feeds and flusher here."""
    log = get_logger(name)
    shard = settings.shard
    member = shard.member(name)
    nodes = tuple(n for n in settings.nodes if shard.owns(n.id))
    if shard.count > 1:
        log.info(
            "telemetry_shard", shard=f"{shard.index}/{shard.count}", nodes=[n.id for n in nodes]
        )
    if residency is None:
        residency = KvResidency(store, log, nodes, shard=shard)
    async with anyio.create_task_group() as tg:
        await residency.start(bus, member)
        if isinstance(residency, KvResidency):
            tg.start_soon(residency.run)
            await Inspector(residency.index, store, nodes, shard=shard).start(bus, member)
        on_restart = (
            residency.engine_restarted if isinstance(residency, KvResidency) else _clearer(store)
        )
        await _scrape_forever(settings, nodes, store, bus, fetch, log, on_restart)


def _clearer(store: StateStore) -> RestartHook:
    """The restart hook of a source without a KV-event index: drop the node's residency."""

    async def clear(node: str, since: float | None, reason: str) -> None:
        await store.clear_node_residency(node)

    return clear


async def _scrape_forever(
    settings: Settings,
    nodes: Sequence[NodeSpec],
    store: StateStore,
    bus: MessageBus,
    fetch: Fetch,
    log: FilteringBoundLogger,
    on_restart: RestartHook,
) -> None:
    scrapers = NodeScrapers(
        nodes=nodes,
        fetch=fetch,
        store=store,
        bus=bus,
        log=log,
        target_utilisation=settings.target_utilisation,
        clock=time.time,
        on_restart=on_restart,
    )
    period = settings.scrape_s
    while True:
        started = anyio.current_time()
        try:
            await scrapers.scrape_all()
        except Exception:  # a store or bus hiccup: log it, scrape again next period
            log.exception("scrape_round_failed")
        await anyio.sleep(max(0.0, period - (anyio.current_time() - started)))


async def main(settings: Settings, ctx: ServiceContext) -> None:
    """Service entry point for the runner."""
    fetch = HttpFetch(timeout_s=max(0.2, min(5.0, settings.scrape_s)))
    try:
        await run(settings, store_from(settings, ctx), ctx.require_bus(), fetch, name=ctx.name)
    finally:
        with anyio.CancelScope(shield=True):
            await fetch.aclose()
