"""The planner on FakeBus + FakeStore: solve, verify-and-apply, placements, supersession."""

from __future__ import annotations

import msgspec
import pytest

from services.planner.handlers import Planner, Snapshot, decode_snapshot
from services.planner.mapping import to_wire
from services.planner.thunder import Held, ThunderState
from services.valuation.handlers import Valuator
from shared.contracts import subjects
from shared.contracts.codec import decode, encode
from shared.contracts.errors import ContractError
from shared.contracts.plan import Placement, Plan
from shared.contracts.wake import WAKE_REPLAN, Wake
from shared.core.interrupt import InterruptCandidate
from shared.core.policies import get_policy
from shared.core.problem import ZERO, Node, PlanResult
from shared.core.session import Session, on_request, on_response
from shared.core.tick import Decision, Move, TickSnapshot
from shared.core.valuation import ValuationParams
from shared.infra.busapi import Delivery
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.lease import Leadership, MemoryLeaseTable, lease_key
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate

NOW = 1000.0
DELIVERY = Delivery(subjects.valuation_snapshot(), {}, 1, None, NOW)


def planner(store: FakeStore, bus: FakeBus, policy: str = "tao") -> Planner:
    return Planner(
        store=store,
        bus=bus,
        log=get_logger("test"),
        policy=get_policy(policy),
        budget=150_000,
        time_limit_ms=5_000.0,
        clock=lambda: NOW,
    )


async def pool(store: FakeStore, *sizes: int, gateway: str | None = "gw1") -> None:
    """One waiting session per size, ids s0, s1, …"""
    for i, tokens in enumerate(sizes):
        s, _ = on_request(
            Session(f"s{i}"), "r", NOW - 1, model="m", gateway_id=gateway, tokens_estimate=tokens
        )
        await store.update_session(s.id, lambda _o, s=s: s)


async def snapshot(store: FakeStore, bus: FakeBus, thunder: bool = False) -> Snapshot:
    """Value the store as the valuation service does (``thunder``: as under
    TAO_POLICY=thunderagent) and decode it as the planner does."""
    v = Valuator(
        store, bus, get_logger("test"), ValuationParams(), 300.0, lambda: NOW, thunderagent=thunder
    )
    core = await v.run_tick()
    views = await store.node_views()
    return decode_snapshot(encode(to_wire(core, views)))


def placements(bus: FakeBus) -> list[Placement]:
    return [decode(d, Placement) for s, d, _ in bus.published if ".placement." in s]


def wakes(bus: FakeBus) -> list[Wake]:
    return [decode(d, Wake) for s, d, _ in bus.published if s == subjects.wake()]


def plans(bus: FakeBus) -> list[Plan]:
    return [decode(d, Plan) for s, d, _ in bus.published if s == subjects.plan()]


@pytest.fixture
async def store() -> FakeStore:
    st = FakeStore()
    await st.put_node_status(
        "n1", NodeUpdate(capacity_tokens=10_000, target_utilisation=1.0, healthy=True)
    )
    return st


class TestPlanAndApply:
    async def test_admits_and_publishes_placements(self, store: FakeStore) -> None:
        """Two sessions that fit are admitted, reserved, and each gets an admit placement."""
        bus = FakeBus()
        await pool(store, 2000, 3000)
        applied = await planner(store, bus).plan_once(await snapshot(store, bus))
        assert applied is not None and not applied.discarded
        assert {m.session for m in applied.admitted} == {"s0", "s1"}
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 2512 + 3512
        sent = placements(bus)
        assert {(p.kind, p.session_id, p.node_id, p.gateway_id) for p in sent} == {
            ("admit", "s0", "n1", "gw1"),
            ("admit", "s1", "n1", "gw1"),
        }
        for p in sent:
            rec = await store.get_session(p.session_id)
            assert rec is not None and rec.version == p.version and rec.activity == "running"
        [plan] = plans(bus)
        assert (plan.policy, plan.exact, len(plan.assignments)) == ("tao", True, 2)
        stats = await store.planner_stats()
        assert (stats["ticks"], stats["plans_applied"]) == (1, 1)

    async def test_baseline_solves_are_not_fallbacks(self, store: FakeStore) -> None:
        """A baseline policy's result is never exact, yet it is not counted as a fallback."""
        bus = FakeBus()
        await pool(store, 2000, 3000)
        applied = await planner(store, bus, "rr").plan_once(await snapshot(store, bus))
        assert applied is not None
        [plan] = plans(bus)
        stats = await store.planner_stats()
        assert plan.exact is False and stats["solves"] == 1
        assert (stats["fallbacks"], stats["solves_exact"]) == (0, 0)

    async def test_version_change_discards_plan(self, store: FakeStore) -> None:
        """A selected session that changed after the snapshot discards the whole plan."""
        bus = FakeBus()
        await pool(store, 2000, 3000)
        snap = await snapshot(store, bus)
        s0 = await store.get_session("s0")
        assert s0 is not None
        await store.update_session(
            "s0", lambda s: msgspec.structs.replace(s0, version=s0.version + 1)
        )
        applied = await planner(store, bus).plan_once(snap)
        assert applied is not None and applied.discarded and applied.changed == ("s0",)
        assert placements(bus) == []
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 0
        assert (await store.planner_stats())["plans_discarded"] == 1
        assert wakes(bus) == [Wake(reason=WAKE_REPLAN, ts=NOW, session_id="s0")]

    async def test_a_plan_after_its_own_admissions_asks_again(self, store: FakeStore) -> None:
        """A burst valued in two ticks: the second snapshot, taken before the first plan was
        applied, still shows the first plan's sessions waiting. Its plan is discarded, and the
        planner asks for a fresh snapshot (a wake-up) instead of leaving the rest of the burst
        to the valuation's next period; that snapshot's plan admits them."""
        bus = FakeBus()
        p = planner(store, bus)
        await pool(store, 2000)
        first = await snapshot(store, bus)
        await pool(store, 2000, 3000)  # s1 arrives; s0 is rewritten as it was
        second = await snapshot(store, bus)
        assert not (await p.plan_once(first)).discarded  # type: ignore[union-attr]
        assert wakes(bus) == []
        applied = await p.plan_once(second)
        assert applied is not None and applied.discarded and applied.changed == ("s0",)
        assert [w.reason for w in wakes(bus)] == [WAKE_REPLAN]
        third = await p.plan_once(await snapshot(store, bus))
        assert third is not None and [m.session for m in third.admitted] == ["s1"]
        assert len(wakes(bus)) == 1

    async def test_capacity_shrink_applies_prefix(self, store: FakeStore) -> None:
        """When live capacity shrank after the snapshot only the plan prefix that fits is
        applied and published, and the node is never over-committed."""
        bus = FakeBus()
        await pool(store, 4000, 3000, 2000)
        snap = await snapshot(store, bus)
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=6_000))
        applied = await planner(store, bus).plan_once(snap)
        assert applied is not None and not applied.discarded and applied.truncated
        assert 0 < len(applied.admitted) < 3
        node = await store.get_node("n1")
        assert node is not None and node.reserved <= node.usable
        assert node.reserved == sum(m.weight for m in applied.admitted)
        assert [p.session_id for p in placements(bus)] == [m.session for m in applied.admitted]
        assert (await store.planner_stats())["plans_truncated"] == 1

    async def test_never_over_commits(self, store: FakeStore) -> None:
        """Demand beyond capacity is admitted only up to the node's usable capacity."""
        bus = FakeBus()
        await pool(store, *([1500] * 8))
        p = planner(store, bus)
        for _ in range(3):
            await p.plan_once(await snapshot(store, bus))
        node = await store.get_node("n1")
        assert node is not None and 0 < node.reserved <= node.usable
        assert len(placements(bus)) == node.reserved // 2012

    async def test_session_without_gateway_gets_no_placement(self, store: FakeStore) -> None:
        """A session admitted without a gateway id is reserved but gets no placement."""
        bus = FakeBus()
        await pool(store, 1000, gateway=None)
        applied = await planner(store, bus).plan_once(await snapshot(store, bus))
        assert applied is not None and len(applied.admitted) == 1
        assert placements(bus) == []

    async def test_empty_pool_is_not_solved(self, store: FakeStore) -> None:
        """An empty snapshot counts a tick and publishes nothing."""
        bus = FakeBus()
        snap = Snapshot(TickSnapshot(tick=5, now=NOW, quantum=512, nodes=(), candidates=()), {})
        assert await planner(store, bus).plan_once(snap) is None
        assert plans(bus) == [] and (await store.planner_stats())["ticks"] == 1


class TestWhereTheSolveRuns:
    @pytest.mark.parametrize(("inline_pairs", "on_loop"), [(512, True), (1, False)])
    async def test_a_small_problem_on_the_loop_a_large_one_in_the_thread(
        self, store: FakeStore, monkeypatch: pytest.MonkeyPatch, inline_pairs: int, on_loop: bool
    ) -> None:
        """Up to INLINE_PAIRS candidate-node pairs the solve runs on the event loop's thread,
        past it in the worker thread; the plan is the same either way."""
        import threading

        import services.planner.handlers as handlers

        monkeypatch.setattr(handlers, "INLINE_PAIRS", inline_pairs)
        threads: list[threading.Thread] = []
        real = handlers.decide

        def spy(*args: object, **kw: object) -> Decision:
            threads.append(threading.current_thread())
            return real(*args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(handlers, "decide", spy)
        bus = FakeBus()
        await pool(store, 2000, 3000)
        applied = await planner(store, bus).plan_once(await snapshot(store, bus))
        assert applied is not None and len(applied.admitted) == 2
        assert len(threads) == 1
        assert (threads[0] is threading.main_thread()) == on_loop


class TestLatestOnly:
    async def test_newer_snapshot_supersedes_pending(self, store: FakeStore) -> None:
        """While a snapshot waits, a newer one replaces it; an older one never does."""
        bus = FakeBus()
        p = planner(store, bus)

        def snap(tick: int) -> Snapshot:
            return Snapshot(
                TickSnapshot(tick=tick, now=NOW, quantum=512, nodes=(), candidates=()), {}
            )

        await p.on_snapshot(snap(1), DELIVERY)
        await p.on_snapshot(snap(3), DELIVERY)
        await p.on_snapshot(snap(2), DELIVERY)
        assert p.pending is not None and p.pending.core.tick == 3
        assert p.superseded == 2 and p.ready.is_set()

    async def test_bad_snapshot_payload_is_a_contract_error(self) -> None:
        """A snapshot with an unknown phase fails to decode (the bus dead-letters it)."""
        data = (
            b'{"type":"ValuationSnapshot","tick":1,"now":1.0,"candidates":[{"id":"a",'
            b'"weight":1,"tokens":1,"phase":"zzz","signature":{"session_id":"a","version":1}}]}'
        )
        with pytest.raises(ContractError):
            decode_snapshot(data)


class TestThunderAgentPause:
    @pytest.mark.parametrize("policy", ["thunderagent", "thunderagent-ideal"])
    def test_acting_programs_paused_smallest_first(self, policy: str) -> None:
        """On a node over ThunderAgent's capacity the check pauses the smallest ACTING programs
        until it fits (``tokens + 100`` each, REASONING ones counted), under both variants."""
        snap = TickSnapshot(
            tick=1,
            now=NOW,
            quantum=512,
            nodes=(Node("n1", 0, load=9000),),
            candidates=(),
            interrupts=(
                InterruptCandidate("big", "n1", 4000, 0, 0, 4000),
                InterruptCandidate("small", "n1", 2000, 0, 0, 2000),
            ),
            versions={"big": 3, "small": 5},
        )
        held = (Held("run", "n1", 3000, 3000, "running", 2),)
        # used = 4000+100 + 2000+100 + 3000+100 = 9300 > 8000: pausing small leaves 7200
        step = ThunderState.for_policy(policy).step(snap, {"n1": 8000}, held)
        assert [(m.session, m.version) for m in step.pauses] == [("small", 5)]
        assert ThunderState.for_policy(policy).step(snap, {"n1": 20_000}, held).pauses == ()

    async def test_thunderagent_planner_uses_pause_rule(self, store: FakeStore) -> None:
        """With TAO_POLICY=thunderagent the planner's interrupts come from the pause rule."""
        bus = FakeBus()
        await pool(store, 1000)
        snap = await snapshot(store, bus, thunder=True)
        p = planner(store, bus, "thunderagent")
        applied = await p.plan_once(snap)
        assert applied is not None and [m.session for m in applied.admitted] == ["s0"]
        assert applied.interrupted == ()
        assert plans(bus)[0].policy == "thunderagent"


class TestResync:
    async def test_restart_republishes_current_admissions(self, store: FakeStore) -> None:
        """On start the planner re-publishes one admit per admitted session at its version."""
        bus = FakeBus()
        await pool(store, 1000, 1000)
        await planner(store, bus).plan_once(await snapshot(store, bus))
        first = {(p.session_id, p.version) for p in placements(bus)}
        bus.published.clear()
        assert await planner(store, bus).resync() == 2
        assert {(p.session_id, p.version) for p in placements(bus)} == first


class TestThunderAgentLive:
    async def test_over_capacity_node_pauses_acting_session(self, store: FakeStore) -> None:
        """With thunderagent, an acting session whose tokens overflow its node is paused
        (an interrupt placement) by the pause rule, not by TAO's interrupt rule."""
        bus = FakeBus()
        big, _ = on_request(Session("big"), "r", NOW - 9, model="m", gateway_id="gw1")
        await store.update_session("big", lambda _o: big)
        s = await store.get_session("big")
        assert s is not None
        d = Decision(1, (), (Move("big", "n1", 2000, s.version),), PlanResult((), ZERO, True, "t"))
        assert not (await store.apply(d, NOW - 8)).discarded
        s = await store.get_session("big")
        assert s is not None
        grown = on_response(s, NOW - 5, total_tokens=9_950, tool_calls=[("c", "bash")])
        await store.update_session("big", lambda _o: grown)
        await pool(store, 1000)
        applied = await planner(store, bus, "thunderagent").plan_once(
            await snapshot(store, bus, thunder=True)
        )
        assert applied is not None and [m.session for m in applied.interrupted] == ["big"]
        kinds = {(p.kind, p.session_id) for p in placements(bus)}
        assert ("interrupt", "big") in kinds
        rec = await store.get_session("big")
        assert rec is not None and rec.node is None and rec.pooled


class TestLeadership:
    async def test_standby_drops_snapshots_and_a_deposed_leaders_plan_is_fenced(
        self, store: FakeStore
    ) -> None:
        """Two planner replicas on one lease: the standby plans nothing; after the leader
        stalls past its lease the standby takes over, fences the domain and re-publishes the
        admissions; the old leader's plan, applied late under its old epoch (its own clock
        still says it leads: the race between its check and its apply), changes nothing and
        publishes no placement, while the new leader's plan admits."""
        now = [0.0]
        table = MemoryLeaseTable(2.0, lambda: now[0])
        frozen = Leadership(table, lease_key("planner", "default"), "a", clock=lambda: 0.0)
        bus_a, bus_b = FakeBus(), FakeBus()
        a, b = planner(store, bus_a), planner(store, bus_b)
        a.leader = frozen
        b.leader = Leadership(table, frozen.key, "b", clock=lambda: now[0])
        assert await frozen.step() and not await b.leader.step()
        await pool(store, 1000)
        assert await a.plan_once(await snapshot(store, bus_a)) is None  # not fenced yet
        assert a.standby_skips == 1
        await a.on_leadership(frozen.epoch)
        assert await b.plan_once(await snapshot(store, bus_b)) is None
        assert b.standby_skips == 1 and placements(bus_b) == []
        applied = await a.plan_once(await snapshot(store, bus_a))
        assert applied is not None and [m.session for m in applied.admitted] == ["s0"]
        s1, _ = on_request(
            Session("s1"), "r", NOW, model="m", gateway_id="gw1", tokens_estimate=1000
        )
        await store.update_session("s1", lambda _o: s1)  # s1 arrives (s0 is admitted)
        now[0] = 2.0  # a stopped renewing: the key lapsed
        assert await b.leader.step() and b.leader.epoch > frozen.epoch
        await b.on_leadership(b.leader.epoch)
        assert [p.session_id for p in placements(bus_b)] == ["s0"]  # re-published admission
        late = await a.plan_once(await snapshot(store, bus_a))
        assert late is not None and late.fenced and late.admitted == ()
        assert [p.session_id for p in placements(bus_a)] == ["s0"]  # nothing new from a
        assert wakes(bus_a) == []  # and a deposed leader asks for no fresh snapshot
        s1 = await store.get_session("s1")
        assert s1 is not None and s1.node is None
        won = await b.plan_once(await snapshot(store, bus_b))
        assert won is not None and not won.fenced and [m.session for m in won.admitted] == ["s1"]
        assert (await store.planner_stats())["plans_fenced"] == 1
