"""The valuation service's nodes' shared prefix (kept across ticks from the admitted records it
reads) and its credit by KV-event evidence (the nodes' ``kv_since`` / ``kv_until``)."""

from __future__ import annotations

import pytest

from services.valuation.handlers import Valuator
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.plan import Plan, WireAssignment
from shared.contracts.valuation import ValuationSnapshot
from shared.core.problem import ZERO, PlanResult
from shared.core.session import Session, on_request, on_response
from shared.core.tick import Decision, Move
from shared.core.valuation import ValuationParams
from shared.infra.busapi import Delivery
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate

NOW = 1000.0
SHARED = 15_000


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def valuator(store: FakeStore, bus: FakeBus, clock: Clock) -> Valuator:
    return Valuator(
        store=store,
        bus=bus,
        log=get_logger("test"),
        params=ValuationParams(),
        idle_timeout_s=300.0,
        clock=clock,
    )


def last_snapshot(bus: FakeBus) -> ValuationSnapshot:
    snaps = [
        decode(d, ValuationSnapshot)
        for s, d, _ in bus.published
        if s == subjects.valuation_snapshot()
    ]
    return snaps[-1]


async def put(store: FakeStore, s: Session) -> None:
    await store.update_session(s.id, lambda _old: s)


async def pooled(store: FakeStore, sid: str, tokens: int, shared: int = 0) -> Session:
    s, _ = on_request(Session(sid), "r1", 990.0, model="m", tokens_estimate=tokens, shared=shared)
    await put(store, s)
    return s


async def admit_on(store: FakeStore, sid: str, node: str, weight: int) -> None:
    s = await store.get_session(sid)
    assert s is not None
    result = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")
    d = Decision(1, (), (Move(sid, node, weight, s.version),), result)
    assert not (await store.apply(d, 995.0)).discarded


@pytest.fixture
async def store() -> FakeStore:
    st = FakeStore()
    await st.put_node_status(
        "n1", NodeUpdate(capacity_tokens=100_000, target_utilisation=1.0, healthy=True)
    )
    return st


def _free(snap: ValuationSnapshot, node: str = "n1") -> int:
    return next(n.free for n in snap.nodes if n.id == node)


class TestNodeShared:
    async def test_first_tick_reads_every_admitted_session(self, store: FakeStore) -> None:
        """Two admitted sessions sharing 15k: the node's free room is capacity − Σ weights −
        15k once (the first tick read them); it stays so on later ticks that do not read them,
        and goes when the node holds no session."""
        for sid in ("a", "b"):
            await pooled(store, sid, 20_000, SHARED)
            await admit_on(store, sid, "n1", 20_000 - SHARED + 512)
        await pooled(store, "c", 1_000)
        bus, clock = FakeBus(), Clock()
        v = valuator(store, bus, clock)
        await v.run_tick()
        assert _free(last_snapshot(bus)) == 100_000 - 2 * 5_512 - SHARED
        clock.now += 1
        await v.run_tick("wake", {"c"})
        assert _free(last_snapshot(bus)) == 100_000 - 2 * 5_512 - SHARED
        for sid in ("a", "b"):
            s = await store.get_session(sid)
            assert s is not None
            await put(store, Session(sid, version=s.version + 1, ended=True))
        clock.now += 1
        await v.run_tick()
        assert v.node_shared.nodes == {}
        assert _free(last_snapshot(bus)) == 100_000

    async def test_a_shared_wake_up_names_what_to_read(self, store: FakeStore) -> None:
        """An admitted session learns its prefix after admission (the tools service's write):
        the ``shared`` wake-up names it, and the next tick reads it and counts it."""
        await pooled(store, "a", 20_000)
        await admit_on(store, "a", "n1", 20_512)
        bus, clock = FakeBus(), Clock()
        v = valuator(store, bus, clock)
        await pooled(store, "c", 1_000)
        await v.run_tick()
        assert _free(last_snapshot(bus)) == 100_000 - 20_512
        s = await store.get_session("a")
        assert s is not None
        learned = Session(
            "a", version=s.version + 1, node="n1", weight=5_512, tokens=20_000, shared=SHARED,
            activity="tool", model="m",
        )  # fmt: skip
        await put(store, learned)
        v.note_shared({"a"})
        clock.now += 1
        await v.run_tick("wake", {"c"})
        assert _free(last_snapshot(bus)) == 100_000 - 5_512 - SHARED

    async def test_a_plans_admission_carries_its_candidates_prefix(self, store: FakeStore) -> None:
        """A pooled candidate with a shared prefix admitted by a plan: the node counts its
        prefix from the next tick on, without reading it."""
        await pooled(store, "a", 20_000, SHARED)
        bus, clock = FakeBus(), Clock()
        v = valuator(store, bus, clock)
        await v.run_tick()
        await admit_on(store, "a", "n1", 5_512)
        clock.now += 1
        plan = Plan(tick=v.tick, policy="tao", assignments=[WireAssignment("a", "n1")])
        await v.on_plan(plan, Delivery(subjects.plan(), {}, 1, None, clock.now))
        await pooled(store, "c", 1_000)
        await v.run_tick("wake", {"c"})
        assert _free(last_snapshot(bus)) == 100_000 - 5_512 - SHARED


class TestCreditByEvidence:
    """A pooled session's credit on n1 observed at 900 (100 s, ten half-lives, ago)."""

    async def _credit(self, store: FakeStore, evidence: tuple[float, float] | None) -> int:
        s, _ = on_request(Session("a"), "r1", 890.0, model="m", tokens_estimate=8_192)
        s = on_response(s, 900.0, total_tokens=8_192, tool_calls=[("c", "bash")])
        s, _ = on_request(s, "r2", 990.0)
        await put(store, s)
        await store.put_residency("a", "n1", 8_192, 900.0)
        if evidence is not None:
            since, until = evidence
            await store.put_node_status("n1", NodeUpdate(kv_since=since, kv_until=until))
        bus = FakeBus()
        snap = await valuator(store, bus, Clock()).run_tick()
        return snap.candidates[0].credit.get("n1", 0)

    async def test_a_healthy_stream_keeps_the_credit(self, store: FakeStore) -> None:
        """Complete since before the observation, up to now: no decay."""
        assert await self._credit(store, (800.0, NOW)) == 8_192

    async def test_the_stream_confirms_up_to_its_latest_batch(self, store: FakeStore) -> None:
        """Confirmed up to 990: ten seconds of decay, one half-life."""
        assert await self._credit(store, (800.0, 990.0)) == 4_096

    async def test_a_gap_after_the_observation_lets_it_decay(self, store: FakeStore) -> None:
        """The stream lost batches at 950: what was seen at 900 decays from 900."""
        assert await self._credit(store, (950.0, NOW)) == 0  # 2**-10 of 8,192 rounds to 0

    async def test_usage_residency_decays_as_before(self, store: FakeStore) -> None:
        assert await self._credit(store, None) == 0
