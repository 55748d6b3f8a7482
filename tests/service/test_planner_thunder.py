"""ThunderAgent in the live planner (FakeBus + FakeStore): pause, marks, checks, forced resume.

The planner drives :class:`shared.core.thunder.ThunderAgent` (the simulator's machine) from
valuation snapshots, under both ``thunderagent`` (FAITHFUL: the code's router) and
``thunderagent-ideal`` (IDEAL). Faithful semantics the tests pin (they replaced the earlier
"until safe" pause rule of :mod:`shared.core.policies.thunderagent`): resumes happen only in the
5 s check, except a new program admitted at once when the global queue is empty and a node has
room for ``tokens + 100``; the pause loop marks *every* REASONING program on a node still
over-full once its ACTING ones are gone; tokens change only at a request or a response; a
resume reserves ``tokens + 100``.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import pytest

from services.planner.handlers import Planner, Snapshot, decode_snapshot
from services.planner.thunder import THUNDERAGENT_POLICIES, Held, ThunderState, held_sessions
from services.valuation.handlers import Valuator
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.errors import ContractError
from shared.contracts.plan import Placement
from shared.core.policies import get_policy
from shared.core.problem import Node
from shared.core.session import Activity, Session, ToolCall, on_end, on_request, on_response
from shared.core.thunder import BUFFER_PER_PROGRAM, FAITHFUL, IDEAL, VARIANTS, Variant
from shared.core.tick import TickCandidate, TickSnapshot
from shared.core.valuation import ValuationParams
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate

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

    @property
    def thunder(self) -> ThunderState:
        assert self.planner.thunder is not None
        return self.planner.thunder


async def rig(
    capacity: int, policy: str = "thunderagent", used: int | None = None, target: float = 1.0
) -> Rig:
    """``used``: the engine's KV in use as telemetry reports it (default ``capacity``: it holds
    every program's tokens, no prefix shared, so ``thunderagent-ideal`` has no shared tokens)."""
    store = FakeStore()
    await store.put_node_status(
        "n1",
        NodeUpdate(
            capacity_tokens=capacity,
            target_utilisation=target,
            healthy=True,
            used_tokens=capacity if used is None else used,
        ),
    )
    bus = FakeBus()
    clock = Clock()
    log = get_logger("test")
    valuator = Valuator(store, bus, log, ValuationParams(), 1e9, clock, thunderagent=True)
    planner = Planner(
        store=store,
        bus=bus,
        log=log,
        policy=get_policy(policy),
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


async def respond(store: FakeStore, sid: str, tokens: int, at: float, tool: bool = True) -> None:
    """The session's call ended with ``tokens`` of context (into a tool, or idle)."""
    s = await store.get_session(sid)
    assert s is not None
    calls = [("c1", "bash")] if tool else []
    done = on_response(s, at, total_tokens=tokens, tool_calls=calls)
    await store.update_session(sid, lambda _o: done)


async def request(store: FakeStore, sid: str, at: float) -> None:
    """The session's next request arrived."""
    s = await store.get_session(sid)
    assert s is not None
    again, _ = on_request(s, "r2", at)
    await store.update_session(sid, lambda _o: again)


async def bump_version(store: FakeStore, sid: str) -> None:
    """The session's record changed (another writer) since a snapshot was taken."""
    s = await store.get_session(sid)
    assert s is not None
    moved = msgspec.structs.replace(s, version=s.version + 1)
    await store.update_session(sid, lambda _o: moved)


async def end(store: FakeStore, sid: str, at: float) -> None:
    s = await store.get_session(sid)
    assert s is not None
    await store.update_session(sid, lambda _o: on_end(s, at))


POLICIES = sorted(THUNDERAGENT_POLICIES)


class TestPolicies:
    @pytest.mark.parametrize(
        ("policy", "variant"), [("thunderagent", FAITHFUL), ("thunderagent-ideal", IDEAL)]
    )
    async def test_both_names_drive_the_machine(self, policy: str, variant: Variant) -> None:
        """Both policy names get the ThunderAgent path, each with its variant."""
        r = await rig(10_000, policy)
        assert r.thunder.variant == variant
        await waiting(r.store, "w", 1_000, T0)
        await r.tick(T0)
        assert r.placements() == [("admit", "w")]
        assert r.thunder.ta is not None and r.thunder.ta.variant.name == policy

    def test_other_policies_do_not(self) -> None:
        p = Planner(FakeStore(), FakeBus(), get_logger("t"), get_policy("tao"), 1, 1.0)
        assert p.thunder is None
        with pytest.raises(ValueError, match="not a ThunderAgent variant"):
            ThunderState.for_policy("tao")


async def _case_fits(r: Rig, t: float) -> str:
    """A new program arriving to an empty queue, with room for it: admitted at once."""
    if t == 0:
        await held(r.store, "a", "running", 6_000)
    if t == 1:
        await waiting(r.store, "w", 3_000, T0 + t)  # 10000 - 6100 = 3900 >= 3100
    return "w"


async def _case_behind_queue(r: Rig, t: float) -> str:
    """A new program that fits, arriving while another waits in the queue: faithfully queued
    until the check (router.py:249-281 admits directly only with an empty queue)."""
    if t == 0:
        await held(r.store, "a", "running", 6_000)
    if t == 1:
        await waiting(r.store, "q", 5_000, T0 + t)  # 5100 > 3900: queued
    if t == 2:
        await waiting(r.store, "w", 1_000, T0 + t)
    return "w"


async def _case_freed(r: Rig, t: float) -> str:
    """A queued program, room freed by a session leaving at t+2."""
    if t == 0:
        await held(r.store, "a", "running", 6_000)
    if t == 1:
        await waiting(r.store, "q", 5_000, T0 + t)
    if t == 2:
        await end(r.store, "a", T0 + t)
    return "q"


async def _case_paused_request(r: Rig, t: float) -> str:
    """An ACTING program paused by the first check; room is freed at t+1 and its next request
    comes at t+2: faithfully it blocks until the next check (router.py:330-333)."""
    if t == 0:
        await held(r.store, "a", "tool", 6_000)
        await held(r.store, "b", "running", 5_000)  # 6100 + 5100 > 10000: a is paused
    if t == 1:
        await end(r.store, "b", T0 + t)
    if t == 2:
        await request(r.store, "a", T0 + t)
    return "a"


class TestResumeTiming:
    @pytest.mark.parametrize(
        ("case", "faithful", "ideal"),
        [
            (_case_fits, 1, 1),
            (_case_behind_queue, 5, 2),
            (_case_freed, 5, 2),
            (_case_paused_request, 5, 1),
        ],
        ids=["new-fits-empty-queue", "new-behind-queue", "room-freed", "paused-request"],
    )
    @pytest.mark.parametrize("policy", POLICIES)
    async def test_first_admit(self, case: object, faithful: int, ideal: int, policy: str) -> None:
        """``thunderagent`` resumes only in the check (every 5 s from the first snapshot), a new
        program with an empty queue and room excepted; ``thunderagent-ideal`` resumes on the
        snapshot that shows a program waiting, paused or gone."""
        r = await rig(10_000, policy)
        expected = ideal if VARIANTS[policy].resume_on_event else faithful
        first: int | None = None
        for t in range(7):
            target = await case(r, t)  # type: ignore[operator]
            await r.tick(T0 + t)
            if first is None and ("admit", target) in r.placements():
                first = t
        assert first == expected
        rec = await r.store.get_session(target)
        assert rec is not None and rec.node == "n1"
        assert rec.weight == rec.tokens + BUFFER_PER_PROGRAM  # a resume reserves tokens + 100


class TestPauseActing:
    @pytest.mark.parametrize("policy", POLICIES)
    async def test_over_capacity_pauses_acting_smallest_first(self, policy: str) -> None:
        """On a node over ThunderAgent's capacity the smallest ACTING programs (idle or in a
        tool) are paused until it fits; larger ACTING and REASONING ones stay."""
        r = await rig(8_000, policy)
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
        assert r.thunder.marked == set()

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
    @pytest.mark.parametrize(
        ("policy", "marked"),
        [("thunderagent", {"r_big", "r_small"}), ("thunderagent-ideal", {"r_small"})],
    )
    async def test_marked_reasoning_paused_after_its_call_ends(
        self, policy: str, marked: set[str]
    ) -> None:
        """A REASONING program the check marks is not released while its call runs, and is
        paused on the first snapshot after its call ended. The faithful loop marks every
        REASONING program of a node still over-full (marks do not change its remaining
        capacity, router.py:685-714); the ideal one only until safe."""
        r = await rig(8_000, policy)
        await held(r.store, "r_big", "running", 6_000)
        await held(r.store, "r_small", "running", 3_000)
        await r.tick(T0)  # used 9200 > 8000, no ACTING program: mark REASONING ones
        assert r.placements() == []
        assert r.thunder.marked == marked
        await r.tick(T0 + 1)  # still running: stays admitted and marked
        assert r.placements() == []
        await respond(r.store, "r_small", 3_200, T0 + 1.5)
        await r.tick(T0 + 2)  # not a check time (5 s): the mark alone releases it
        assert r.placements() == [("interrupt", "r_small")]
        rec = await r.store.get_session("r_small")
        assert rec is not None and rec.node is None and rec.pooled
        big = await r.store.get_session("r_big")
        assert big is not None and big.node == "n1"
        assert r.thunder.marked == marked - {"r_small"}

    async def test_marked_session_running_again_stays_marked(self) -> None:
        """A marked session whose next call started before any snapshot saw it between calls
        is not released while that call runs; it is released once that call ends."""
        r = await rig(8_000, "thunderagent-ideal")
        await held(r.store, "r_big", "running", 6_000)
        await held(r.store, "r_small", "running", 3_000)
        await r.tick(T0)
        await respond(r.store, "r_small", 3_100, T0 + 1.0, tool=False)
        await request(r.store, "r_small", T0 + 1.2)
        await r.tick(T0 + 2)
        assert r.placements() == []
        assert r.thunder.marked == {"r_small"}
        await respond(r.store, "r_small", 3_300, T0 + 2.5, tool=False)
        await r.tick(T0 + 3)
        assert r.placements() == [("interrupt", "r_small")]

    async def test_discarded_pause_follows_the_store(self) -> None:
        """When the plan that paused a marked session is discarded (its version moved), the
        next snapshot shows it still admitted and the machine takes it back as active."""
        r = await rig(8_000, "thunderagent-ideal")
        await held(r.store, "r_big", "running", 6_000)
        await held(r.store, "r_small", "running", 3_000)
        await r.tick(T0)
        await respond(r.store, "r_small", 3_200, T0 + 1.5)
        r.clock.t = T0 + 2
        snap = await r.snapshot()
        s = await r.store.get_session("r_small")
        assert s is not None
        moved = msgspec.structs.replace(s, version=s.version + 1)
        await r.store.update_session("r_small", lambda _o: moved)
        applied = await r.planner.plan_once(snap)
        assert applied is not None and applied.discarded
        ta = r.thunder.ta
        assert ta is not None and ta.programs["r_small"].paused
        await r.tick(T0 + 3)
        prog = ta.programs["r_small"]
        assert not prog.paused and prog.backend == "n1" and "r_small" not in ta.queue

    async def test_marked_session_ended_drops_its_mark(self) -> None:
        """A marked session that is no longer listed (ended) leaves the machine."""
        r = await rig(8_000, "thunderagent-ideal")
        await held(r.store, "r_big", "running", 6_000)
        await held(r.store, "r_small", "running", 3_000)
        await r.tick(T0)
        assert r.thunder.marked == {"r_small"}
        await end(r.store, "r_small", T0 + 1)
        await r.tick(T0 + 1)
        assert r.thunder.marked == set()
        assert r.thunder.ta is not None and "r_small" not in r.thunder.ta.programs


class TestPeriodicCheck:
    @pytest.mark.parametrize("policy", POLICIES)
    async def test_check_every_5s_even_with_empty_pool(self, policy: str) -> None:
        """With an empty pool the valuation still publishes each tick and the planner runs the
        pause check at 5 s of snapshot time, not before (a program's tokens change at its
        response, router.py:408)."""
        r = await rig(10_000, policy)
        await held(r.store, "a", "running", 5_000)
        await r.tick(T0)  # first check: fits
        await respond(r.store, "a", 11_000, T0 + 0.5)
        for dt in (1.0, 2.0, 3.0, 4.0):
            await r.tick(T0 + dt)
            assert r.placements() == [], f"no check before 5 s (t+{dt})"
        await r.tick(T0 + 5.0)
        assert r.placements() == [("interrupt", "a")]

    async def test_interval_is_configurable(self) -> None:
        """``TAO_TA_INTERVAL_S`` (the planner's ``ta_interval_s``) sets the check period."""
        r = await rig(10_000)
        r.planner.thunder = ThunderState.for_policy("thunderagent", 2.0)
        await held(r.store, "a", "running", 5_000)
        await r.tick(T0)
        await respond(r.store, "a", 11_000, T0 + 0.5)
        await r.tick(T0 + 1.0)
        assert r.placements() == []
        await r.tick(T0 + 2.0)
        assert r.placements() == [("interrupt", "a")]

    async def test_tao_valuation_skips_empty_pool(self) -> None:
        """Without thunderagent an empty, unchanged pool publishes nothing (the contrast)."""
        r = await rig(10_000)
        r.valuator.thunderagent = False
        await r.valuator.run_tick()
        assert not [s for s, _, _ in r.bus.published if s == subjects.valuation_snapshot()]


class TestForcedResume:
    # not thunderagent-decay: its check resumes w long before (big's idle tokens decay away)
    @pytest.mark.parametrize("policy", ["thunderagent", "thunderagent-ideal"])
    async def test_overdue_waiting_session_admitted_regardless_of_capacity(
        self, policy: str
    ) -> None:
        """A waiting session that does not fit is admitted on its node once it has waited
        1800 s, over the node's capacity, with an admit placement."""
        r = await rig(10_000, policy)
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
        assert node is not None and node.reserved == 9_000 + 3_000 + BUFFER_PER_PROGRAM
        stats = await r.store.planner_stats()
        assert stats["forced_resumes"] == 1
        assert "w" not in r.thunder.waiting

    @pytest.mark.parametrize(
        ("origin", "eligible", "node"),
        [("n1", {"n1", "n2"}, "n1"), (None, {"n1", "n2"}, "n2"), ("n1", {"n2"}, "n2")],
        ids=["origin", "fewest-programs", "origin-not-eligible"],
    )
    def test_forced_node(self, origin: str | None, eligible: set[str], node: str) -> None:
        """A forced resume goes back to the node the program was paused from (router.py:
        171-190), else to the node with the fewest programs; a node the session may not use
        is replaced by its eligible node with the most free room."""
        state = ThunderState.for_policy("thunderagent")
        cap = {"n1": 1_000, "n2": 400}  # neither has room for 400 + 100: w stays queued
        cand = TickCandidate("w", 3, 500, 400, 1, {}, frozenset(eligible), "", "reasoning")
        nodes = (Node("n1", 100, 900), Node("n2", 300, 0))
        hold = (Held("h", "n1", 900, 800, "running", 1),)
        state.step(TickSnapshot(1, T0, 512, nodes, (cand,)), cap, hold)
        assert state.ta is not None and "w" in state.ta.queue
        state.ta.programs["w"].origin = origin
        step = state.step(TickSnapshot(2, T0 + 1800, 512, nodes, (cand,)), cap, hold)
        assert [(m.session, m.node, m.weight, m.version) for m in step.forced] == [
            ("w", node, 400 + BUFFER_PER_PROGRAM, 3)
        ]

    async def test_forced_resume_refused_when_session_moved(self) -> None:
        """A forced admit whose session changed since the snapshot is not applied; its clock
        keeps running and it is retried."""
        r = await rig(10_000)
        await held(r.store, "big", "idle", 9_000)
        await waiting(r.store, "w", 3_000, T0)
        await r.tick(T0)
        r.clock.t = T0 + 1800.0
        snap = await r.snapshot()
        await bump_version(r.store, "w")
        await r.planner.plan_once(snap)
        w = await r.store.get_session("w")
        assert w is not None and w.node is None
        assert "w" in r.thunder.waiting
        await r.tick(T0 + 1801.0)
        w = await r.store.get_session("w")
        assert w is not None and w.node == "n1"


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
