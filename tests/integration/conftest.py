"""The ``bus`` fixture: every bus test body runs against FakeBus and against real NATS.

The real bus lives in a fresh namespace (its own streams ``t<uuid>_TAO_V1_*``), which is
deleted after the test. Both buses retry fast (backoff 10 ms) and dead-letter after 3
deliveries, so retry tests finish quickly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.infra import Bus, FakeBus, MessageBus
from shared.infra.store_types import StateStore
from tests.integration.stores import STORE_KINDS, open_store, url_for

MAX_DELIVER = 3
BACKOFF_S = 0.01


@pytest.fixture(params=["fake", "nats"])
async def bus(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[MessageBus]:
    """A connected bus with its streams; in-memory or real NATS."""
    if request.param == "fake":
        fake = FakeBus(namespace, max_deliver=MAX_DELIVER, retry_backoff_s=BACKOFF_S)
        yield fake
        await fake.drain()
        return
    url = request.getfixturevalue("nats_url")
    # Messages the server handed to a consumer that then stopped (in flight on the wire when it
    # unsubscribed) come back after the ack wait; 2 s keeps that inside the tests' timeouts
    # (services use TAO_ACK_WAIT_S, 30 s by default: a restart delays them, never loses them).
    real = await Bus.connect(
        url,
        name="test",
        namespace=namespace,
        max_deliver=MAX_DELIVER,
        retry_backoff_s=BACKOFF_S,
        ack_wait_s=2.0,
    )
    await real.ensure_streams()
    try:
        yield real
    finally:
        await real.drain()
        admin = await Bus.connect(url, name="test-cleanup", namespace=namespace)
        await admin.delete_streams()
        await admin.drain()


@pytest.fixture(params=STORE_KINDS)
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    """A store on a fresh uuid domain: in memory, Redis with byte or text replies, or a Redis
    Cluster (the Redis ones delete their keys afterwards)."""
    opened, close = await open_store(request.param, url_for(request, request.param))
    try:
        yield opened
    finally:
        await close()
