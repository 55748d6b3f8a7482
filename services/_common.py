"""Glue shared by the scheduler services (tools, telemetry, valuation, planner).

Only what every service's ``app.py`` repeats: building the Redis-backed store from the runner's
context, the leader election of the services that act alone in a domain, and parking ``main``
until the runner cancels it.
"""

from __future__ import annotations

import anyio

from shared.infra.busapi import MessageBus
from shared.infra.lease import Leadership, default_instance, lease_key
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["leadership", "serve_forever", "store_from"]


def store_from(settings: Settings, ctx: ServiceContext, *, cache: bool = False) -> StateStore:
    """The Redis store of ``settings.domain`` on the runner's Redis client; with ``cache``,
    keeping ``TAO_SESSION_CACHE`` session records as its batch writes left them (the tools
    service: the only writer of most of its sessions' updates)."""
    from shared.infra.store import Store

    if ctx.redis is None:
        raise RuntimeError(f"{ctx.name} was started with needs_redis=False")
    size = settings.session_cache if cache else 0
    return Store(ctx.redis, domain=settings.domain, cache_sessions=size)


async def serve_forever() -> None:
    """Park until cancelled: the runner cancels ``main`` on SIGINT/SIGTERM, then drains."""
    await anyio.sleep_forever()


async def leadership(settings: Settings, bus: MessageBus, role: str) -> Leadership | None:
    """This replica's side of the ``role`` lease of ``settings.domain`` (shared.infra.lease),
    or None when election is off (``TAO_LEASE_TTL_S=0``: one replica per domain)."""
    if settings.lease_ttl_s <= 0:
        return None
    table = await bus.lease_table(settings.lease_ttl_s, replicas=settings.replicas)
    instance = settings.instance or default_instance(settings.service_name or role)
    return Leadership(
        table, lease_key(role, settings.domain), instance, log=get_logger(f"{role}.lease")
    )
