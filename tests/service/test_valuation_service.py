"""The valuation service on FakeBus + FakeStore: snapshots from store state, idle timeouts."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest

from services.planner.mapping import from_wire
from services.valuation.app import Ticker
from services.valuation.handlers import Valuator
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.domain import DomainLoadReport
from shared.contracts.plan import Plan, WireAssignment
from shared.contracts.session import SessionEnd
from shared.contracts.valuation import ValuationSnapshot
from shared.contracts.wake import Wake
from shared.core.problem import ZERO, PlanResult
from shared.core.session import Session, ToolCall, on_end, on_request, on_response
from shared.core.tick import Decision, Move
from shared.core.valuation import ValuationParams
from shared.infra.busapi import Delivery
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate

NOW = 1000.0


def valuator(store: FakeStore, bus: FakeBus, now: float = NOW) -> Valuator:
    return Valuator(
        store=store,
        bus=bus,
        log=get_logger("test"),
        params=ValuationParams(),
        idle_timeout_s=300.0,
        clock=lambda: now,
    )


def snapshots(bus: FakeBus) -> list[ValuationSnapshot]:
    return [
        decode(d, ValuationSnapshot)
        for s, d, _ in bus.published
        if s == subjects.valuation_snapshot()
    ]


async def put(store: FakeStore, s: Session) -> None:
    await store.update_session(s.id, lambda _old: s)


async def admit_on(store: FakeStore, sid: str, node: str, weight: int, at: float) -> None:
    s = await store.get_session(sid)
    assert s is not None
    result = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")
    d = Decision(1, (), (Move(sid, node, weight, s.version),), result)
    assert not (await store.apply(d, at)).discarded


@pytest.fixture
async def store() -> FakeStore:
    st = FakeStore()
    await st.put_node_status(
        "n1", NodeUpdate(capacity_tokens=100_000, target_utilisation=0.9, healthy=True, models=None)
    )
    await st.put_node_status("n2", NodeUpdate(capacity_tokens=50_000, healthy=False))
    return st


class TestValuationTick:
    async def test_snapshot_from_known_state(self, store: FakeStore) -> None:
        """When the pool's demand exceeds free capacity, pool and admitted-in-tool sessions
        become candidates and interrupt candidates with credit from residency, and the
        snapshot is published."""
        bus = FakeBus()
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=8_000))  # 7,200 usable
        a, _ = on_request(Session("a"), "r1", 990.0, model="m", tokens_estimate=4000)
        await put(store, a)
        b, _ = on_request(Session("b"), "r1", 990.0, model="m")
        await put(store, b)
        await admit_on(store, "b", "n1", 3000, 991.0)
        b2 = await store.get_session("b")
        assert b2 is not None
        await put(store, on_response(b2, 995.0, total_tokens=2500, tool_calls=[("c", "bash")]))
        await put(store, Session("idle-one", version=1, activity="idle"))
        await store.put_residency("a", "n1", 4000, NOW)
        bus_snap = await valuator(store, bus).run_tick()
        assert [c.id for c in bus_snap.candidates] == ["a"]
        assert [ic.id for ic in bus_snap.interrupts] == ["b"]
        wire = snapshots(bus)
        assert len(wire) == 1
        w = wire[0]
        assert [(n.id, n.free, n.load, n.capacity, n.healthy) for n in w.nodes] == [
            ("n1", 7_200 - 3000, 3000, 8_000, True),
            ("n2", 0, 0, 50_000, False),
        ]
        cand = w.candidates[0]
        assert (cand.weight, cand.tokens, cand.eligible, cand.phase) == (
            4000 + 512,
            4000,
            ["n1"],
            "new",
        )
        assert cand.credit == {"n1": 4096}  # 4000 rounded to the nearest 256-token unit
        assert cand.signature.version == a.version
        inter = w.interrupt_candidates[0]
        assert (inter.node, inter.weight, inter.tokens) == ("n1", 3000, 2500)
        assert from_wire(w).versions == {"a": a.version, "b": b2.version + 1}

    async def test_each_tick_reports_the_domains_load(self, store: FakeStore) -> None:
        """The load report: capacity of the healthy nodes (usable: capacity × target), demand
        the reserved totals plus each pooled session's weight; an idle session counts for
        nothing; published each tick, empty pool or not."""
        bus = FakeBus()
        a, _ = on_request(Session("a"), "r1", 990.0, model="m", tokens_estimate=4000)
        await put(store, a)
        b, _ = on_request(Session("b"), "r1", 990.0, model="m")
        await put(store, b)
        await admit_on(store, "b", "n1", 3000, 991.0)
        await put(store, Session("idle-one", version=1, activity="idle"))
        v = valuator(store, bus)
        await v.run_tick()
        await put(store, on_end((await store.get_session("a")) or a, 999.0))
        await v.run_tick()
        reports = [
            decode(d, DomainLoadReport) for s, d, _ in bus.published if s == subjects.domain_load()
        ]
        assert [(r.domain, r.tick, r.capacity, r.demand, r.models) for r in reports] == [
            (store.domain, 1, 90_000, 3000 + 4000 + 512, None),
            (store.domain, 2, 90_000, 3000, None),
        ]

    async def test_a_wake_tick_reuses_a_history_younger_than_a_second(
        self, store: FakeStore
    ) -> None:
        """Off the periodic tick, the tool-duration history read is skipped for a second."""
        now = [NOW]
        v = valuator(store, FakeBus())
        v.clock = lambda: now[0]
        await v.run_tick("period")
        first = v.history
        await store.record_tool("pytest", 2.0)
        await v.run_tick("wake")
        assert v.history is first
        now[0] += 1.0
        await v.run_tick("wake")
        assert v.history is not None and v.history.of("pytest").count == 1
        await store.record_tool("pytest", 3.0)
        await v.run_tick("period")
        assert v.history.of("pytest").count == 2

    async def test_empty_pool_publishes_once_then_nothing(self, store: FakeStore) -> None:
        """When the pool empties one empty snapshot goes out, then ticks publish nothing."""
        bus = FakeBus()
        v = valuator(store, bus)
        a, _ = on_request(Session("a"), "r1", 990.0, model="m")
        await put(store, a)
        await v.run_tick()
        await store.delete_session("a")
        await v.run_tick()
        await v.run_tick()
        sent = snapshots(bus)
        assert [len(s.candidates) for s in sent] == [1, 0]
        assert [s.tick for s in sent] == [1, 2]
        assert v.tick == 3

    async def test_probe_mark_is_persisted_once(self, store: FakeStore) -> None:
        """A tool past its predicted end spends a probe: the mark is stored without a version
        bump, and the next tick reads r = 0."""
        bus = FakeBus()
        call = ToolCall("c", "bash", started_at=NOW - 100.0)
        s = Session("p", version=4, activity="tool", tokens=100, tool=call, model="m")
        await put(store, s)
        v = valuator(store, bus)
        first = await v.run_tick()
        stored = await store.get_session("p")
        assert stored is not None and stored.probe_mark is not None
        assert stored.version == 4
        assert first.candidates[0].ready == 1
        second = await v.run_tick()
        assert second.candidates[0].ready == 0


async def admitted_in_a_call(store: FakeStore, sid: str) -> Session:
    """A session of gateway gw1 that asked at 100.0 and was admitted on n1 at 101.0."""
    s, _ = on_request(Session(sid), "r1", 100.0, model="m", gateway_id="gw1")
    await put(store, s)
    await admit_on(store, sid, "n1", 2000, 101.0)
    got = await store.get_session(sid)
    assert got is not None
    return got


class TestIdleSweep:
    async def test_idle_admitted_session_is_ended(self, store: FakeStore) -> None:
        """An admitted session idle past the timeout is ended (reservation released) and a
        SessionEnd with reason idle_timeout is published."""
        bus = FakeBus()
        a2 = await admitted_in_a_call(store, "a")
        await put(store, on_response(a2, 102.0, total_tokens=1500))
        fresh, _ = on_request(Session("f"), "r1", 100.0, model="m")
        await put(store, fresh)
        ended = await valuator(store, bus, now=102.0 + 301.0).sweep_idle()
        assert ended == ["a"]
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 0
        ends = [decode(d, SessionEnd) for s, d, _ in bus.published if "session.end" in s]
        assert [(e.session_id, e.reason, e.gateway_id) for e in ends] == [
            ("a", "idle_timeout", "gw1")
        ]

    async def test_a_session_whose_harness_died_after_a_tool_is_ended(
        self, store: FakeStore
    ) -> None:
        """The soak's leak: an agent that stops after a tool's end (or during it) leaves its
        session in ``tool``, which no event changes again; admitted, it held its reservation
        for ever. Past the timeout it is ended like an idle one, and a pooled record that was
        abandoned (never admitted) is collected too; a waiting one is the gateway's."""
        from shared.core.session import on_tool_end, on_tool_start

        bus = FakeBus()
        a2 = await admitted_in_a_call(store, "a")
        a3 = on_response(a2, 102.0, total_tokens=1500, tool_calls=[("c1", "bash")])
        a4, _ = on_tool_end(on_tool_start(a3, "c1", "bash", 102.5, source="hook"), "c1", 103.0,
                            source="hook")  # fmt: skip
        await put(store, a4)
        pooled = on_response(on_request(Session("p"), "r1", 100.0, model="m")[0], 103.0,
                             total_tokens=900)  # fmt: skip
        await put(store, pooled)
        waiting, _ = on_request(Session("w"), "r1", 100.0, model="m")
        await put(store, waiting)
        assert await valuator(store, bus, now=103.0 + 299.0).sweep_idle() == []
        assert await valuator(store, bus, now=103.0 + 301.0).sweep_idle() == ["a", "p"]
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 0
        ends = [decode(d, SessionEnd) for s, d, _ in bus.published if "session.end" in s]
        assert sorted((e.session_id, e.reason) for e in ends) == [
            ("a", "idle_timeout"),
            ("p", "idle_timeout"),
        ]
        assert await store.get_session("w") is not None

    async def test_recently_active_session_is_kept(self, store: FakeStore) -> None:
        """An admitted idle session within the timeout keeps its reservation."""
        bus = FakeBus()
        a, _ = on_request(Session("a"), "r1", 100.0, model="m")
        await put(store, a)
        await admit_on(store, "a", "n1", 2000, 101.0)
        a2 = await store.get_session("a")
        assert a2 is not None
        await put(store, on_response(a2, 102.0, total_tokens=1500))
        assert await valuator(store, bus, now=102.0 + 299.0).sweep_idle() == []


def plan(tick: int, admitted: Sequence[str] = (), interrupted: Sequence[str] = ()) -> Plan:
    return Plan(
        tick=tick,
        policy="tao",
        assignments=[WireAssignment(sid, "n1") for sid in admitted],
        interrupts=[WireAssignment(sid, "n1") for sid in interrupted],
    )


def versions_of(snap: ValuationSnapshot) -> dict[str, int]:
    return {c.id: c.signature.version for c in snap.candidates}


async def pooled(store: FakeStore, sid: str, at: float = 990.0) -> Session:
    s, _ = on_request(Session(sid), f"r-{sid}", at, model="m", tokens_estimate=1000)
    await put(store, s)
    return s


async def again(store: FakeStore, sid: str, at: float) -> None:
    """A change of ``sid``'s pooled record that no wake-up names (a new request id)."""
    await store.update_session(sid, lambda s: None if s is None else on_request(s, "rx", at)[0])


D = Delivery(subject=subjects.plan(), headers={}, num_delivered=1, stream_seq=None, received_at=0.0)


class TestNamedReads:
    """A wake-up tick reads the sessions its wake-ups named, those of the plans heard since the
    last read and those listed by snapshots the planner has not answered, and reuses the rest
    of the pool as the last whole read saw it, for up to ``pool_every_s``."""

    async def test_a_wake_tick_reads_only_what_is_named(self, store: FakeStore) -> None:
        bus = FakeBus()
        v = valuator(store, bus)
        a, b = await pooled(store, "a"), await pooled(store, "b")
        await v.run_tick("period")
        await v.on_plan(plan(1), D)  # answered: nothing outstanding
        await again(store, "a", 991.0)
        await again(store, "b", 991.0)
        await v.run_tick("wake", {"a"})
        assert versions_of(snapshots(bus)[-1]) == {"a": a.version + 1, "b": b.version}
        assert v.named_ticks == 1
        await v.run_tick("period")  # a whole read sees b's change
        assert versions_of(snapshots(bus)[-1]) == {"a": a.version + 1, "b": b.version + 1}

    async def test_a_snapshot_not_answered_is_read_again(self, store: FakeStore) -> None:
        """The planner may have applied a snapshot whose plan has not arrived: its sessions
        are read again, so an admitted one is not listed as waiting at its old version."""
        bus = FakeBus()
        v = valuator(store, bus)
        await pooled(store, "a")
        await pooled(store, "b")
        await v.run_tick("period")  # tick 1 lists a and b
        await admit_on(store, "a", "n1", 2000, 991.0)
        await v.run_tick("wake", set())  # tick 1 unanswered: a and b read again
        assert [c.id for c in snapshots(bus)[-1].candidates] == ["b"]
        await v.on_plan(plan(2), D)  # answers ticks 1 and 2
        assert v.outstanding == {}
        b = await store.get_session("b")
        assert b is not None
        await again(store, "b", 992.0)
        await v.run_tick("wake", set())  # nothing outstanding, nothing moved: b reused
        assert versions_of(snapshots(bus)[-1]) == {"b": b.version}

    async def test_a_candidate_the_plan_cannot_move_is_not_outstanding(
        self, store: FakeStore
    ) -> None:
        """A candidate eligible on no node (here: too large for any node) cannot be admitted by
        the plan of its snapshot, so it is not read again for that snapshot."""
        v = valuator(store, FakeBus())
        await pooled(store, "a")
        big, _ = on_request(Session("big"), "r-big", 990.0, model="m", tokens_estimate=500_000)
        await put(store, big)
        await v.run_tick("period")
        assert v.outstanding == {1: (NOW, frozenset({"a"}))}

    async def test_a_plans_sessions_are_read_at_the_next_tick(self, store: FakeStore) -> None:
        bus = FakeBus()
        v = valuator(store, bus)
        await pooled(store, "a")
        b = await pooled(store, "b")
        await v.run_tick("period")
        await v.on_plan(plan(1, admitted=["b"]), D)
        await again(store, "b", 991.0)
        await v.run_tick("wake", set())
        assert versions_of(snapshots(bus)[-1])["b"] == b.version + 1
        assert v.moved == set()  # taken by that tick

    async def test_whole_reads(self, store: FakeStore) -> None:
        """A wake-up that named none, a wake tick a second after the last whole read, and any
        tick under ThunderAgent read the whole pool."""
        now = [NOW]
        bus = FakeBus()
        v = valuator(store, bus)
        v.clock = lambda: now[0]
        b = await pooled(store, "b")
        await v.run_tick("period")
        await v.on_plan(plan(1), D)
        await again(store, "b", 991.0)
        await v.run_tick("wake", None)
        assert versions_of(snapshots(bus)[-1]) == {"b": b.version + 1}
        await v.on_plan(plan(2), D)
        await again(store, "b", 992.0)
        now[0] += v.pool_every_s
        await v.run_tick("wake", set())
        assert versions_of(snapshots(bus)[-1]) == {"b": b.version + 2}
        assert v.named_ticks == 0
        ta = valuator(store, FakeBus())
        ta.thunderagent = True
        await ta.run_tick("period")
        await again(store, "b", 993.0)
        await ta.run_tick("wake", set())
        assert ta.named_ticks == 0

    async def test_a_plan_of_another_valuations_tick_answers_nothing(
        self, store: FakeStore
    ) -> None:
        v = valuator(store, FakeBus())
        await pooled(store, "a")
        await v.run_tick("period")
        await v.on_plan(plan(7, interrupted=["x"]), D)
        assert (v.answered, set(v.outstanding), v.moved) == (0, {1}, {"x"})

    async def test_the_idle_sweep_names_what_it_ended(self, store: FakeStore) -> None:
        a2 = await admitted_in_a_call(store, "a")
        await put(store, on_response(a2, 102.0, total_tokens=1500))
        v = valuator(store, FakeBus(), now=102.0 + 301.0)
        assert await v.sweep_idle() == ["a"]
        assert v.moved == {"a"}


class TestTicker:
    async def test_wake_ends_the_wait_early(self) -> None:
        """A wake-up ends the period wait early (after the debounce) and reports "wake"."""
        t = Ticker()
        d = Delivery(
            subject=subjects.wake(), headers={}, num_delivered=1, stream_seq=None, received_at=0.0
        )
        await t.on_wake(Wake(reason="arrival", ts=0.0), d)
        with anyio.fail_after(5):
            assert await t.wait(60.0, 0.0) == "wake"

    async def test_no_wake_is_a_period_tick(self) -> None:
        """Without a wake-up the wait ends at the period."""
        assert await Ticker().wait(0.0, 0.0) == "period"

    @pytest.mark.parametrize("debounce_s", [0.0005, 0.002])
    async def test_wakes_within_the_debounce_make_one_tick(self, debounce_s: float) -> None:
        """Wake-ups that arrive while the first one is being debounced are taken with it, for
        a debounce below the loop's timer resolution (one pass of the loop, not a sleep
        that would last a millisecond or more) as for a longer one."""
        t = Ticker()
        d = Delivery(
            subject=subjects.wake(), headers={}, num_delivered=1, stream_seq=None, received_at=0.0
        )
        await t.on_wake(Wake(reason="arrival", ts=0.0), d)
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(t.on_wake, Wake(reason="tool_end", ts=0.0), d)
                assert await t.wait(60.0, debounce_s) == "wake"
            assert t.wakes == 2
            assert await t.wait(0.0, debounce_s) == "period"  # both went into that one tick

    async def test_the_names_are_gathered_until_taken(self) -> None:
        """The sessions the wake-ups name are gathered until the tick loop takes them; one
        wake-up that names none makes the next tick read the whole pool."""
        t = Ticker()
        d = Delivery(
            subject=subjects.wake(), headers={}, num_delivered=1, stream_seq=None, received_at=0.0
        )
        await t.on_wake(Wake(reason="arrival", ts=0.0, session_id="a"), d)
        await t.on_wake(Wake(reason="tool_end", ts=0.0, session_ids=["b", "c"]), d)
        assert t.take() == {"a", "b", "c"}
        assert t.take() == set()
        await t.on_wake(Wake(reason="arrival", ts=0.0, session_id="a"), d)
        await t.on_wake(Wake(reason="replan", ts=0.0), d)
        await t.on_wake(Wake(reason="arrival", ts=0.0, session_id="d"), d)
        assert t.take() is None
        assert t.take() == set()


class TestSnapshotFitsThePayload:
    """A pool of thousands encodes past nats-server's 1 MiB ``max_payload``; the soak's 10,000
    arrivals at once made every tick fail to publish, and nothing was ever admitted. The
    snapshot now keeps the share of its sessions that fits (ready ones first); the rest wait
    for a later tick."""

    async def test_a_pool_too_large_for_one_message_is_published_in_part(
        self, store: FakeStore
    ) -> None:
        from services.valuation.handlers import PAYLOAD_MARGIN, fit_payload

        bus = FakeBus()
        for i in range(300):
            s, _ = on_request(Session(f"s{i:03d}"), "r1", 100.0, model="m", tokens_estimate=900)
            await put(store, s)
        whole = await valuator(store, FakeBus(), now=101.0).run_tick("test")
        assert len(whole.candidates) == 300
        bus.max_payload = PAYLOAD_MARGIN + 12_000
        v = valuator(store, bus, now=101.0)
        await v.run_tick("test")
        sent = [d for s, d, _ in bus.published if s == subjects.valuation_snapshot()]
        assert len(sent) == 1 and len(sent[0]) <= bus.max_payload - PAYLOAD_MARGIN
        got = decode(sent[0], ValuationSnapshot)
        assert 0 < len(got.candidates) < 300
        ids = [c.id for c in got.candidates]
        assert len(set(ids)) == len(ids)
        data, deferred = fit_payload(got, 10**9)
        assert deferred == 0 and decode(data, ValuationSnapshot) == got
