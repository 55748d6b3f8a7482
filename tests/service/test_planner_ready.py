"""The planner's readiness beat (:func:`services.planner.app.beat`): the replica that plans
writes its record every beat; a standby, or a leader that has not fenced the domain, writes
none."""

from __future__ import annotations

import anyio

from services.planner.app import READY_TTL_S, beat
from services.planner.handlers import Planner
from shared.core.policies import get_policy
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.lease import Leadership, MemoryLeaseTable, lease_key
from shared.infra.logging import get_logger
from shared.infra.store_types import PlannerReady

NOW = 5000.0


def planner(store: FakeStore) -> Planner:
    return Planner(
        store=store,
        bus=FakeBus(),
        log=get_logger("test"),
        policy=get_policy("tao"),
        budget=1000,
        time_limit_ms=100.0,
        clock=lambda: NOW,
    )


async def beats(p: Planner, n: int = 3) -> PlannerReady | None:
    """Run ``n`` beats (no wait between them) and return the record then stored."""
    with anyio.move_on_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(beat, p, "host-planner", 123.0, 0.0)
            for _ in range(n):
                await anyio.sleep(0)
            tg.cancel_scope.cancel()
    return await p.store.planner_ready()


class TestBeat:
    async def test_the_only_planner_writes_its_record(self) -> None:
        p = planner(FakeStore())
        p.rounds, p.last_tick = 4, 99
        rec = await beats(p)
        assert rec == PlannerReady("host-planner", 0, 123.0, NOW, NOW, READY_TTL_S, 4, 99)

    async def test_a_standby_writes_nothing_the_fenced_leader_does(self) -> None:
        store = FakeStore()
        p = planner(store)
        table = MemoryLeaseTable(2.0)
        rival = Leadership(table, lease_key("planner", "default"), "rival")
        assert await rival.step()  # the rival leads
        p.leader = Leadership(table, lease_key("planner", "default"), "me")
        await p.leader.step()
        assert not p.can_plan
        assert await beats(p) is None
        await rival.release()
        assert await p.leader.step()  # now this replica leads, but has not fenced yet
        assert not p.can_plan and await beats(p) is None
        await p.on_leadership(p.leader.epoch)
        assert p.can_plan
        rec = await beats(p)
        assert rec is not None and rec.epoch == p.leader.epoch == p.fenced
