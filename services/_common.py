"""Glue shared by the scheduler services (tools, telemetry, valuation, planner).

Only what every service's ``app.py`` repeats: building the Redis-backed store from the runner's
context and parking ``main`` until the runner cancels it.
"""

from __future__ import annotations

import anyio

from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["serve_forever", "store_from"]


def store_from(settings: Settings, ctx: ServiceContext) -> StateStore:
    """The Redis store of ``settings.domain`` on the runner's Redis client."""
    from shared.infra.store import Store

    if ctx.redis is None:
        raise RuntimeError(f"{ctx.name} was started with needs_redis=False")
    return Store(ctx.redis, domain=settings.domain)


async def serve_forever() -> None:
    """Park until cancelled: the runner cancels ``main`` on SIGINT/SIGTERM, then drains."""
    await anyio.sleep_forever()
