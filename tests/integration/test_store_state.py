"""The state store's records, run against FakeStore and the real Redis Store alike."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import pytest

from shared.contracts.node import NodeStatus
from shared.core.predictor import History, ToolStats, censor, record, update
from shared.core.problem import ZERO, PlanResult
from shared.core.session import (
    Session,
    admit,
    on_end,
    on_request,
    on_response,
    on_tool_end,
    on_tool_start,
    release,
)
from shared.core.tick import Decision, Move
from shared.infra.fake_store import FakeStore
from shared.infra.keys import KeyNameError
from shared.infra.store import Store
from shared.infra.store_types import CHAIN_TTL_S, NodeUpdate, StateStore, StoreError

_RESULT = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")


def _waiting(sid: str, tokens: int = 1000, at: float = 1.0) -> Session:
    return on_request(Session(id=sid), "r1", at, tokens_estimate=tokens)[0]


async def _create(store: StateStore, s: Session) -> Session:
    out = await store.update_session(s.id, lambda _: s)
    assert out is not None
    return out


async def _admit(store: StateStore, sid: str, node: str, weight: int, at: float = 2.0) -> None:
    await store.update_session(sid, lambda s: None if s is None else admit(s, node, weight, at))


async def _reserved_matches(store: StateStore) -> None:
    """Every node's reserved total equals the sum of weights admitted there."""
    want: dict[str, int] = {}
    for s in await store.sessions():
        if s.node is not None:
            want[s.node] = want.get(s.node, 0) + s.weight
    for node in set(want) | {n.id for n in await store.nodes()}:
        rec = await store.get_node(node)
        got = 0 if rec is None else rec.reserved
        assert got == want.get(node, 0), node


class TestSessions:
    async def test_round_trip_exact(self, store: StateStore) -> None:
        """Every Session field, floats included, reads back exactly as written."""
        s = _waiting("odd id: {x} ü/~", at=0.1 + 0.2)
        s = on_response(s, 1 / 3, total_tokens=1234, tool_calls=[("c1", "bash")])
        s = on_tool_start(s, "c1", "bash", 2 / 3, source="hook", deadline=1e9 + 0.123456789)
        await _create(store, s)
        assert await store.get_session(s.id) == s
        assert await store.sessions([s.id, "missing"]) == [s]

    async def test_absent(self, store: StateStore) -> None:
        """An unknown id reads as None and update with a no-op fn writes nothing."""
        assert await store.get_session("nope") is None
        assert await store.update_session("nope", lambda s: s) is None
        assert await store.session_ids() == set()

    async def test_version_increments_on_every_change(self, store: StateStore) -> None:
        """Each transition written through update_session bumps the version by one."""
        await _create(store, _waiting("a"))
        seen = [1]
        steps = [
            lambda s: admit(s, "n1", 600, 3.0),
            lambda s: on_response(s, 4.0, total_tokens=900, tool_calls=[("c", "grep")]),
            lambda s: on_tool_end(s, "c", 5.0, source="gateway")[0],
            lambda s: release(s, 6.0),
            lambda s: on_end(s, 7.0),
        ]
        for step in steps:
            out = await store.update_session("a", step)
            assert out is not None
            seen.append(out.version)
        assert seen == [1, 2, 3, 4, 5, 6]
        stored = await store.get_session("a")
        assert stored is not None and stored.version == 6

    async def test_concurrent_updates_lose_nothing(self, store: StateStore) -> None:
        """Fifty concurrent read-modify-write increments all land."""
        await _create(store, _waiting("c", tokens=0))

        def bump(s: Session | None) -> Session | None:
            assert s is not None
            return on_response(s, 1.0, total_tokens=s.tokens + 1)

        await asyncio.gather(*(store.update_session("c", bump) for _ in range(50)))
        s = await store.get_session("c")
        assert s is not None and s.tokens == 50 and s.version == 51

    async def test_indexes_follow_state(self, store: StateStore) -> None:
        """pool and admitted_tool always agree with the records."""
        await _create(store, _waiting("p"))
        await _create(store, _waiting("q"))
        assert await store.pool_ids() == {"p", "q"}
        await _admit(store, "q", "n1", 700)
        await store.update_session(
            "q",
            lambda s: (
                None if s is None else on_response(s, 3.0, total_tokens=10, tool_calls=[("c", "t")])
            ),
        )
        assert await store.pool_ids() == {"p"}
        assert await store.admitted_tool_ids() == {"q"}
        await store.update_session("q", lambda s: None if s is None else release(s, 4.0))
        assert await store.pool_ids() == {"p", "q"}
        assert await store.admitted_tool_ids() == set()
        await store.update_session("p", lambda s: None if s is None else on_end(s, 5.0))
        assert await store.pool_ids() == {"q"}
        assert await store.session_ids() == {"p", "q"}

    async def test_reserved_follows_admissions(self, store: StateStore) -> None:
        """Moving, releasing and deleting admitted sessions keeps reserved = Σ weights."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=True))
        await store.put_node_status("n2", NodeUpdate(capacity_tokens=10_000, healthy=True))
        for sid in ("a", "b", "c"):
            await _create(store, _waiting(sid))
        await _admit(store, "a", "n1", 600)
        await _admit(store, "b", "n1", 700)
        await _admit(store, "c", "n2", 800)
        await _admit(store, "a", "n2", 900)  # moved
        await store.update_session("b", lambda s: None if s is None else on_end(s, 3.0))
        await _reserved_matches(store)
        assert await store.delete_session("c")
        assert not await store.delete_session("c")
        await _reserved_matches(store)
        n2 = await store.get_node("n2")
        assert n2 is not None and n2.reserved == 900

    async def test_update_with_returns_the_winning_value(self, store: StateStore) -> None:
        """update_session_with returns the transition's value, here on_tool_end's duration."""
        s = on_response(_waiting("t", at=1.0), 2.0, total_tokens=10, tool_calls=[("c", "bash")])
        await _create(store, s)
        stored, duration = await store.update_session_with(
            "t", lambda x: on_tool_end(x, "c", 5.5, source="gateway") if x else (None, None)
        )
        assert duration == 3.5
        assert stored is not None and stored.tool is not None and stored.tool.completed_at == 5.5
        assert await store.get_session("t") == stored

    async def test_fn_must_keep_id(self, store: StateStore) -> None:
        """A transition that changes the id is refused with a StoreError."""
        with pytest.raises(StoreError):
            await store.update_session("x", lambda _: Session(id="y", version=1))

    async def test_probe_marks_keep_version(self, store: StateStore) -> None:
        """Probe marks are written without a version bump, and only on the expected version."""
        await _create(store, _waiting("a"))
        await _create(store, _waiting("b"))
        n = await store.put_probe_marks({"a": 12.5, "b": 13.0, "gone": 1.0}, {"a": 1, "b": 0})
        assert n == 1
        a, b = await store.sessions(["a", "b"])
        assert (a.probe_mark, a.version) == (12.5, 1)
        assert b.probe_mark is None
        assert await store.put_probe_marks({"a": None}) == 1
        a2 = await store.get_session("a")
        assert a2 is not None and a2.probe_mark is None and a2.version == 1

    async def test_bad_ids(self, store: StateStore) -> None:
        """Empty session ids and malformed node ids are refused with KeyNameError."""
        with pytest.raises(KeyNameError):
            await store.get_session("")
        with pytest.raises(KeyNameError):
            await store.put_node_status("bad node!", NodeUpdate(healthy=True))


class TestNodes:
    async def test_status_keeps_reserved_and_other_fields(self, store: StateStore) -> None:
        """A partial status write changes only its fields and never the reserved total."""
        await store.put_node_status(
            "n1", NodeUpdate(url="http://a:8000", capacity_tokens=1000, target_utilisation=0.29,
            healthy=True, models={"m1", "m2"}, updated_at=0.1 + 0.2),
        )  # fmt: skip
        await _create(store, _waiting("s"))
        await _admit(store, "s", "n1", 150)
        rec = await store.put_node_status("n1", NodeUpdate(healthy=False, usage=0.5, failures=2))
        assert rec.reserved == 150
        got = await store.get_node("n1")
        assert got == rec
        assert got.url == "http://a:8000" and got.models == frozenset({"m1", "m2"})
        assert got.usable == 290 and got.free == 0 and got.updated_at == 0.1 + 0.2
        assert [v.id for v in await store.node_views()] == ["n1"]

    async def test_from_message(self, store: StateStore) -> None:
        """A NodeStatus message maps onto the record; no models means any model."""
        msg = NodeStatus(node_id="n9", ts=5.5, capacity_tokens=4096, healthy=True, running=3)
        rec = await store.put_node_status_msg(msg, target_utilisation=0.9)
        assert rec.models is None and rec.usable == math.floor(4096 * 0.9)
        assert (await store.nodes())[0] == rec
        assert await store.delete_node("n9")
        assert await store.nodes() == []

    async def test_context_totals_follow_every_write(self, store: StateStore) -> None:
        """``contexts`` / ``held`` = Σ tokens / how many of the sessions admitted on the node
        and not ended, after an admission by the apply script and by a transition, a response
        that grows the context, a release, an end and a delete; a status write keeps them."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
        await _create(store, _waiting("a", 1000))
        await _create(store, _waiting("b weird/id", 2000))
        a = await store.get_session("a")
        assert a is not None
        d = Decision(1, (), (Move("a", "n1", 1500, a.version),), _RESULT)
        assert (await store.apply(d, 2.0)).admitted
        await _admit(store, "b weird/id", "n1", 2500)

        async def totals() -> tuple[int, int]:
            rec = await store.get_node("n1")
            return (0, 0) if rec is None else (rec.contexts, rec.held)

        assert await totals() == (3000, 2)
        await store.update_session(
            "a", lambda s: None if s is None else on_response(s, 3.0, total_tokens=1800)
        )
        assert await totals() == (3800, 2)
        await store.put_node_status("n1", NodeUpdate(healthy=False))
        assert await totals() == (3800, 2)
        await store.update_session("a", lambda s: None if s is None else release(s, 4.0))
        assert await totals() == (2000, 1)
        await store.update_session("b weird/id", lambda s: None if s is None else on_end(s, 5.0))
        assert await totals() == (0, 0)
        await _create(store, _waiting("c", 700))
        await _admit(store, "c", "n1", 900)
        assert await totals() == (700, 1)
        assert await store.delete_session("c")
        assert await totals() == (0, 0)

    async def test_rebuild_contexts_recounts_from_the_records(self, store: StateStore) -> None:
        """Totals that were never kept (records from before them) or drifted are set right
        by the one atomic recount the valuation runs at start-up."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
        await store.put_node_status("n2", NodeUpdate(capacity_tokens=100_000, healthy=True))
        for sid, tokens in (("a", 1000), ("b weird/id", 2000), ("c", 400)):
            await _create(store, _waiting(sid, tokens))
        await _admit(store, "a", "n1", 1500)
        await _admit(store, "b weird/id", "n1", 2500)
        if isinstance(store, Store):  # the in-memory store counts from its records anyway
            await store._r.hset(store.keys.node("n1"), mapping={"contexts": 7, "held": 9})
            await store._r.hset(store.keys.node("n2"), mapping={"contexts": 5, "held": 1})
        assert await store.rebuild_contexts() == 2
        n1, n2 = await store.get_node("n1"), await store.get_node("n2")
        assert n1 is not None and (n1.contexts, n1.held) == (3000, 2)
        assert n2 is not None and (n2.contexts, n2.held) == (0, 0)

    async def test_bad_status_refused(self, store: StateStore) -> None:
        """Out-of-range values are refused with a message naming the field."""
        with pytest.raises(StoreError, match="target_utilisation"):
            await store.put_node_status("n1", NodeUpdate(target_utilisation=1.5))
        with pytest.raises(StoreError, match="capacity_tokens"):
            await store.put_node_status("n1", NodeUpdate(capacity_tokens=-1))


class TestResidency:
    async def test_round_trip_and_clear(self, store: StateStore) -> None:
        """Residency reads back exactly; k0 <= 0 deletes; clearing a node drops its pairs."""
        await store.put_residencies(
            [("a", "n1", 512, 1 / 3), ("a", "n2", 256, 2.0), ("b", "n1", 64, 3.0)]
        )
        got = await store.residency(["a", "b", "c"])
        assert got == {"a": {"n1": (512, 1 / 3), "n2": (256, 2.0)}, "b": {"n1": (64, 3.0)},
                       "c": {}}  # fmt: skip
        await store.put_residency("a", "n2", 0, 4.0)
        await store.clear_node_residency("n1")
        assert await store.residency(["a", "b"]) == {"a": {}, "b": {}}


async def _corrupt_chain(store: StateStore, sid: str) -> None:
    """Overwrite ``sid``'s stored chain with text that is not one."""
    if isinstance(store, FakeStore):
        store._chains[sid] = "16 1.0 not*base64"
    else:
        assert isinstance(store, Store)
        await store._r.set(store.keys.chain(sid), "16 1.0 not*base64")


class TestChains:
    async def test_round_trip_replace_and_drop(self, store: StateStore) -> None:
        """Chains read back exactly (full 64-bit keys); a new one replaces; drop forgets."""
        big = [0, 1, 2**63, 2**64 - 1, 12345678901234567890]
        await store.put_chains([("a", 16, big, 1 / 3), ("b", 32, [], 2.0)])
        assert (await store.chains()).chains == [("a", 16, big, 1 / 3), ("b", 32, [], 2.0)]
        await store.put_chains([("a", 16, [7, 8], 5.0)])
        await store.drop_chains(["b", "never-stored"])
        assert await store.chains() == ([("a", 16, [7, 8], 5.0)], [])

    async def test_deleting_the_session_deletes_its_chain(self, store: StateStore) -> None:
        await _create(store, _waiting("a"))
        await store.put_chains([("a", 16, [1, 2, 3], 1.0), ("b", 16, [4], 1.0)])
        assert await store.delete_session("a")
        assert [sid for sid, *_ in (await store.chains()).chains] == ["b"]

    async def test_a_corrupt_chain_is_named_and_dropped(self, store: StateStore) -> None:
        await store.put_chains([("a", 16, [1], 1.0), ("b", 16, [2], 1.0)])
        await _corrupt_chain(store, "a")
        assert await store.chains() == ([("b", 16, [2], 1.0)], ["a"])
        assert await store.chains() == ([("b", 16, [2], 1.0)], [])

    async def test_chains_expire_and_expired_ones_are_unlisted(self, store: StateStore) -> None:
        """Redis: each write sets a day's TTL; a chain that expired leaves the id set."""
        if not isinstance(store, Store):
            pytest.skip("the in-memory store keeps no TTL")
        await store.put_chains([("a", 16, [1], 1.0), ("b", 16, [2], 1.0)])
        ttl = await store._r.ttl(store.keys.chain("a"))
        assert CHAIN_TTL_S - 60 < ttl <= CHAIN_TTL_S
        await store._r.delete(store.keys.chain("a"))  # as the TTL would
        assert await store.chains() == ([("b", 16, [2], 1.0)], [])
        assert await store._r.zrange(store.keys.chains, 0, -1) in ([b"b"], ["b"])
        await store._r.zadd(store.keys.chains, {"gone": 1.0})  # expired long ago, key gone
        await store.put_chains([("c", 16, [3], 1.0)])  # a write trims expired ids
        assert await store._r.zrange(store.keys.chains, 0, -1) in ([b"b", b"c"], ["b", "c"])

    async def test_bad_chains_are_refused_and_nothing_is_written(self, store: StateStore) -> None:
        with pytest.raises(ValueError, match="unsigned 64-bit"):
            await store.put_chains([("a", 16, [1], 1.0), ("b", 16, [-1], 1.0)])
        with pytest.raises(ValueError, match="block_size"):
            await store.put_chains([("a", 0, [1], 1.0)])
        with pytest.raises(StoreError, match="stamp"):
            await store.put_chains([("a", 16, [1], math.nan)])
        with pytest.raises(KeyNameError):
            await store.put_chains([("", 16, [1], 1.0)])
        assert await store.chains() == ([], [])


class TestToolStats:
    async def test_matches_predictor(self, store: StateStore) -> None:
        """Recorded durations and cuts equal predictor.record / record_censored."""
        want = History()
        for tool, d in [("bash", 1.5), ("bash", 2.25), ("grep", 0.1), ("bash", 1 / 3)]:
            await store.record_tool(tool, d)
            want = record(want, tool, d)
        await store.record_tool("bash", 9.0, censored=True)
        want = History(
            tools={**want.tools, "bash": censor(want.of("bash"), 9.0)},
            overall=censor(want.overall, 9.0),
        )
        assert await store.history() == want

    async def test_concurrent_records_lose_nothing(self, store: StateStore) -> None:
        """Concurrent recorders of the same tool all land in the tool and global stats."""
        await asyncio.gather(*(store.record_tool("t", 1.0) for _ in range(30)))
        h = await store.history()
        assert h.of("t").count == 30 and h.overall.count == 30
        assert h.of("t") == update(ToolStats(count=29, mean=1.0, min_s=1.0, max_s=1.0), 1.0)

    async def test_bad_duration(self, store: StateStore) -> None:
        """A negative duration is refused before anything is written."""
        with pytest.raises(ValueError, match="duration"):
            await store.record_tool("t", -1.0)
        assert (await store.history()).overall.count == 0


class TestCountersAndStatus:
    async def test_planner_stats(self, store: StateStore) -> None:
        """Counters add up and solve percentiles use the nearest-rank rule."""
        await store.incr(ticks=3, fallbacks=0)
        await store.incr(ticks=1)
        for i in range(1, 101):
            await store.record_solve(float(i), "dp" if i % 10 else "bfd", i % 10 != 0)
        st = await store.planner_stats()
        assert st["ticks"] == 4 and st["solves"] == 100
        assert st["solves_exact"] == 90 and st["fallbacks"] == 10
        assert st["methods"] == {"bfd": 10, "dp": 90}
        assert st["solve_ms"] == {"n": 100, "p50": 50.0, "p90": 90.0, "p99": 99.0}
        assert st["plans_applied"] == 0

    async def test_record_solve_fallback_flag(self, store: StateStore) -> None:
        """``fallback`` overrides the default (not exact): a baseline's inexact solve is no
        fallback, a tao fallback is one, and None keeps the old rule."""
        await store.record_solve(1.0, "rr", False, fallback=False)
        await store.record_solve(2.0, "greedy", False, fallback=True)
        await store.record_solve(3.0, "dp", True, fallback=False)
        await store.record_solve(4.0, "bfd", False)
        st = await store.planner_stats()
        assert st["solves"] == 4 and st["solves_exact"] == 1 and st["fallbacks"] == 2
        assert st["methods"] == {"rr": 1, "greedy": 1, "dp": 1, "bfd": 1}

    async def test_status_shape(self, store: StateStore) -> None:
        """status() has the documented sections and per-item keys."""
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=2048, healthy=True))
        s = _waiting("a")
        s = on_response(s, 2.0, total_tokens=100, tool_calls=[("c", "bash")])
        await _create(store, s)
        st: dict[str, Any] = await store.status()
        assert set(st) == {"domain", "nodes", "sessions", "planner"}
        (node,) = st["nodes"]
        assert node["id"] == "n1" and node["free"] == 2048 and node["reserved"] == 0
        (sess,) = st["sessions"]
        assert sess["id"] == "a" and sess["activity"] == "tool" and sess["pooled"] is True
        assert sess["tool"]["tool"] == "bash" and sess["version"] == 2
        assert st["planner"]["solve_ms"]["p50"] is None
        json.dumps(st)  # the CLI prints it as JSON as it is
