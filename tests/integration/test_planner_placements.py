"""The planner's placements on real NATS: a plan that admits many sessions publishes their
placements through a window (each no longer waits for the previous one's JetStream ack), and
they are stored in the stream in the plan's order."""

from __future__ import annotations

import asyncio

import pytest

from services.planner.handlers import Planner
from shared.contracts import Placement, decode, subjects
from shared.core.policies import get_policy
from shared.infra import Bus, Delivery
from shared.infra.fake_store import FakeStore
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate
from tests.service.test_planner_service import NOW, pool, snapshot

SESSIONS = 12


async def test_a_plans_placements_are_stored_in_its_order(
    nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve admits through a window of four: the stream holds them in the plan's order, and
    a takeover's re-publishing sends each admission once more."""
    import services.planner.handlers as handlers

    monkeypatch.setattr(handlers, "PUBLISH_WINDOW", 4)
    bus = await Bus.connect(nats_url, name="planner", namespace=namespace)
    got: list[Placement] = []
    done = asyncio.Event()

    async def take(p: Placement, d: Delivery) -> None:
        got.append(p)
        if len(got) == SESSIONS:
            done.set()

    try:
        await bus.ensure_streams()
        store = FakeStore()
        await store.put_node_status(
            "n1", NodeUpdate(capacity_tokens=1_000_000, target_utilisation=1.0, healthy=True)
        )
        await pool(store, *[1000 + 100 * i for i in range(SESSIONS)])
        planner = Planner(
            store=store,
            bus=bus,
            log=get_logger("test"),
            policy=get_policy("tao"),
            budget=150_000,
            time_limit_ms=5_000.0,
            clock=lambda: NOW,
        )
        applied = await planner.plan_once(await snapshot(store, bus))  # type: ignore[arg-type]
        assert applied is not None and len(applied.admitted) == SESSIONS
        await bus.consume(
            subjects.STREAM_PLACEMENT, "gw", lambda b: decode(b, Placement), take,
            filter_subject=subjects.placement("gw1"), ephemeral=True,
        )  # fmt: skip
        async with asyncio.timeout(10.0):
            await done.wait()
        assert [p.session_id for p in got] == [m.session for m in applied.admitted]
        assert {p.kind for p in got} == {"admit"}
        done.clear()
        got.clear()
        assert await planner.resync() == SESSIONS
        async with asyncio.timeout(10.0):
            await done.wait()
        assert sorted(p.session_id for p in got) == sorted(m.session for m in applied.admitted)
    finally:
        await bus.delete_streams()
        await bus.drain()
