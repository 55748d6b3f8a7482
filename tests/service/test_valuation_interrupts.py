"""The valuation tick reads interrupt candidates only when they can matter, and the planner's
decision is the same as on a snapshot that always lists them; the idle sweep runs on its own."""

from __future__ import annotations

from collections.abc import Mapping

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.planner.mapping import from_wire
from services.valuation.app import sweep_loop
from services.valuation.handlers import Valuator, interrupts_matter, with_interrupts
from shared.contracts.codec import decode
from shared.contracts.session import SessionEnd
from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.rules import DEFAULT_RULES, PAPER, RuleSet
from shared.core.session import Session, ToolCall
from shared.core.tick import decide, value_snapshot
from shared.core.valuation import NodeView, ValuationParams
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate
from tests.service.test_valuation_service import snapshots

NOW = 1000.0
PARAMS = ValuationParams()


def _pooled(i: int, tokens: int, ready: bool) -> Session:
    call = ToolCall(f"c{i}", "bash", NOW - 5.0, completed_at=NOW - 1.0 if ready else None)
    return Session(f"p{i:02d}", version=2, activity="tool", tokens=tokens, tool=call)


def _in_tool(i: int, node: str, weight: int, ready: bool, started: float = NOW - 1.0) -> Session:
    """Admitted in a tool: completed (r = 1), or 1 s into the 5 s default prediction (r = 0)."""
    call = ToolCall(f"t{i}", "bash", started, completed_at=NOW - 0.5 if ready else None)
    return Session(f"a{i:02d}", version=3, activity="tool", node=node, weight=weight,
                   tokens=weight - 512, tool=call)  # fmt: skip


world = st.tuples(
    st.lists(st.tuples(st.integers(0, 40_000), st.booleans()), max_size=6),  # pool
    st.lists(
        st.tuples(st.sampled_from(["n1", "n2"]), st.integers(512, 30_000), st.booleans()),
        max_size=6,
    ),  # admitted in a tool
    st.lists(
        st.tuples(st.integers(0, 90_000), st.integers(0, 100_000), st.booleans()),
        min_size=2,
        max_size=2,
    ),  # nodes: capacity, reserved, healthy
    st.one_of(st.none(), st.integers(-2_000, 2_000)),  # free - demand, near the boundary
)


def _build(w: tuple) -> tuple[list[Session], list[Session], list[NodeView]]:  # type: ignore[type-arg]
    """Sessions and nodes; with a slack, only n1 has room (n2 none: an unhealthy one would
    make the interrupts matter anyway) and its free capacity is the pool's demand plus the
    slack (the deficit test's boundary)."""
    pool = [_pooled(i, t, r) for i, (t, r) in enumerate(w[0])]
    tool = [_in_tool(i, n, wt, r) for i, (n, wt, r) in enumerate(w[1])]
    nodes = list(w[2])
    slack = w[3] if len(w) > 3 else None
    target = 0.9
    if slack is not None:
        demand = sum(s.tokens + PARAMS.reserve for s in pool)
        reserved = nodes[0][1]
        nodes = [(reserved + max(0, demand + slack), reserved, True), (0, 0, True)]
        target = 1.0
    views = [
        NodeView(id=f"n{j + 1}", capacity_tokens=cap, target_utilisation=target, reserved=res,
                 healthy=ok, models=None)
        for j, (cap, res, ok) in enumerate(nodes)
    ]  # fmt: skip
    return pool, tool, views


class TestReducedSnapshot:
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(world)
    def test_decide_is_unchanged(self, w: tuple) -> None:  # type: ignore[type-arg]
        """Without a shortfall decide() on the pool-only snapshot equals decide() on the full
        one (nobody is interrupted); with one, pool + candidates equals the full snapshot."""
        pool, tool, views = _build(w)
        res = {s.id: {"n1": (4000, NOW - 1.0)} for s in pool + tool}
        full = value_snapshot(pool + tool, views, res, History(), NOW, tick=3, params=PARAMS)
        reduced = value_snapshot(pool, views, res, History(), NOW, tick=3, params=PARAMS)
        policy = get_policy("tao")
        if interrupts_matter(reduced):
            tsnap = value_snapshot(tool, views, res, History(), NOW, tick=3, params=PARAMS)
            assert with_interrupts(reduced, tsnap) == full
            return
        a, b = decide(full, policy), decide(reduced, policy)
        assert a.interrupts == () and b.interrupts == ()
        assert (a.admits, a.result, a.demand, a.free) == (b.admits, b.result, b.demand, b.free)

    def test_both_cases_are_reached(self) -> None:
        """The deficit test sees a shortfall, an overflow, and plenty of room as such."""
        pool, _, views = _build(([(30_000, False)], [("n1", 20_000, False)],
                                    [(20_000, 0, True), (0, 0, False)]))  # fmt: skip
        snap = value_snapshot(pool, views, {}, History(), NOW, params=PARAMS)
        assert interrupts_matter(snap)
        pool, _, views = _build(([], [], [(20_000, 19_000, True), (0, 0, True)]))
        assert interrupts_matter(value_snapshot(pool, views, {}, History(), NOW, params=PARAMS))
        pool, _, views = _build(([(3_000, False)], [("n1", 2_000, False)],
                                    [(90_000, 2_000, True), (0, 0, True)]))  # fmt: skip
        snap = value_snapshot(pool, views, {}, History(), NOW, params=PARAMS)
        assert not interrupts_matter(snap)
        pool, _, views = _build(([(3_000, False)], [("n1", 2_000, False)],
                                    [(90_000, 2_000, True), (0, 0, False)]))  # fmt: skip
        snap = value_snapshot(pool, views, {}, History(), NOW, params=PARAMS)
        assert interrupts_matter(snap)  # n2 is down: its sessions are to be moved


def _valuator(
    store: FakeStore, bus: FakeBus, *, thunder: bool = False, rules: RuleSet = PAPER
) -> Valuator:
    return Valuator(store=store, bus=bus, log=get_logger("test"), params=PARAMS,
                    idle_timeout_s=300.0, clock=lambda: NOW, thunderagent=thunder,
                    rules=rules)  # fmt: skip


async def _world(capacity: int) -> FakeStore:
    """One pooled session (4,512 weight) and one admitted in a tool past its predicted end."""
    st_ = FakeStore()
    await st_.put_node_status("n1", NodeUpdate(capacity_tokens=capacity, target_utilisation=1.0,
                              healthy=True, models=None))  # fmt: skip
    await st_.update_session("p00", lambda _: _pooled(0, 4000, False))
    await st_.update_session("a00", lambda _: _in_tool(0, "n1", 3000, False, NOW - 5.0))
    return st_


class TestConditionalRead:
    async def test_room_to_spare_lists_no_interrupts(self) -> None:
        """With room for the pool the snapshot lists no interrupt candidates and their probe
        marks are not written (they are valued only on shortfall ticks)."""
        store = await _world(100_000)
        snap = await _valuator(store, FakeBus()).run_tick()
        assert [c.id for c in snap.candidates] == ["p00"] and snap.interrupts == ()
        assert "a00" not in snap.probe_marks

    async def test_shortfall_lists_interrupts_and_marks(self) -> None:
        """With a shortfall the admitted-in-tool session is listed and its probe mark (its
        5 s default prediction has passed) is persisted."""
        store = await _world(7_000)
        snap = await _valuator(store, FakeBus()).run_tick()
        assert [ic.id for ic in snap.interrupts] == ["a00"]
        a = await store.get_session("a00")
        assert a is not None and a.probe_mark == snap.probe_marks["a00"] is not None

    async def test_thunderagent_always_lists_them(self) -> None:
        """Under thunderagent the acting sessions are listed even with room to spare."""
        store = await _world(100_000)
        snap = await _valuator(store, FakeBus(), thunder=True).run_tick()
        assert [ic.id for ic in snap.interrupts] == ["a00"]

    async def test_context_pressure_from_every_admitted_session(self) -> None:
        """Under ``payback_context`` the snapshot carries each node's context pressure from
        all its admitted sessions (a running one too, which no index lists), lists the tool
        sessions there, and the wire form carries it to the planner, which releases one."""
        store = await _world(100_000)
        running = Session("r00", version=2, activity="running", node="n1", weight=5_000,
                          tokens=4_600, request_id="q")  # fmt: skip
        await store.update_session("r00", lambda _: running)
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=7_000))
        bus = FakeBus()
        rules = DEFAULT_RULES
        snap = await _valuator(store, bus, rules=rules).run_tick()
        assert snap.pressure == {"n1": 2_488 + 100 + 4_600 + 100 - 7_000}
        assert [ic.id for ic in snap.interrupts] == ["a00"]
        (msg,) = snapshots(bus)
        core = from_wire(msg)
        assert core.pressure == snap.pressure
        d = decide(core, get_policy("tao"))
        assert [m.session for m in d.interrupts] == ["a00"]
        assert d.released_by == (("payback", 1),)
        plain = await _valuator(store, FakeBus()).run_tick()
        assert plain.pressure == {}

    async def test_every_tick_sees_the_pressure_as_it_is(self) -> None:
        """The pressure comes from the nodes' context totals, read with the nodes on every
        tick: a wake-up tick (the tool end -> placement path) sees a context that grew or a
        capacity that shrank at once, with no read of the admitted sessions (it used to reuse
        a pressure up to a second old, and contexts over a node's capacity went unpaid for
        that long in a burst of wake-ups)."""
        store = await _world(100_000)
        await store.update_session("r00", lambda _: Session("r00", version=2,
                                   activity="running", node="n1", weight=5_000, tokens=4_600,
                                   request_id="q"))  # fmt: skip
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=7_000))
        v = Valuator(store=store, bus=FakeBus(), log=get_logger("test"), params=PARAMS,
                     idle_timeout_s=300.0, clock=lambda: NOW, rules=DEFAULT_RULES)  # fmt: skip
        assert (await v.run_tick("period")).pressure == {"n1": 288}
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000))  # room now
        assert (await v.run_tick("wake", set())).pressure == {}
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=7_000))
        assert (await v.run_tick("wake", set())).pressure == {"n1": 288}
        await store.update_session(
            "r00", lambda s: None if s is None else msgspec.structs.replace(
                s, version=s.version + 1, tokens=s.tokens + 1_000)
        )  # fmt: skip
        assert (await v.run_tick("wake", set())).pressure == {"n1": 1_288}
        assert v.reader is not None and "admitted" not in v.reader._held  # never read


class TestSweepTask:
    async def test_sweep_loop_ends_idle_sessions_concurrently(self) -> None:
        """The sweep task ends every idle admitted session in batches and publishes one
        SessionEnd each; a busy one (in a tool, touched a second ago) is kept."""
        store = FakeStore()
        for i in range(300):
            s = Session(f"i{i:03d}", version=1, node="n1", weight=10, gateway_id="g",
                        updated_at=NOW - 400.0)  # fmt: skip
            await store.update_session(s.id, lambda _, s=s: s)
        busy = msgspec.structs.replace(
            _in_tool(1, "n1", 600, False), updated_at=NOW - 1.0
        )  # its tool started 1 s ago
        await store.update_session("a01", lambda _: busy)
        bus = _CountingBus(300)
        v = _valuator(store, bus)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sweep_loop, v, 0.0)
                await bus.reached.wait()
                tg.cancel_scope.cancel()
        ends = [decode(d, SessionEnd) for _, d, _ in bus.published]
        assert sorted(e.session_id for e in ends[:300]) == [f"i{i:03d}" for i in range(300)]
        assert {(e.reason, e.gateway_id) for e in ends} == {("idle_timeout", "g")}
        busy = await store.get_session("a01")
        assert busy is not None and not busy.ended
        ended = await store.get_session("i042")
        assert ended is not None and ended.ended and ended.node is None


class _CountingBus(FakeBus):
    """A FakeBus that sets ``reached`` once ``target`` messages were published."""

    def __init__(self, target: int) -> None:
        super().__init__()
        self.target = target
        self.reached = anyio.Event()

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        await super().publish(subject, data, headers)
        if len(self.published) >= self.target:
            self.reached.set()
