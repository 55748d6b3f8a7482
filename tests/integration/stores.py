"""The store under test, one per kind: in memory, Redis with byte replies, Redis with text
replies — each on a fresh uuid domain, with a coroutine that deletes its keys afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from shared.infra.fake_store import FakeStore
from shared.infra.store import Store
from shared.infra.store_types import StateStore

STORE_KINDS = ("fake", "redis", "redis-text")


async def open_store(kind: str, redis_url: str) -> tuple[StateStore, Callable[[], Awaitable[None]]]:
    """A store of ``kind`` on a fresh domain and the coroutine that cleans it up."""
    domain = "t" + uuid.uuid4().hex[:12]
    if kind == "fake":
        fake = FakeStore(domain)

        async def nothing() -> None:
            return None

        return fake, nothing
    client = aioredis.Redis.from_url(redis_url, decode_responses=kind == "redis-text")
    real = Store(client, domain)

    async def close() -> None:
        await real.clear()
        await client.aclose()

    return real, close
