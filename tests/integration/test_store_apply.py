"""The atomic verify-and-apply step (DESIGN 3.4), against FakeStore and the Redis Lua script."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shared.core.problem import ZERO, PlanResult
from shared.core.session import Activity, Session, admit, on_request, on_response
from shared.core.signature import eligibility_digest
from shared.core.tick import Applied, Decision, Move, apply_decision, live_digest, live_free
from shared.core.valuation import NodeView
from shared.infra.store_types import NodeUpdate, StateStore
from tests.integration.stores import open_store, url_for

_RESULT = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")


def _decision(interrupts: tuple[Move, ...] = (), admits: tuple[Move, ...] = ()) -> Decision:
    return Decision(tick=1, interrupts=interrupts, admits=admits, result=_RESULT)


async def _pool(
    store: StateStore, sid: str, tokens: int = 500, model: str | None = None
) -> Session:
    s = on_request(Session(id=sid), "r", 1.0, tokens_estimate=tokens, model=model)[0]
    out = await store.update_session(sid, lambda _: s)
    assert out is not None
    return out


async def _in_tool_on(store: StateStore, sid: str, node: str, weight: int) -> Session:
    s = on_request(Session(id=sid), "r", 1.0)[0]
    s = on_response(admit(s, node, weight, 1.5), 2.0, total_tokens=100, tool_calls=[("c", "t")])
    out = await store.update_session(sid, lambda _: s)
    assert out is not None
    return out


async def _check_consistent(store: StateStore) -> None:
    """reserved = Σ admitted weights per node, contexts / held = Σ tokens / how many of the
    admitted sessions not ended, and the index sets agree with the records."""
    sessions = await store.sessions()
    want: dict[str, int] = {}
    held: dict[str, tuple[int, int]] = {}
    for s in sessions:
        if s.node is not None:
            want[s.node] = want.get(s.node, 0) + s.weight
            if not s.ended:
                tokens, n = held.get(s.node, (0, 0))
                held[s.node] = (tokens + s.tokens, n + 1)
    for node in set(want) | {n.id for n in await store.nodes()}:
        rec = await store.get_node(node)
        assert (0 if rec is None else rec.reserved) == want.get(node, 0), node
        got = (0, 0) if rec is None else (rec.contexts, rec.held)
        assert got == held.get(node, (0, 0)), node
    assert await store.pool_ids() == {s.id for s in sessions if s.pooled}
    in_tool = {s.id for s in sessions if s.node is not None and s.activity == "tool"}
    assert await store.admitted_tool_ids() == in_tool


class TestApply:
    async def test_admits_and_counts(self, store: StateStore) -> None:
        """Admits reserve capacity, bump versions, start waiting requests and leave the pool."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=4000, target_utilisation=0.5,
                                    healthy=True))  # fmt: skip
        a, b = await _pool(store, "a"), await _pool(store, "b")
        moves = (Move("a", "n1", 1000, a.version), Move("b", "n1", 1000, b.version))
        got = await store.apply(_decision(admits=moves), 10.0)
        assert not got.discarded and not got.truncated and got.admitted == moves
        assert got.sessions["a"] == admit(a, "n1", 1000, 10.0)
        assert await store.sessions(["a", "b"]) == [got.sessions["a"], got.sessions["b"]]
        assert got.sessions["a"].activity == "running" and got.sessions["a"].version == 2
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 2000 and node.free == 0
        assert await store.pool_ids() == set()
        stats = await store.planner_stats()
        assert stats["plans_applied"] == 1 and stats["sessions_admitted"] == 2

    async def test_discards_when_a_session_changed(self, store: StateStore) -> None:
        """A selected session whose version moved meanwhile discards the whole plan."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=True))
        a, b = await _pool(store, "a"), await _pool(store, "b")
        await store.update_session(
            "b", lambda s: None if s is None else on_request(s, "r2", 3.0)[0]
        )
        moves = (Move("a", "n1", 600, a.version), Move("b", "n1", 600, b.version),
                 Move("gone", "n1", 600, 1))  # fmt: skip
        got = await store.apply(_decision(admits=moves), 10.0)
        assert got == Applied(discarded=True, changed=("b", "gone"))
        assert await store.get_session("a") == a
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 0
        assert (await store.planner_stats())["plans_discarded"] == 1

    async def test_discards_on_unhealthy_or_missing_node(self, store: StateStore) -> None:
        """An admit to a node that is unhealthy or unknown discards the plan."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=False))
        a, b = await _pool(store, "a"), await _pool(store, "b")
        moves = (Move("a", "n1", 600, a.version), Move("b", "n2", 600, b.version))
        got = await store.apply(_decision(admits=moves), 10.0)
        assert got == Applied(discarded=True, changed=("a", "b"))

    async def test_prefix_when_capacity_shrank(self, store: StateStore) -> None:
        """When live capacity shrank, the longest fitting prefix is applied and flagged."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=True))
        ss = [await _pool(store, sid) for sid in ("a", "b", "c")]
        moves = tuple(Move(s.id, "n1", 1000, s.version) for s in ss)
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=2500))
        got = await store.apply(_decision(admits=moves), 10.0)
        assert got.truncated and got.admitted == moves[:2] and set(got.sessions) == {"a", "b"}
        c = await store.get_session("c")
        assert c is not None and c.node is None and await store.pool_ids() == {"c"}
        assert (await store.planner_stats())["plans_truncated"] == 1
        await _check_consistent(store)

    async def test_interrupts_free_room_for_admits(self, store: StateStore) -> None:
        """An interrupt's weight is usable by a later admit in the same apply."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=2000, healthy=True))
        t = await _in_tool_on(store, "t", "n1", 1500)
        p = await _pool(store, "p")
        got = await store.apply(
            _decision((Move("t", "n1", 1500, t.version),), (Move("p", "n1", 1800, p.version),)),
            10.0,
        )
        assert not got.truncated and len(got.admitted) == 1
        released = await store.get_session("t")
        assert released is not None and released.node is None and released.version == t.version + 1
        assert await store.pool_ids() == {"t"} and await store.admitted_tool_ids() == set()
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 1800
        await _check_consistent(store)

    async def test_concurrent_applies_never_overcommit(self, store: StateStore) -> None:
        """Many applies racing for one node admit exactly what fits, never more."""
        await store.put_node_status(
            "n1", NodeUpdate(capacity_tokens=10_000, target_utilisation=0.55, healthy=True)
        )
        ss = [await _pool(store, f"s{i}") for i in range(24)]
        results = await asyncio.gather(
            *(store.apply(_decision(admits=(Move(s.id, "n1", 1000, s.version),)), 5.0) for s in ss)
        )
        assert sum(len(r.admitted) for r in results) == 5
        assert sum(r.truncated for r in results) == 19
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 5000
        await _check_consistent(store)

    async def test_empty_decision(self, store: StateStore) -> None:
        """A decision without moves changes and counts nothing."""
        assert await store.apply(_decision(), 1.0) == Applied(discarded=False)
        assert (await store.planner_stats())["plans_applied"] == 0


# (what changes in flight, the node status written after planning, discarded)
_ELIGIBILITY: list[tuple[str, str, NodeUpdate, bool]] = [
    ("nothing", "n2", NodeUpdate(used_tokens=100), False),
    ("another eligible node went unhealthy", "n2", NodeUpdate(healthy=False), True),
    ("another eligible node stopped serving the model", "n2", NodeUpdate(models=["x"]), True),
    ("an eligible node's usable capacity fell below the weight", "n2",
     NodeUpdate(capacity_tokens=1000), True),
    ("an ineligible node came back healthy", "n4", NodeUpdate(healthy=True), True),
    ("an ineligible node started serving the model", "n3", NodeUpdate(models=None), True),
    ("a node of another model changed its models", "n3", NodeUpdate(models=["y", "z"]), False),
    ("a node serving the model joined", "n5",
     NodeUpdate(capacity_tokens=4000, healthy=True, models=["m"]), True),
    ("a node of another model joined", "n5",
     NodeUpdate(capacity_tokens=4000, healthy=True, models=["x"]), False),
]  # fmt: skip


class TestApplyChecksEligibility:
    """An admit carries its candidate's eligibility digest; the apply step recomputes the
    session's eligible set from the live nodes and discards the whole plan when it moved."""

    async def _setup(self, store: StateStore) -> tuple[Session, Session]:
        for node, healthy, models in (
            ("n1", True, ["m"]),
            ("n2", True, ["m", "x"]),
            ("n3", True, ["x"]),
            ("n4", False, ["m"]),
        ):
            await store.put_node_status(
                node, NodeUpdate(capacity_tokens=4000, healthy=healthy, models=models)
            )
        return await _pool(store, "a", model="m"), await _pool(store, "b", model="m")

    @pytest.mark.parametrize(
        ("what", "node", "update", "discarded"), _ELIGIBILITY, ids=[c[0] for c in _ELIGIBILITY]
    )
    async def test_table(
        self, store: StateStore, what: str, node: str, update: NodeUpdate, discarded: bool
    ) -> None:
        """Two admits planned on n1 / n2, each with the digest of {n1, n2}; a node's status
        changes before the apply: discarded (counted, nothing written) exactly when the
        sessions' eligible set moved, else applied."""
        a, b = await self._setup(store)
        planned = live_digest(await store.node_views(), "m", 1500)
        assert planned == eligibility_digest(["n1", "n2"])
        moves = (
            Move("a", "n1", 1500, a.version, planned),
            Move("b", "n2", 1500, b.version, planned),
        )
        await store.put_node_status(node, update)
        got = await store.apply(_decision(admits=moves), 10.0)
        stats = await store.planner_stats()
        if discarded:
            assert got.discarded and not got.fenced and sorted(got.changed) == ["a", "b"]
            assert await store.sessions(["a", "b"]) == [a, b]
            assert (stats["plans_discarded"], stats.get("plans_applied", 0)) == (1, 0)
        else:
            assert not got.discarded and got.admitted == moves
            assert (stats.get("plans_discarded", 0), stats["plans_applied"]) == (0, 1)
        await _check_consistent(store)

    async def test_only_the_changed_session_is_named(self, store: StateStore) -> None:
        """Sessions of another model keep their set: only the session whose set moved is
        named, and the plan is discarded whole; an admit without a digest is not checked."""
        await self._setup(store)
        a, b2 = await store.get_session("a"), await _pool(store, "c", model="x")
        assert a is not None
        views = await store.node_views()
        moves = (
            Move("a", "n1", 1500, a.version, live_digest(views, "m", 1500)),
            Move("c", "n3", 1500, b2.version, live_digest(views, "x", 1500)),
        )
        await store.put_node_status("n1", NodeUpdate(models=["m", "x"]))  # x's set grew
        got = await store.apply(_decision(admits=moves), 10.0)
        assert got == Applied(discarded=True, changed=("c",))
        unchecked = (moves[0], Move("c", "n3", 1500, b2.version))
        got = await store.apply(_decision(admits=unchecked), 10.0)
        assert not got.discarded and got.admitted == unchecked
        await _check_consistent(store)

    async def test_many_nodes_and_odd_ids(self, store: StateStore) -> None:
        """The script's digest is the core's for sets spanning several hash blocks and ids
        whose byte order differs from a locale's (case, '-', '_')."""
        ids = [f"{p}{i}" for i in range(12) for p in ("N-", "n_", "a", "B", "z-" * 40)]
        for nid in ids:
            await store.put_node_status(nid, NodeUpdate(capacity_tokens=4000, healthy=True))
        a = await _pool(store, "a")
        views = await store.node_views()
        assert len(live_digest(views, None, 1500)) == 16
        bad = Move("a", ids[0], 1500, a.version, eligibility_digest(ids[1:]))
        got = await store.apply(_decision(admits=(bad,)), 10.0)
        assert got == Applied(discarded=True, changed=("a",))
        good = replace(bad, digest=live_digest(views, None, 1500))
        got = await store.apply(_decision(admits=(good,)), 10.0)
        assert not got.discarded and got.admitted == (good,)


_ACTIVITIES: tuple[Activity, ...] = ("idle", "waiting", "running", "tool")
_NODES = ("n0", "n1", "n2", "nx")
_MODELS: tuple[frozenset[str] | None, ...] = (
    None,
    None,
    frozenset({"m1"}),
    frozenset({"m1", "m2"}),
    frozenset({"m2"}),
    frozenset(),  # serves no model: only a session of no model goes there
)


@st.composite
def _world(draw: st.DrawFn) -> tuple[list[dict[str, object]], list[Session], Decision, float]:
    views = [
        NodeView(
            id=f"n{i}",
            capacity_tokens=draw(st.integers(0, 6000)),
            target_utilisation=draw(st.sampled_from([1.0, 0.9, 0.7, 0.29])),
            healthy=draw(st.sampled_from([True, True, True, True, False])),
            models=draw(st.sampled_from(_MODELS)),
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    nodes: list[dict[str, object]] = [
        {
            "node": v.id,
            "capacity_tokens": v.capacity_tokens,
            "target_utilisation": v.target_utilisation,
            "healthy": v.healthy,
            "models": v.models,
        }
        for v in views
    ]
    sessions: list[Session] = []
    for i in range(draw(st.integers(1, 6))):
        node = draw(st.sampled_from([None, None, *_NODES]))
        sessions.append(
            Session(
                id=f"s{i}",
                version=draw(st.integers(1, 4)),
                activity=draw(st.sampled_from(_ACTIVITIES)),
                node=node,
                weight=0 if node is None else draw(st.integers(1, 2500)),
                tokens=draw(st.integers(0, 3000)),
                ended=draw(st.sampled_from([False, False, False, True])),
                model=draw(st.sampled_from([None, "m1", "m2"])),
                updated_at=0.5,
            )
        )
    stale = st.sampled_from([0] * 15 + [1])
    interrupts = tuple(
        Move(s.id, s.node, s.weight, s.version + draw(stale))
        for s in sessions
        if s.node is not None and draw(st.booleans())
    )
    ids = [s.id for s in sessions] * 4 + ["ghost"]
    targets = [v.id for v in views] * 4 + ["nx"]
    admits = []
    for _ in range(draw(st.integers(0, 4))):
        sid = draw(st.sampled_from(ids))
        version = next((s.version for s in sessions if s.id == sid), 1) + draw(stale)
        weight = draw(st.integers(1, 3000))
        # no digest, the live set's, or one of a subset of the nodes
        subset = draw(st.sets(st.sampled_from(_NODES)))
        model = next((s.model for s in sessions if s.id == sid), None)
        live = live_digest(views, model, weight)
        digest = draw(st.sampled_from(["", live, live, eligibility_digest(subset)]))
        admits.append(Move(sid, str(draw(st.sampled_from(targets))), weight, version, digest))
    at = draw(st.floats(1.0, 1e6, allow_nan=False))
    return nodes, sessions, _decision(interrupts, tuple(admits)), at


async def _equivalence(store: StateStore, world: tuple[list[dict[str, object]], list[Session],
                                                       Decision, float]) -> None:  # fmt: skip
    nodes, sessions, decision, at = world
    for n in nodes:
        fields = dict(n)
        node = str(fields.pop("node"))
        await store.put_node_status(node, NodeUpdate(**fields))  # type: ignore[arg-type]
    for s in sessions:
        await store.update_session(s.id, lambda _, s=s: s)  # type: ignore[misc]
    live = {s.id: s for s in sessions}
    views = await store.node_views()
    want = apply_decision(decision, live, live_free(views), at, nodes=views)
    got = await store.apply(decision, at)
    checked = any(m.digest for m in decision.admits)
    event(f"discarded={want.discarded} truncated={want.truncated} admitted={bool(want.admitted)}")
    event(f"digest checked={checked} discarded={want.discarded}")
    assert got == want
    after = {s.id: want.sessions.get(s.id, s) for s in sessions}
    assert await store.sessions() == [after[k] for k in sorted(after)]
    await _check_consistent(store)


class TestApplyMatchesReference:
    @pytest.mark.parametrize("kind", ["fake", "redis", "redis-cluster"])
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(world=_world())
    def test_random_decisions(
        self,
        kind: str,
        request: pytest.FixtureRequest,
        world: tuple[list[dict[str, object]], list[Session], Decision, float],
    ) -> None:
        """apply() returns and writes exactly what shared.core.tick.apply_decision does."""

        url = url_for(request, kind)

        async def run() -> None:
            store, close = await open_store(kind, url)
            try:
                await _equivalence(store, world)
            finally:
                await close()

        asyncio.run(run())


class TestFence:
    async def test_a_plan_below_the_fenced_epoch_changes_nothing(self, store: StateStore) -> None:
        """After a new leader fenced the domain at its epoch, a deposed leader's plan (an older
        epoch) is refused whole and counted; the new leader's applies; epoch 0 is unfenced."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=4000, target_utilisation=1.0,
                                    healthy=True))  # fmt: skip
        a, b = await _pool(store, "a"), await _pool(store, "b")
        assert await store.fence(7)
        assert not await store.fence(5)  # a lower epoch never lowers the fence
        late = _decision(admits=(Move("a", "n1", 1000, a.version),))
        out = await store.apply(late, 3.0, epoch=5)
        assert out.discarded and out.fenced and out.admitted == ()
        rec = await store.get_session("a")
        assert rec is not None and rec.node is None and rec.version == a.version
        node = await store.get_node("n1")
        assert node is not None and node.reserved == 0
        stats = await store.planner_stats()
        assert (stats["plans_fenced"], stats["epoch"]) == (1, 7)
        ok = await store.apply(_decision(admits=(Move("b", "n1", 1000, b.version),)), 3.0, epoch=8)
        assert not ok.discarded and not ok.fenced and len(ok.admitted) == 1
        assert (await store.planner_stats())["epoch"] == 8  # a newer epoch raises the fence
        stale = await store.apply(late, 3.5, epoch=7)
        assert stale.fenced
        await _check_consistent(store)
