"""The planner's readiness record in every store: written whole, read back exactly, and (on
Redis) expiring ``ttl_s`` after the last write."""

from __future__ import annotations

from shared.infra.store import Store
from shared.infra.store_types import PlannerReady, StateStore


class TestPlannerReady:
    async def test_none_until_written_then_the_last_write(self, store: StateStore) -> None:
        assert await store.planner_ready() is None
        first = PlannerReady("a-planner", 0, 812.5, 100.25, 101.5, 5.0)
        await store.put_planner_ready(first)
        assert await store.planner_ready() == first
        second = PlannerReady("b-planner", 2, 90.0, 200.0, 200.5, 5.0, rounds=3, tick=17)
        await store.put_planner_ready(second)
        assert await store.planner_ready() == second

    async def test_redis_expires_the_record_after_its_ttl(self, store: StateStore) -> None:
        if not isinstance(store, Store):
            return  # the in-memory store keeps it; readers check PlannerReady.fresh
        await store.put_planner_ready(PlannerReady("p", 1, 1.0, 1.0, 1.0, 2.5))
        ttl_ms = await store._r.pttl(store.keys.ready)
        assert 0 < ttl_ms <= 2500
