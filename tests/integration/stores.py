"""The store under test, one per kind: in memory, Redis with byte replies, Redis with text
replies, Redis with the batch writes' session cache on (a small one, so that records are
evicted too), a Redis Cluster (3 masters) — each on a fresh uuid domain, with a coroutine that
deletes its keys afterwards."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import pytest

from shared.infra.fake_store import FakeStore
from shared.infra.redisconn import open_redis
from shared.infra.store import Store
from shared.infra.store_types import StateStore

STORE_KINDS = ("fake", "redis", "redis-text", "redis-cached", "redis-cluster")
CACHED: int = 8
"""Session records the ``redis-cached`` store keeps."""


def url_for(request: pytest.FixtureRequest, kind: str) -> str:
    """The server URL a store of ``kind`` needs, from the session's fixtures (none in memory)."""
    if kind == "fake":
        return ""
    return request.getfixturevalue("redis_cluster_url" if kind == "redis-cluster" else "redis_url")


async def open_store(kind: str, redis_url: str) -> tuple[StateStore, Callable[[], Awaitable[None]]]:
    """A store of ``kind`` on a fresh domain and the coroutine that cleans it up; ``redis_url``
    is the cluster's for ``redis-cluster``."""
    domain = "t" + uuid.uuid4().hex[:12]
    if kind == "fake":
        fake = FakeStore(domain)

        async def nothing() -> None:
            return None

        return fake, nothing
    client = open_redis(redis_url, decode_responses=kind == "redis-text")
    real = Store(client, domain, cache_sessions=CACHED if kind == "redis-cached" else 0)

    async def close() -> None:
        await real.clear()
        await client.aclose()

    return real, close
