"""Leader election on a lease (shared.infra.lease), on the in-memory table and a fake clock."""

from __future__ import annotations

import anyio
import orjson
import pytest

from shared.infra.lease import SAFETY, Leadership, LeaseConflict, MemoryLeaseTable, lease_key

TTL = 2.0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock) -> MemoryLeaseTable:
    return MemoryLeaseTable(TTL, clock)


def member(table: MemoryLeaseTable, clock: Clock, name: str) -> Leadership:
    return Leadership(table, lease_key("planner", "d1"), name, clock=clock)


class TestTable:
    async def test_create_is_exclusive_and_update_revision_checked(
        self, table: MemoryLeaseTable
    ) -> None:
        rev = await table.create("k", b"a")
        with pytest.raises(LeaseConflict):
            await table.create("k", b"b")
        with pytest.raises(LeaseConflict):
            await table.update("k", b"b", rev + 5)
        rev2 = await table.update("k", b"b", rev)
        assert rev2 > rev and await table.get("k") == (b"b", rev2)

    async def test_key_lapses_after_ttl_and_delete_frees_it(
        self, table: MemoryLeaseTable, clock: Clock
    ) -> None:
        rev = await table.create("k", b"a")
        clock.t += TTL
        assert await table.get("k") is None
        rev2 = await table.create("k", b"b")
        await table.delete("k", rev)  # not the current revision: left alone
        assert await table.get("k") == (b"b", rev2)
        await table.delete("k", rev2)
        assert await table.get("k") is None
        assert await table.create("k", b"c") > rev2


class TestLeadership:
    async def test_one_leader_and_standby_takes_over_when_it_stops_renewing(
        self, table: MemoryLeaseTable, clock: Clock
    ) -> None:
        """Only one of two members leads; when the leader stops renewing, the standby takes
        over once the key lapsed, with a larger epoch, and the old leader has already stopped
        counting itself leader before that."""
        a, b = member(table, clock, "a"), member(table, clock, "b")
        assert await a.step() and not await b.step()
        assert a.leading and not b.leading and a.epoch > 0 and b.epoch == 0
        clock.t += TTL / 3
        assert await a.step()  # renewed
        first = a.epoch
        renewed_at = clock.t
        clock.t = renewed_at + TTL * SAFETY  # a stops renewing (paused, partitioned)
        assert not a.leading  # it stops acting before the key can lapse
        assert not await b.step()  # the key has not lapsed yet
        clock.t = renewed_at + TTL
        assert await b.step() and b.epoch > first
        assert not await a.step()  # a's renewal finds b's lease: deposed
        assert a.epoch == 0 and not a.leading

    async def test_renewal_that_loses_the_race_deposes_at_once(
        self, table: MemoryLeaseTable, clock: Clock
    ) -> None:
        a = member(table, clock, "a")
        assert await a.step()
        _, rev = await table.get(a.key) or (b"", 0)
        await table.update(a.key, orjson.dumps({"instance": "x"}), rev)  # someone wrote it
        assert not await a.step() and not a.leading

    async def test_same_instance_restarted_takes_its_lease_back_with_a_new_epoch(
        self, table: MemoryLeaseTable, clock: Clock
    ) -> None:
        old = member(table, clock, "a")
        assert await old.step()
        again = member(table, clock, "a")  # the process restarted under the same name
        assert await again.step() and again.epoch > old.epoch
        assert not await old.step()  # the old process, were it alive, is deposed

    async def test_release_lets_a_standby_in_at_once(
        self, table: MemoryLeaseTable, clock: Clock
    ) -> None:
        a, b = member(table, clock, "a"), member(table, clock, "b")
        assert await a.step() and not await b.step()
        await a.release()
        assert not a.leading and await b.step() and b.takeovers == 1

    async def test_bus_error_keeps_a_valid_lease_until_it_would_lapse(self, clock: Clock) -> None:
        """A renewal that fails on the bus (not a conflict) keeps the lease only as long as
        it is still valid."""

        class Flaky(MemoryLeaseTable):
            broken = False

            async def update(self, key: str, value: bytes, last: int) -> int:
                if self.broken:
                    raise OSError("connection lost")
                return await MemoryLeaseTable.update(self, key, value, last)

            async def create(self, key: str, value: bytes) -> int:
                if self.broken:
                    raise OSError("connection lost")
                return await MemoryLeaseTable.create(self, key, value)

        table = Flaky(TTL, clock)
        a = member(table, clock, "a")
        assert await a.step()
        table.broken = True
        clock.t += TTL / 3
        assert await a.step()  # still valid
        clock.t += TTL
        assert not await a.step() and not a.leading


class TestRun:
    async def test_a_failed_hand_over_is_retried_and_a_stop_releases(
        self, table: MemoryLeaseTable, clock: Clock
    ) -> None:
        """``run`` tells the new epoch again when the hand-over raised (the store was down),
        and deletes the key when cancelled, so a standby need not wait for it to lapse."""
        told: list[int] = []

        async def on_change(epoch: int) -> None:
            told.append(epoch)
            if len(told) == 1:
                raise ConnectionError("store down")

        table.ttl_s = 0.3  # real sleeps between steps: keep them short
        a = Leadership(table, lease_key("planner", "d1"), "a", clock=clock)
        with anyio.move_on_after(0.5):
            await a.run(on_change)
        assert len(told) >= 2 and told[0] == told[1] > 0  # the same epoch, told again
        assert a.takeovers == 1
        assert a.epoch == 0 and await table.get(a.key) is None  # released on the way out

    async def test_renewals_go_on_while_a_slow_hand_over_runs(
        self, table: MemoryLeaseTable
    ) -> None:
        """A hand-over longer than the lease (the planner's re-publishing of every admission
        at 10,000 sessions) does not hold up the renewals: the lease is kept, with one epoch,
        told once, and a standby never gets in."""
        import time

        told: list[int] = []

        async def slow(epoch: int) -> None:
            told.append(epoch)
            await anyio.sleep(4 * table.ttl_s)

        table.ttl_s = 0.3  # real time: the renewals' sleeps are real
        table.clock = time.monotonic
        a = Leadership(table, lease_key("planner", "d1"), "a", clock=time.monotonic)
        b = Leadership(table, lease_key("planner", "d1"), "b", clock=time.monotonic)
        with anyio.move_on_after(6 * table.ttl_s):
            async with anyio.create_task_group() as tg:
                tg.start_soon(a.run, slow)
                await anyio.sleep(0.05)
                while True:
                    assert not await b.step(), "the standby took a lease that was held"
                    await anyio.sleep(table.ttl_s / 4)
        assert len(told) == 1 and told[0] > 0
        assert a.takeovers == 1
