"""Batch forms of the state store (update_sessions, update_sessions_with, record_tools),
against FakeStore and the real Redis Store: each equals the single forms applied in order."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.core.predictor import History, ToolStats, censor, update
from shared.core.session import (
    Session,
    admit,
    on_cancel,
    on_end,
    on_request,
    on_response,
    on_tool_end,
    on_tool_progress,
    on_tool_start,
    release,
)
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate, SessionFnWith, StateStore, StoreError
from tests.integration.stores import open_store, url_for

Step = SessionFnWith[object]
_NODES = ("n0", "n1", "n2")


def _waiting(sid: str, tokens: int = 1000, at: float = 1.0) -> Session:
    return on_request(Session(id=sid), "r1", at, tokens_estimate=tokens)[0]


def _create(s: Session) -> Callable[[Session | None], Session | None]:
    return lambda _: s


def _bump(s: Session | None) -> Session | None:
    """One more token; an admitted session's reservation follows (weight = tokens + 100)."""
    assert s is not None
    return on_response(s, 2.0, total_tokens=s.tokens + 1, reserve=100)


async def _reserved_by_node(store: StateStore) -> dict[str, tuple[int, int, int] | None]:
    """Every node's stored reserved and context totals (None: no node hash)."""
    out: dict[str, tuple[int, int, int] | None] = {}
    for node in _NODES:
        rec = await store.get_node(node)
        out[node] = None if rec is None else (rec.reserved, rec.contexts, rec.held)
    return out


async def _check_reserved(store: StateStore) -> None:
    """reserved = Σ admitted weights on every node; contexts = Σ tokens and held = how many
    of the sessions admitted there and not ended."""
    want = {n: [0, 0, 0] for n in _NODES}
    for s in await store.sessions():
        if s.node is not None:
            want[s.node][0] += s.weight
            if not s.ended:
                want[s.node][1] += s.tokens
                want[s.node][2] += 1
    got = await _reserved_by_node(store)
    assert {n: v or (0, 0, 0) for n, v in got.items()} == {n: tuple(v) for n, v in want.items()}


class TestUpdateSessions:
    async def test_empty_batch_is_a_no_op(self, store: StateStore) -> None:
        """Empty batches return nothing and write no key at all."""
        assert await store.update_sessions([]) == []
        assert await store.update_sessions_with([]) == []
        await store.record_tools([])
        assert await store.clear() == 0
        assert await store.history() == History()

    async def test_same_id_composes_in_order(self, store: StateStore) -> None:
        """Several fns on one id compose; each entry is the record after that fn (odd ids too)."""
        odd = 'b: {x} "ü"\\~\x00'
        await store.put_node_status("n0", NodeUpdate(capacity_tokens=10_000, healthy=True))
        out = await store.update_sessions(
            [
                ("a", _create(_waiting("a"))),
                (odd, _create(_waiting(odd, tokens=10))),
                ("a", lambda s: None if s is None else admit(s, "n0", 1500, 2.0)),
                ("a", _bump),
                (odd, lambda s: None),
            ]
        )
        assert [None if s is None else (s.id, s.version) for s in out] == [
            ("a", 1), (odd, 1), ("a", 2), ("a", 3), (odd, 1),
        ]  # fmt: skip
        a = await store.get_session("a")
        assert a == out[3] and a is not None and a.weight == a.tokens + 100
        assert await store.pool_ids() == {odd}
        n0 = await store.get_node("n0")
        assert n0 is not None and n0.reserved == a.weight

    async def test_with_returns_each_value(self, store: StateStore) -> None:
        """update_sessions_with returns each transition's value (on_tool_end's duration)."""
        s = on_response(_waiting("t", at=1.0), 2.0, total_tokens=10, tool_calls=[("c", "bash")])
        await store.update_session("t", _create(s))

        def late_end(x: Session) -> tuple[Session | None, float | None]:
            """A late end of an earlier call: its reported duration."""
            return on_tool_end(x, "c0", 6.0, source="hook", duration_s=4.0)

        steps: list[tuple[str, Step]] = [
            ("t", lambda x: on_tool_end(x, "c", 5.5, source="gateway") if x else (None, None)),
            ("t", lambda x: late_end(x) if x else (None, None)),
            ("u", lambda x: (x, "absent")),
        ]
        (first, d1), (second, d2), (absent, v3) = await store.update_sessions_with(steps)
        assert d1 == 3.5 and first is not None and first.version == s.version + 1
        assert d2 == 4.0 and second is not None and second.version == s.version + 2
        assert (absent, v3) == (None, "absent")
        assert await store.get_session("t") == second

    async def test_bad_result_refuses_the_whole_batch(self, store: StateStore) -> None:
        """A result under the wrong id raises StoreError and nothing of the batch is written."""
        with pytest.raises(StoreError):
            await store.update_sessions(
                [("a", _create(_waiting("a"))), ("b", lambda _: Session(id="zz", version=1))]
            )
        assert await store.session_ids() == set()
        assert await store.clear() == 0

    async def test_concurrent_batches_and_singles_lose_nothing(self, store: StateStore) -> None:
        """Concurrent batches and single updates on the same records all land, and the
        reserved totals follow every weight change."""
        await store.put_node_status("n0", NodeUpdate(capacity_tokens=10**6, healthy=True))
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10**6, healthy=True))
        await store.update_sessions([(sid, _create(_waiting(sid, tokens=0))) for sid in "abc"])
        await store.update_sessions(
            [
                ("a", lambda s: None if s is None else admit(s, "n0", 100, 1.5)),
                ("b", lambda s: None if s is None else admit(s, "n1", 100, 1.5)),
            ]
        )
        batch = [("a", _bump), ("b", _bump), ("a", _bump), ("c", _bump)]
        jobs: list[Awaitable[object]] = [store.update_sessions(batch) for _ in range(12)]
        jobs += [store.update_session("a", _bump) for _ in range(10)]
        jobs += [store.update_session("c", _bump) for _ in range(5)]
        jobs.append(store.put_probe_marks({"c": 7.0}))
        await asyncio.gather(*jobs)
        a, b, c = await store.sessions(["a", "b", "c"])
        assert (a.tokens, b.tokens, c.tokens) == (34, 12, 17)
        assert c.probe_mark == 7.0
        assert (a.version, b.version, c.version) == (36, 14, 18)
        assert (a.weight, b.weight, c.weight) == (134, 112, 0)
        await _check_reserved(store)

    async def test_each_batch_reads_the_record_as_it_is_now(self, store: StateStore) -> None:
        """A batch sees what other paths wrote since the last batch, including writes that
        keep the version (probe marks) and a record made again with every small field equal
        (deleted, then created at version 1 at the same time with other tokens): what a
        cache of decoded records keyed on the small fields would get wrong."""
        seen: list[Session | None] = []

        def look(s: Session | None) -> Session | None:
            seen.append(s)
            return None  # writes nothing

        async def batch_sees() -> Session | None:
            await store.update_sessions([("a", look)])
            return seen[-1]

        await store.update_sessions([("a", _create(_waiting("a")))])
        assert await batch_sees() == _waiting("a")
        await store.delete_session("a")
        assert await batch_sees() is None
        await store.update_session("a", _create(_waiting("a", tokens=7)))
        assert await batch_sees() == _waiting("a", tokens=7)
        await store.put_probe_marks({"a": 7.5})
        got = await batch_sees()
        assert got == await store.get_session("a") and got is not None and got.probe_mark == 7.5
        await store.update_session("a", _bump)
        assert await batch_sees() == await store.get_session("a")


class TestUpdateSessionsRecording:
    """update_sessions(record=...): the tool samples land in the batch's own transaction."""

    async def test_samples_land_with_the_write(self, store: StateStore) -> None:
        """The samples ``record`` gives after the fns land together with the records, and a
        batch that writes no record still records its samples."""
        s = on_response(_waiting("t", at=1.0), 2.0, total_tokens=10, tool_calls=[("c", "bash")])
        await store.update_session("t", _create(s))
        seen: list[float | None] = []

        def end(x: Session | None) -> Session | None:
            assert x is not None
            new, d = on_tool_end(x, "c", 5.5, source="gateway")
            seen[:] = [d]
            return new

        def record() -> list[tuple[str, float, bool]]:
            return [("bash", d, False) for d in seen if d is not None]

        out = await store.update_sessions([("t", end)], record=record)
        assert out[0] is not None and out[0].tool is not None and out[0].tool.completed_at == 5.5
        assert (await store.history()).of("bash") == update(ToolStats(), 3.5)
        await store.update_sessions([("gone", lambda _: None)], record=lambda: [("ls", 1.0, True)])
        h = await store.history()
        assert (h.of("ls").censored, h.overall.count, h.overall.censored) == (1, 1, 1)

    async def test_bad_sample_refuses_records_too(self, store: StateStore) -> None:
        """A bad sample refuses the whole batch: neither the records nor any sample land."""
        with pytest.raises(ValueError, match="duration"):
            await store.update_sessions(
                [("a", _create(_waiting("a")))],
                record=lambda: [("t", 1.0, False), ("t", -1.0, False)],
            )
        assert await store.session_ids() == set()
        assert await store.history() == History()

    async def test_concurrent_recording_batches_count_each_once(self, store: StateStore) -> None:
        """Concurrent batches on one record retry on each other's writes; each batch's
        samples land once, from the run whose write won."""
        await store.update_session("a", _create(_waiting("a", tokens=0)))
        calls = 0

        def record() -> list[tuple[str, float, bool]]:
            nonlocal calls
            calls += 1
            return [("t", 1.0, False)]

        await asyncio.gather(
            *(store.update_sessions([("a", _bump)], record=record) for _ in range(12))
        )
        a = await store.get_session("a")
        assert a is not None and a.tokens == 12
        assert (await store.history()).of("t").count == 12 and calls >= 12


class TestRealStoreScripts:
    async def test_lost_script_is_reloaded(self, redis_url: str) -> None:
        """A write script unknown to the server (restart, SCRIPT FLUSH) is loaded again and
        the batch lands."""
        real, close = await open_store("redis", redis_url)
        try:
            assert isinstance(real, Store)
            real._batch_write.sha = "0" * 40
            out = await real.update_sessions([("a", _create(_waiting("a")))])
            assert out == [_waiting("a")] and await real.get_session("a") == _waiting("a")
            assert real._batch_write.sha != "0" * 40
        finally:
            await close()

    async def test_lost_read_script_is_reloaded(self, redis_url: str) -> None:
        """So is the read script of a batch that records samples (read in a pipeline with the
        tool statistics, not through redis-py's script object)."""
        real, close = await open_store("redis", redis_url)
        try:
            assert isinstance(real, Store)
            await real.update_session("a", _create(_waiting("a")))
            real._batch_read.sha = "0" * 40
            out = await real.update_sessions([("a", _bump)], record=lambda: [("ls", 1.0, False)])
            assert out == [await real.get_session("a")] and out[0] is not None
            assert out[0].tokens == 1001 and (await real.history()).of("ls").count == 1
            assert real._batch_read.sha != "0" * 40
        finally:
            await close()

    @pytest.mark.parametrize("cached", [False, True], ids=["read", "cached"])
    @pytest.mark.parametrize("between", ["probe", "version", "statistics", "delete"])
    async def test_write_between_read_and_write_is_folded_again(
        self, redis_url: str, between: str, cached: bool
    ) -> None:
        """A write that lands after the batch's read (``read``), or after the write the batch
        took its cached record from (``cached``, the other write by another store) and before
        the batch's write script: a probe mark, which keeps the version; another transition;
        a sample of the same tool; the record deleted. The script writes nothing and sends
        back what the moved hash (and the statistics) hold now; the batch folds again on that,
        without reading, and lands on top of it, losing neither write."""
        real, close = await open_store("redis", redis_url)
        try:
            assert isinstance(real, Store)
            s = on_response(_waiting("t", at=1.0), 2.0, total_tokens=10, tool_calls=[("c", "ls")])
            if cached:
                real = Store(real._r, real.domain, cache_sessions=4)
                await real.update_sessions([("t", _create(s))], record=list)  # caches t, stats
                other = Store(real._r, real.domain)
            else:
                await real.update_session("t", _create(s))
                other = real
            reads = 0
            read = real._read_for_write

            async def other_write() -> None:
                match between:
                    case "probe":
                        await other.put_probe_marks({"t": 4.5})
                    case "version":
                        await other.update_session("t", _bump)
                    case "statistics":
                        await other.record_tool("ls", 2.0)
                    case "delete":
                        await other.delete_session("t")

            async def read_then_write(keys: list[str], stats: bool) -> object:
                nonlocal reads
                reads += 1
                got = await read(keys, stats)
                if reads == 1:  # the other writer, between this batch's read and its write
                    await other_write()
                return got

            real._read_for_write = read_then_write  # type: ignore[method-assign]
            if cached:
                await other_write()
            seen: list[Session | None] = []

            def end(x: Session | None) -> Session | None:
                seen.append(x)
                return None if x is None else on_tool_end(x, "c", 5.5, source="gateway")[0]

            def record() -> list[tuple[str, float, bool]]:
                return [("ls", 3.5, False)] if seen[-1] is not None else []

            out = await real.update_sessions([("t", end)], record=record)
            assert len(seen) == 2, "the check let a stale fold through, or refused a fresh one"
            assert reads == (0 if cached else 1), "the moved hash was read again"
            stored = await real.get_session("t")
            assert out == [stored]
            history = await real.history()
            if between == "delete":
                assert stored is None and history.of("ls").count == 0
                return
            assert stored is not None and stored.tool is not None
            assert stored.tool.completed_at == 5.5
            assert stored.probe_mark == (4.5 if between == "probe" else None)
            assert stored.tokens == (11 if between == "version" else 10)
            assert history.of("ls").count == (2 if between == "statistics" else 1)
        finally:
            await close()

    async def test_cache_skips_reads_and_is_bounded(self, redis_url: str) -> None:
        """A store with the session cache reads only the records it did not write last (and
        the statistics once), keeps at most ``cache_sessions`` records, evicting the least
        recently written, and returns what the plain store reads."""
        real, close = await open_store("redis", redis_url)
        try:
            assert isinstance(real, Store)
            cached = Store(real._r, real.domain, cache_sessions=4)
            read_keys: list[list[str]] = []
            read = cached._read_for_write

            async def counted(keys: list[str], stats: bool) -> object:
                read_keys.append([k.rsplit(":", 1)[-1] for k in keys] + ["stats"] * stats)
                return await read(keys, stats)

            cached._read_for_write = counted  # type: ignore[method-assign]
            ids = [f"s{i}" for i in range(6)]
            await real.update_sessions([(sid, _create(_waiting(sid))) for sid in ids])
            await cached.update_sessions([(sid, _bump) for sid in ids])
            assert read_keys == [ids]
            await cached.update_sessions([(sid, _bump) for sid in ids[2:]], record=list)
            assert read_keys[1:] == [["stats"]], "the last four written were read again"
            await cached.update_sessions([("s0", _bump), ("s5", _bump)], record=list)
            assert read_keys[2:] == [["s0"]], "s0 was evicted first, or the statistics re-read"
            want = await real.sessions(ids)
            assert [s.tokens for s in want] == [1002, 1001, 1002, 1002, 1002, 1003]
            assert await cached.update_sessions([(sid, lambda s: None) for sid in ids]) == want
        finally:
            await close()


# --- batch == singles, on random transition sequences -----------------------------------------


def _op(draw: st.DrawFn, sid: str, i: int) -> Step:
    """One random transition on ``sid`` (creating it when a request meets no record)."""
    at = float(10 + i)
    kind = draw(
        st.sampled_from(
            ["request", "response", "tool_start", "tool_end", "progress", "admit", "release",
             "cancel", "end", "nothing"]
        )
    )  # fmt: skip
    if kind == "request":
        tokens = draw(st.integers(0, 3000))
        return lambda s: on_request(s or Session(id=sid), f"r{i}", at, tokens_estimate=tokens)
    if kind == "admit":
        node, weight = draw(st.sampled_from(_NODES)), draw(st.integers(0, 4000))
        return lambda s: (None if s is None else admit(s, node, weight, at), None)
    if kind == "nothing":
        return lambda s: (None, "nothing")
    if kind in ("tool_start", "tool_end", "progress"):
        call = f"c{draw(st.integers(0, 1))}"
        if kind == "tool_start":
            src = draw(st.sampled_from(["gateway", "hook"]))
            return lambda s: (None if s is None else on_tool_start(s, call, "bash", at, source=src),
                              src)  # fmt: skip
        if kind == "tool_end":
            return lambda s: (None, None) if s is None else on_tool_end(s, call, at, source="hook")
        frac = draw(st.floats(0.0, 1.0))
        return lambda s: (None if s is None else on_tool_progress(s, call, at, fraction=frac), 0)
    if kind == "response":
        total = draw(st.integers(0, 5000))
        calls = draw(st.sampled_from([(), (("c0", "bash"),), (("c1", "grep"),)]))
        reserve = draw(st.sampled_from([None, 0, 512]))
        return lambda s: (
            None if s is None else on_response(s, at, total_tokens=total, tool_calls=calls,
                                               reserve=reserve),
            total,
        )  # fmt: skip
    unary = {"release": release, "cancel": on_cancel, "end": on_end}[kind]
    return lambda s: (None if s is None else unary(s, at), kind)


@st.composite
def _script(draw: st.DrawFn) -> tuple[list[Session], list[tuple[str, Step]], list[int]]:
    """Initial records, a sequence of transitions on 1-4 sessions, and batch boundaries."""
    sids = [f"s{i}" for i in range(draw(st.integers(1, 4)))]
    initial: list[Session] = []
    for sid in sids:
        if draw(st.booleans()):
            s = _waiting(sid, tokens=draw(st.integers(0, 2000)))
            node = draw(st.sampled_from([None, *_NODES]))
            initial.append(s if node is None else admit(s, node, draw(st.integers(1, 3000)), 2.0))
    n = draw(st.integers(1, 16))
    ops = [(sid, _op(draw, sid, i)) for i, sid in enumerate(draw(st.lists(
        st.sampled_from(sids), min_size=n, max_size=n)))]  # fmt: skip
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=3)))
    return initial, ops, cuts


async def _state(store: StateStore) -> tuple[object, ...]:
    return (
        await store.sessions(),
        await store.pool_ids(),
        await store.admitted_tool_ids(),
        await _reserved_by_node(store),
    )


async def _batch_equals_singles(
    batched: StateStore,
    single: StateStore,
    script: tuple[list[Session], list[tuple[str, Step]], list[int]],
) -> None:
    initial, ops, cuts = script
    for store in (batched, single):
        for s in initial:
            await store.update_session(s.id, _create(s))
    want = [await single.update_session_with(sid, fn) for sid, fn in ops]
    got: list[tuple[Session | None, object]] = []
    bounds = [0, *cuts, len(ops)]
    for lo, hi in itertools.pairwise(bounds):
        got += await batched.update_sessions_with(ops[lo:hi])
    assert got == want
    plain = await batched.update_sessions([(sid, lambda s: None) for sid, _ in ops])
    assert plain == [await single.get_session(sid) for sid, _ in ops]
    assert await _state(batched) == await _state(single)
    await _check_reserved(batched)


class TestBatchEqualsSingles:
    @pytest.mark.parametrize("kind", ["fake", "redis", "redis-cached", "redis-cluster"])
    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(script=_script())
    def test_random_transitions(
        self,
        kind: str,
        request: pytest.FixtureRequest,
        script: tuple[list[Session], list[tuple[str, Step]], list[int]],
    ) -> None:
        """Random transition sequences in random batches store, return and index exactly
        what the single updates in order do, reserved totals included."""

        url = url_for(request, kind)

        async def run() -> None:
            batched, close_b = await open_store(kind, url)
            single, close_s = await open_store(kind, url)
            try:
                await _batch_equals_singles(batched, single, script)
            finally:
                await close_b()
                await close_s()

        asyncio.run(run())


# --- tool statistics -------------------------------------------------------------------------

_samples = st.lists(
    st.tuples(
        st.sampled_from(["bash", "grep", "edit"]),
        st.floats(0.0, 1e4, allow_nan=False),
        st.booleans(),
    ),
    max_size=20,
)


class TestRecordTools:
    @pytest.mark.parametrize("kind", ["fake", "redis", "redis-cluster"])
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(items=_samples)
    def test_equals_sequential_records(
        self, kind: str, request: pytest.FixtureRequest, items: list[tuple[str, float, bool]]
    ) -> None:
        """record_tools stores exactly what record_tool per sample, in order, does."""
        url = url_for(request, kind)

        async def run() -> None:
            batched, close_b = await open_store(kind, url)
            single, close_s = await open_store(kind, url)
            try:
                await batched.record_tool("bash", 2.0)
                await single.record_tool("bash", 2.0)
                await batched.record_tools(items)
                for tool, duration, censored in items:
                    await single.record_tool(tool, duration, censored=censored)
                assert await batched.history() == await single.history()
            finally:
                await close_b()
                await close_s()

        asyncio.run(run())

    async def test_bad_sample_refuses_the_batch(self, store: StateStore) -> None:
        """A negative duration or an empty tool name refuses the whole batch."""
        with pytest.raises(ValueError, match="duration"):
            await store.record_tools([("t", 1.0, False), ("t", -1.0, False)])
        with pytest.raises(ValueError):
            await store.record_tools([("t", 1.0, False), ("", 1.0, False)])
        assert await store.history() == History()

    async def test_concurrent_records_lose_nothing(self, store: StateStore) -> None:
        """Concurrent batches and single records all land in the tool and global stats."""
        jobs: list[Awaitable[None]] = [
            store.record_tools([("t", 1.0, False), ("u", 1.0, False)]) for _ in range(10)
        ]
        jobs += [store.record_tool("t", 1.0) for _ in range(10)]
        jobs += [store.record_tools([("t", 5.0, True)]) for _ in range(3)]
        await asyncio.gather(*jobs)
        h = await store.history()
        done = update(ToolStats(count=19, mean=1.0, min_s=1.0, max_s=1.0), 1.0)
        assert h.of("t") == censor(censor(censor(done, 5.0), 5.0), 5.0)
        assert h.of("u").count == 10 and h.overall.count == 30 and h.overall.censored == 3
