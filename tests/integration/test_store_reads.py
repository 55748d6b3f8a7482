"""The valuation read paths (shared/infra/store_reads.py) against FakeStore and real Redis:
they return exactly what the plain protocol reads return, and reuse decoded records."""

from __future__ import annotations

from collections.abc import Callable

from shared.core.session import Session, ToolCall, admit, on_end, on_request, on_response
from shared.infra.store import Store
from shared.infra.store_reads import SessionReader, idle_candidates
from shared.infra.store_types import NodeUpdate, StateStore


def _put(s: Session) -> Callable[[Session | None], Session]:
    return lambda _old: s


async def _seed(store: StateStore) -> None:
    """Pooled (waiting, in a tool), admitted in a tool, admitted idle, ended; odd ids too."""
    for i, sid in enumerate(["p0", "p1", "weird id:{x}/é", "t0", "t1", "idle0", "gone"]):
        s, _ = on_request(Session(sid), f"r{i}", 10.0 + i, model="m", tokens_estimate=1000 + i)
        if sid.startswith("p1"):
            s = on_response(s, 11.0, total_tokens=1500, tool_calls=[("c1", "bash")])
        if sid.startswith("t"):
            s = admit(s, "n1", 2000 + i, 12.0)
            s = on_response(s, 13.0, total_tokens=1600, tool_calls=[("c", "bash")])
        if sid.startswith("idle"):
            s = on_response(admit(s, "n1", 2000 + i, 12.0), 13.5, total_tokens=1700)
        if sid == "gone":
            s = on_end(s, 14.0)
        await store.update_session(sid, _put(s))
        await store.put_residency(sid, "n1", 512 * (i + 1), 9.5 + i)
        if i % 2:
            await store.put_residency(sid, "n2", 16 * (i + 1), 3.25)
        if i % 3 == 0:  # the host KV tier: beside a GPU run on n1, alone on n3
            await store.put_tiered_residencies(
                [(sid, "n1", 512 * (i + 1), 9.5 + i, 1024 * (i + 1)), (sid, "n3", 0, 4.0, 64)]
            )


async def _plain(store: StateStore, which: str) -> tuple[list[Session], dict[str, object]]:
    ids = sorted(await (store.pool_ids() if which == "pool" else store.admitted_tool_ids()))
    return await store.sessions(ids), dict(await store.residency(ids))


class TestTieredResidency:
    async def test_host_tokens_are_kept_apart_from_the_gpu_residency(
        self, store: StateStore
    ) -> None:
        """An entry holding host-tier tokens only is no GPU residency; the host tokens are
        read on their own; a pair with neither is deleted, and a clear drops both."""
        await store.put_tiered_residencies([("s", "a", 100, 1.5, 300), ("s", "b", 0, 2.0, 50)])
        await store.put_residency("s", "c", 10, 3.0)
        assert await store.residency(["s"]) == {"s": {"a": (100, 1.5), "c": (10, 3.0)}}
        assert await store.host_residency(["s", "nobody"]) == {"s": {"a": 300, "b": 50}}
        await store.put_tiered_residencies([("s", "b", 0, 2.5, 0)])
        await store.clear_node_residency("a")
        assert await store.residency(["s"]) == {"s": {"c": (10, 3.0)}}
        assert await store.host_residency(["s"]) == {}


class TestSessionReader:
    async def test_same_as_plain_reads(self, store: StateStore) -> None:
        """Both index sets read through the reader equal sessions() + residency() of them."""
        await _seed(store)
        reader = SessionReader(store, chunk=2)
        for which in ("pool", "admitted_tool"):
            got, res = await reader.index(which)  # type: ignore[arg-type]
            want, want_res = await _plain(store, which)
            assert got == want
            assert res == want_res
            assert reader.host(which) == await store.host_residency(sorted(want_res))
        assert {s.id for s in (await reader.index("pool"))[0]} == {"p0", "p1", "weird id:{x}/é"}

    async def test_unchanged_records_are_not_decoded_again(self, store: StateStore) -> None:
        """A second read reuses every record; a changed one is decoded again and read fresh."""
        await _seed(store)
        reader = SessionReader(store)
        await reader.index("pool")
        first = reader.decoded
        got, _ = await reader.index("pool")
        if isinstance(store, Store):
            assert reader.decoded == first and reader.reused == 3
        p0 = await store.get_session("p0")
        assert p0 is not None
        await store.update_session("p0", _put(on_response(p0, 20.0, total_tokens=9999)))
        await store.update_session(
            "p1", lambda s: None if s is None else on_request(s, "r9", 21.0)[0]
        )
        got, _ = await reader.index("pool")
        assert got == (await _plain(store, "pool"))[0]
        assert "p0" not in {s.id for s in got}  # left the pool: it now runs nowhere, idle
        if isinstance(store, Store):
            assert reader.decoded == first + 1  # only p1 (p0 is not in the pool any more)

    async def test_probe_mark_without_version_bump_is_seen(self, store: StateStore) -> None:
        """A probe mark written without a version bump shows in the next cached read."""
        await _seed(store)
        reader = SessionReader(store)
        await reader.index("pool")
        assert await store.put_probe_marks({"p1": 42.5, "p0": None}) == 2
        got, _ = await reader.index("pool")
        assert {s.id: s.probe_mark for s in got}["p1"] == 42.5
        assert got == (await _plain(store, "pool"))[0]
        assert await store.put_probe_marks({"p1": None}) == 1
        got, _ = await reader.index("pool")
        assert {s.id: s.probe_mark for s in got}["p1"] is None

    async def test_records_without_residency(self, store: StateStore) -> None:
        """``residency=False`` reads the same records, and no residency at all."""
        await _seed(store)
        ids = sorted(await store.session_ids())
        reader = SessionReader(store, chunk=3)
        got, res = await reader.read(ids, "all", residency=False)
        assert got == await store.sessions(ids)
        assert res == {}
        again, res = await reader.read(ids, "all", residency=False)  # from the cache
        assert again == got and res == {}
        with_res, res = await reader.read(ids, "all")
        assert with_res == got and res == dict(await store.residency(ids))

    async def test_deleted_session_is_skipped(self, store: StateStore) -> None:
        """A session deleted between the id read and the record read is simply absent."""
        await _seed(store)
        reader = SessionReader(store)
        await reader.read(["p0", "p1"], "pool")
        await store.delete_session("p0")
        got, res = await reader.read(["p0", "p1"], "pool")
        assert [s.id for s in got] == ["p1"]
        assert res["p0"] == {}


class TestTickRead:
    """``tick_read``: the index set, its residency and the node views in one read, equal to
    the plain protocol reads at every step (records changed, probe-marked, residency moved,
    sessions gone, odd ids), reusing what is unchanged."""

    async def _nodes(self, store: StateStore) -> None:
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=True))
        await store.put_node_status(
            "n2", NodeUpdate(capacity_tokens=4_000, healthy=False, models=("m",))
        )

    async def _same(self, reader: SessionReader, store: StateStore, which: str) -> None:
        got, res, views = await reader.tick_read(which)  # type: ignore[arg-type]
        want, want_res = await _plain(store, which)
        assert got == want
        assert res == want_res
        assert views == await store.node_views()
        assert reader.host(which) == await store.host_residency(sorted(want_res))

    async def test_same_as_plain_reads_through_changes(self, store: StateStore) -> None:
        await _seed(store)
        await self._nodes(store)
        reader = SessionReader(store)
        for which in ("pool", "admitted_tool"):
            await self._same(reader, store, which)
        decoded = reader.decoded
        await self._same(reader, store, "pool")
        if isinstance(store, Store):
            assert reader.decoded == decoded  # nothing changed: nothing decoded again
        await store.update_session(
            "weird id:{x}/é", lambda s: None if s is None else on_request(s, "r9", 21.0)[0]
        )
        await store.put_probe_marks({"p1": 42.5})
        await store.put_residency("p0", "n2", 4096, 30.0)
        await store.delete_session("p1")
        await store.put_node_status("n1", NodeUpdate(healthy=False))
        await self._same(reader, store, "pool")
        if isinstance(store, Store):
            assert reader.decoded == decoded + 1  # only the odd id's new record
        await self._same(reader, store, "admitted_tool")

    async def test_a_set_past_a_chunk_is_read_in_chunks(self, store: StateStore) -> None:
        """More members than ``chunk`` (one script call would hold Redis too long): read as
        ``index`` reads them, with the same result."""
        await _seed(store)
        await self._nodes(store)
        reader = SessionReader(store, chunk=2)
        await self._same(reader, store, "pool")  # 3 pooled: past the chunk on the first read
        await self._same(reader, store, "pool")  # and with a cache of 3 held


class TestNamedTickRead:
    """``tick_read(which, named)``: the named sessions read as a whole read would read them
    (changed, gone, newly pooled, not a member), the rest of the set as the last read held it
    (changes made meanwhile unseen), and every node read fresh."""

    async def _expected(
        self, store: StateStore, before: list[Session], res: dict[str, object], named: set[str]
    ) -> tuple[list[Session], dict[str, object]]:
        pool = await store.pool_ids()
        kept = {s.id: s for s in before if s.id not in named}
        fresh = {s.id: s for s in await store.sessions(sorted(named & pool))}
        got = {**kept, **fresh}
        want_res = {sid: r for sid, r in res.items() if sid not in named}
        want_res.update(await store.residency(sorted(named & pool)))
        return [got[sid] for sid in sorted(got)], want_res

    async def test_named_read_reuses_the_rest(self, store: StateStore) -> None:
        await _seed(store)
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=True))
        reader = SessionReader(store)
        before, res, _ = await reader.tick_read("pool")
        await store.update_session(
            "p0", lambda s: None if s is None else on_request(s, "r9", 21.0)[0]
        )
        await store.put_probe_marks({"p1": 42.5})  # not named: unseen
        await store.put_residency("p1", "n2", 4096, 30.0)  # not named: unseen
        await store.delete_session("weird id:{x}/é")  # named: gone
        new, _ = on_request(Session("p9"), "r10", 22.0, model="m", tokens_estimate=900)
        await store.update_session("p9", _put(new))  # named: newly pooled
        await store.put_residency("p9", "n1", 64, 22.0)
        await store.put_node_status("n1", NodeUpdate(healthy=False))  # nodes: always read
        named = {"p0", "weird id:{x}/é", "p9", "t0", "nobody"}  # t0 is admitted: not a member
        got, got_res, views = await reader.tick_read("pool", named)
        want, want_res = await self._expected(store, before, dict(res), named)
        assert got == want
        assert got_res == want_res
        assert views == await store.node_views()
        assert [s.id for s in got] == ["p0", "p1", "p9"]
        p1 = next(s for s in got if s.id == "p1")
        assert p1.probe_mark is None  # as the first read held it
        # the next whole read sees everything again
        got, got_res, _ = await reader.tick_read("pool")
        plain, plain_res = await _plain(store, "pool")
        assert (got, got_res) == (plain, plain_res)

    async def test_no_names_reads_the_nodes_only(self, store: StateStore) -> None:
        await _seed(store)
        reader = SessionReader(store)
        before, res, _ = await reader.tick_read("pool")
        await store.delete_session("p0")
        await store.put_node_status("n3", NodeUpdate(capacity_tokens=500, healthy=True))
        got, got_res, views = await reader.tick_read("pool", set())
        assert (got, got_res) == (before, res)
        assert views == await store.node_views()
        assert "n3" in {v.id for v in views}

    async def test_whole_read_first_and_past_a_chunk(self, store: StateStore) -> None:
        """Without an earlier whole read, or with more names than a chunk, the set is read
        whole (the names alone would leave the rest unknown)."""
        await _seed(store)
        reader = SessionReader(store, chunk=2)
        got, res, _ = await reader.tick_read("pool", {"p0"})  # first read: whole
        assert (got, res) == await _plain(store, "pool")
        await store.delete_session("p1")
        got, res, _ = await reader.tick_read("pool", {"p0", "p9", "t0"})  # 3 > chunk: whole
        assert (got, res) == await _plain(store, "pool")

    async def test_own_probe_marks_are_patched_in(self, store: StateStore) -> None:
        """The reader's own probe-mark writes show in the records a named read reuses."""
        await _seed(store)
        reader = SessionReader(store)
        await reader.tick_read("pool")
        await store.put_probe_marks({"p1": 7.5})
        reader.note_probe_marks("pool", {"p1": 7.5})
        got, _, _ = await reader.tick_read("pool", set())
        assert next(s for s in got if s.id == "p1").probe_mark == 7.5
        got, _, _ = await reader.tick_read("pool")
        assert got == (await _plain(store, "pool"))[0]


class TestIdleCandidates:
    async def test_same_as_rule_on_full_records(self, store: StateStore) -> None:
        """The four-field read selects exactly the idle or in-a-tool, not-ended sessions
        (admitted or not) whose last update is older than the timeout."""
        await _seed(store)
        call = ToolCall(call_id="c", tool="bash", started_at=1.0)
        idle = Session("idle-old", version=3, node="n1", weight=10, updated_at=5.0, tool=None)
        await store.update_session("idle-old", _put(idle))
        in_tool = Session(
            "tool-old", version=1, node="n1", weight=5, activity="tool", tool=call, updated_at=5.0
        )
        await store.update_session("tool-old", _put(in_tool))
        await store.update_session("free-old", _put(Session("free-old", version=1, updated_at=5.0)))
        old = ["free-old", "idle-old", "tool-old"]
        assert await idle_candidates(store, 100.0, 90.0, chunk=3) == old
        older = sorted([*old, "idle0", "p1", "t0", "t1"])  # p0, "weird…" wait; "gone" ended
        assert await idle_candidates(store, 100.0, 86.0, chunk=3) == older
        assert await idle_candidates(store, 100.0, 95.0) == []


class TestEvidence:
    async def test_nodes_kv_evidence_is_read_with_the_nodes(self, store: StateStore) -> None:
        """``kv_since`` / ``kv_until`` written with a node update come back in its record and
        in the reader's ``evidence`` (whole, named and chunked reads); ``None`` clears them."""
        await _seed(store)
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=True))
        await store.put_node_status("n2", NodeUpdate(capacity_tokens=10_000, healthy=True))
        await store.put_node_status("n1", NodeUpdate(kv_since=12.5, kv_until=1e9 + 0.25))
        rec = await store.get_node("n1")
        assert rec is not None and rec.evidence == (12.5, 1e9 + 0.25) and rec.healthy
        for reader in (SessionReader(store), SessionReader(store, chunk=1)):
            await reader.tick_read("pool")
            assert reader.evidence == {"n1": (12.5, 1e9 + 0.25)}
            await store.put_node_status("n1", NodeUpdate(kv_until=1e9 + 1))
            await reader.tick_read("pool", {"p0"})
            assert reader.evidence == {"n1": (12.5, 1e9 + 1)}
            await store.put_node_status("n1", NodeUpdate(kv_until=1e9 + 0.25))
        await store.put_node_status("n1", NodeUpdate(kv_since=None, kv_until=None))
        rec = await store.get_node("n1")
        assert rec is not None and rec.evidence is None and rec.kv_since is None
