"""ThunderAgent in the live planner (FakeBus + FakeStore): pause, marks, checks, forced resume."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from services.planner.handlers import Planner, Snapshot, decode_snapshot
from services.planner.thunder import Held, ThunderState, held_sessions
from services.valuation.handlers import Valuator
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.errors import ContractError
from shared.contracts.plan import Placement
from shared.core.policies import get_policy
from shared.core.problem import Node
from shared.core.session import Activity, Session, ToolCall, on_request, on_response
from shared.core.tick import TickCandidate, TickSnapshot
from shared.core.valuation import DEFAULT_RESERVE, ValuationParams
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger

T0 = 1000.0


@dataclass
class Clock:
    t: float = T0

    def __call__(self) -> float:
        return self.t


@dataclass
class Rig:
    """A store with one node, a thunderagent valuator and planner sharing a clock and bus."""

    store: FakeStore
    bus: FakeBus
    clock: Clock
    valuator: Valuator
    planner: Planner

    async def snapshot(self) -> Snapshot:
        """Run one valuation tick and decode the snapshot it published, as the planner does."""
        before = len(self.bus.published)
        await self.valuator.run_tick()
        sent = [d for s, d, _ in self.bus.published[before:] if s == subjects.valuation_snapshot()]
        assert len(sent) == 1, "the thunderagent valuation publishes every tick"
        return decode_snapshot(sent[0])

    async def tick(self, at: float) -> None:
        """Value and plan at time ``at``."""
        self.clock.t = at
        await self.planner.plan_once(await self.snapshot())

    def placements(self) -> list[tuple[str, str]]:
        out = [decode(d, Placement) for s, d, _ in self.bus.published if ".placement." in s]
        return [(p.kind, p.session_id) for p in out]


async def rig(capacity: int) -> Rig:
    store = FakeStore()
    await store.put_node_status(
        "n1", capacity_tokens=capacity, target_utilisation=1.0, healthy=True
    )
    bus = FakeBus()
    clock = Clock()
    log = get_logger("test")
    valuator = Valuator(store, bus, log, ValuationParams(), 1e9, clock, thunderagent=True)
    planner = Planner(
        store=store,
        bus=bus,
        log=log,
        policy=get_policy("thunderagent"),
        budget=150_000,
        time_limit_ms=5_000.0,
        clock=clock,
    )
    return Rig(store, bus, clock, valuator, planner)


async def held(store: FakeStore, sid: str, activity: Activity, tokens: int) -> None:
    """An admitted session on n1 reserving ``tokens`` (in a tool, running, or idle)."""
    tool = ToolCall("c", "bash", started_at=T0 - 5) if activity == "tool" else None
    s = Session(
        sid,
        version=1,
        activity=activity,
        node="n1",
        weight=tokens,
        tokens=tokens,
        model="m",
        gateway_id="gw1",
        request_id="r" if activity == "running" else None,
        tool=tool,
        turns=1,
    )
    await store.update_session(sid, lambda _o: s)


async def waiting(store: FakeStore, sid: str, tokens: int, at: float) -> None:
    s, _ = on_request(Session(sid), "r", at, model="m", gateway_id="gw1", tokens_estimate=tokens)
    await store.update_session(sid, lambda _o: s)


class TestPauseActing:
    async def test_over_capacity_pauses_acting_smallest_first(self) -> None:
        """On a node over ThunderAgent's capacity the smallest ACTING programs (idle or in a
        tool) are paused until it fits; larger ACTING and REASONING ones stay."""
        r = await rig(8_000)
        await held(r.store, "a", "tool", 4_000)
        await held(r.store, "b", "tool", 2_000)
        await held(r.store, "c", "running", 3_000)
        await held(r.store, "d", "idle", 1_500)
        # used = 4100 + 2100 + 3100 + 1600 = 10900: d frees 1600, b 2100 -> 8000 - 7200 >= 0
        await r.tick(T0)
        assert r.placements() == [("interrupt", "d"), ("interrupt", "b")]
        for sid in ("b", "d"):
            rec = await r.store.get_session(sid)
            assert rec is not None and rec.node is None
        kept = [await r.store.get_session(sid) for sid in ("a", "c")]
        assert [s.node for s in kept if s is not None] == ["n1", "n1"]
        assert r.planner.thunder.marked == {}

    async def test_running_tokens_count_towards_capacity(self) -> None:
        """The REASONING programs' tokens make a node over capacity that its ACTING ones alone
        would not fill, so an ACTING one is paused."""
        r = await rig(8_000)
        await held(r.store, "act", "tool", 2_000)
        await held(r.store, "run", "running", 6_000)
        await r.tick(T0)
        assert r.placements() == [("interrupt", "act")]

    async def test_within_capacity_pauses_nothing(self) -> None:
        """A node within capacity keeps every program."""
        r = await rig(20_000)
        await held(r.store, "a", "tool", 4_000)
        await held(r.store, "c", "running", 3_000)
        await r.tick(T0)
        assert r.placements() == []


class TestMarkedReasoning:
    async def test_marked_reasoning_paused_after_its_call_ends(self) -> None:
        """A REASONING program the check marks is not released while its call runs, and is
        paused on the first snapshot after its call ended."""
        r = await rig(8_000)
        await held(r.store, "r_big", "running", 6_000)
        await held(r.store, "r_small", "running", 3_000)
        await r.tick(T0)  # used 9200 > 8000, no ACTING program: mark the smallest REASONING one
        assert r.placements() == []
        assert set(r.planner.thunder.marked) == {"r_small"}
        await r.tick(T0 + 1)  # still running: stays admitted and marked
        assert r.placements() == []
        s = await r.store.get_session("r_small")
        assert s is not None
        done = on_response(s, T0 + 1.5, total_tokens=3_200, tool_calls=[("c1", "bash")])
        await r.store.update_session("r_small", lambda _o: done)
        await r.tick(T0 + 2)  # not a check time (5 s): the mark alone releases it
        assert r.placements() == [("interrupt", "r_small")]
        rec = await r.store.get_session("r_small")
        assert rec is not None and rec.node is None and rec.pooled
        big = await r.store.get_session("r_big")
        assert big is not None and big.node == "n1"
        assert r.planner.thunder.marked == {}

    async def test_marked_session_running_again_stays_marked(self) -> None:
        """A marked session whose next call started before any snapshot saw it between calls
        is not released while that call runs; it is released once that call ends."""
        r = await rig(8_000)
        await held(r.store, "r_big", "running", 6_000)
        await held(r.store, "r_small", "running", 3_000)
        await r.tick(T0)
        s = await r.store.get_session("r_small")
        assert s is not None
        done = on_response(s, T0 + 1.0, total_tokens=3_100)
        again, _ = on_request(done, "r2", T0 + 1.2)
        await r.store.update_session("r_small", lambda _o: again)
        await r.tick(T0 + 2)
        assert r.placements() == []
        assert set(r.planner.thunder.marked) == {"r_small"}
        idle = on_response(again, T0 + 2.5, total_tokens=3_300)
        await r.store.update_session("r_small", lambda _o: idle)
        await r.tick(T0 + 3)
        assert r.placements() == [("interrupt", "r_small")]

    def test_discarded_plan_keeps_the_mark(self) -> None:
        """When the plan that released a marked session is discarded, the mark is restored."""
        state = ThunderState(last_check=T0, marked={"m": "n1"})
        snap = TickSnapshot(1, T0 + 1, 512, (Node("n1", 0, 0),), ())
        step = state.step(snap, {"n1": 8_000}, (Held("m", "n1", 10, 10, "idle", 4),))
        assert [(m.session, m.version) for m in step.pauses] == [("m", 4)]
        assert state.marked == {}
        state.discarded()
        assert state.marked == {"m": "n1"}

    async def test_marked_session_ended_drops_its_mark(self) -> None:
        """A marked session that is no longer admitted (ended, released) loses its mark."""
        state = ThunderState(marked={"gone": "n1"})
        r = await rig(8_000)
        state.step((await r.snapshot()).core, {"n1": 8_000}, ())
        assert state.marked == {}


class TestPeriodicCheck:
    async def test_check_every_5s_even_with_empty_pool(self) -> None:
        """With an empty pool the valuation still publishes each tick and the planner runs the
        pause check at 5 s of snapshot time, not before."""
        r = await rig(10_000)
        await held(r.store, "a", "tool", 5_000)
        await r.tick(T0)  # first check: fits
        s = await r.store.get_session("a")
        assert s is not None
        grown = Session(**{**_fields(s), "tokens": 11_000, "version": s.version + 1})
        await r.store.update_session("a", lambda _o: grown)
        for dt in (1.0, 2.0, 3.0, 4.0):
            await r.tick(T0 + dt)
            assert r.placements() == [], f"no check before 5 s (t+{dt})"
        await r.tick(T0 + 5.0)
        assert r.placements() == [("interrupt", "a")]

    async def test_tao_valuation_skips_empty_pool(self) -> None:
        """Without thunderagent an empty, unchanged pool publishes nothing (the contrast)."""
        r = await rig(10_000)
        r.valuator.thunderagent = False
        await r.valuator.run_tick()
        assert not [s for s, _, _ in r.bus.published if s == subjects.valuation_snapshot()]


def _fields(s: Session) -> dict[str, object]:
    return {f: getattr(s, f) for f in Session.__dataclass_fields__}


class TestForcedResume:
    async def test_overdue_waiting_session_admitted_regardless_of_capacity(self) -> None:
        """A waiting session that does not fit is admitted on its node once it has waited
        1800 s, over the node's capacity, with an admit placement."""
        r = await rig(10_000)
        await held(r.store, "big", "idle", 9_000)
        await waiting(r.store, "w", 3_000, T0)
        await r.tick(T0)
        await r.tick(T0 + 1799.0)
        assert ("admit", "w") not in r.placements()
        w = await r.store.get_session("w")
        assert w is not None and w.node is None
        await r.tick(T0 + 1800.0)
        assert ("admit", "w") in r.placements()
        w = await r.store.get_session("w")
        assert w is not None and w.node == "n1" and w.activity == "running"
        node = await r.store.get_node("n1")
        assert node is not None and node.reserved == 9_000 + 3_000 + DEFAULT_RESERVE
        stats = await r.store.planner_stats()
        assert stats["forced_resumes"] == 1
        assert "w" not in r.planner.thunder.waiting

    @pytest.mark.parametrize(("origin", "node"), [("n1", "n1"), (None, "n2")])
    def test_forced_node_is_origin_else_most_free(self, origin: str | None, node: str) -> None:
        """A forced resume goes back to the node the session was paused from when it may still
        go there, else to its eligible node with the most free room."""
        state = ThunderState(last_check=T0 + 1800, waiting={"w": T0})
        if origin is not None:
            state.origin["w"] = (origin, T0)
        cand = TickCandidate("w", 3, 500, 400, 1, {}, frozenset({"n1", "n2"}), "", "reasoning")
        nodes = (Node("n1", 100, 0), Node("n2", 300, 0))
        snap = TickSnapshot(1, T0 + 1800, 512, nodes, (cand,))
        step = state.step(snap, {"n1": 1_000, "n2": 1_000}, ())
        assert [(m.session, m.node, m.weight, m.version) for m in step.forced] == [
            ("w", node, 500, 3)
        ]

    async def test_forced_resume_refused_when_session_moved(self) -> None:
        """A forced admit whose session changed since the snapshot is not applied."""
        r = await rig(10_000)
        await held(r.store, "big", "idle", 9_000)
        await waiting(r.store, "w", 3_000, T0)
        await r.tick(T0)
        r.clock.t = T0 + 1800.0
        snap = await r.snapshot()
        s = await r.store.get_session("w")
        assert s is not None
        moved = Session(**{**_fields(s), "version": s.version + 1})
        await r.store.update_session("w", lambda _o: moved)
        await r.planner.plan_once(snap)
        w = await r.store.get_session("w")
        assert w is not None and w.node is None
        assert "w" in r.planner.thunder.waiting


class TestWire:
    async def test_held_sessions_listed_only_under_thunderagent(self) -> None:
        """The snapshot lists admitted sessions outside a tool only under thunderagent."""
        r = await rig(10_000)
        await held(r.store, "run", "running", 1_000)
        await held(r.store, "tool", "tool", 1_000)
        snap = await r.snapshot()
        assert snap.held == (Held("run", "n1", 1_000, 1_000, "running", 1),)
        r.valuator.thunderagent = False
        await waiting(r.store, "w", 100, T0)
        await r.valuator.run_tick()
        last = [d for s, d, _ in r.bus.published if s == subjects.valuation_snapshot()][-1]
        assert decode_snapshot(last).held is None

    def test_bad_activity_refused(self) -> None:
        """An admitted entry with an unknown activity fails to decode (it is dead-lettered)."""
        data = (
            b'{"type":"ValuationSnapshot","tick":1,"now":1.0,"admitted":[{"id":"a","node":"n1",'
            b'"weight":1,"tokens":1,"activity":"zzz","signature":{"session_id":"a","version":1}}]}'
        )
        with pytest.raises(ContractError):
            decode_snapshot(data)

    def test_held_sessions_skips_tool_and_ended(self) -> None:
        """Only admitted, not ended sessions outside a tool are held programs."""
        ss = [
            Session("a", activity="running", node="n1", weight=5, tokens=5),
            Session("b", activity="tool", node="n1", weight=5, tokens=5),
            Session("c", activity="idle", node="n1", weight=5, tokens=5, ended=True),
            Session("d", activity="waiting"),
        ]
        assert [h.id for h in held_sessions(ss)] == ["a"]
