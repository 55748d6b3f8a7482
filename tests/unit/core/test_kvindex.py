"""The KV-event index (shared/core/kvindex.py): ref counts, engine-hash map, orphans, clears,
filters, and incremental session prefixes against a brute-force walk."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.kv import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from shared.core.blockkeys import ROOT, chain_keys, root_for
from shared.core.kvindex import KvIndex

BS = 4
A = list(range(100, 116))  # 4 blocks
B = A[:8] + list(range(200, 208))  # shares A's first 2 blocks


def stored(
    hashes: list[BlockHash],
    parent: BlockHash | None,
    tokens: list[int],
    **kw: object,
) -> BlockStored:
    fields: dict[str, object] = {"lora_id": None, "medium": "GPU", "lora_name": None, **kw}
    return BlockStored(hashes, parent, tokens, BS, **fields)  # type: ignore[arg-type]


def batch(*events: KVEvent, ts: float = 1.0) -> KVEventBatch:
    return KVEventBatch(ts=ts, events=list(events))


class Feeder:
    """Applies batches to one index with consecutive sequence numbers per node."""

    def __init__(self) -> None:
        self.index = KvIndex()
        self.seq: dict[str, int] = {}

    def send(self, node: str, *events: KVEvent, t: float = 1.0) -> None:
        seq = self.seq.get(node, -1) + 1
        self.seq[node] = seq
        self.index.apply(node, seq, batch(*events), t)


class TestRefCounts:
    def test_a_block_stored_twice_stays_resident_after_one_removal(self) -> None:
        """vLLM does not de-duplicate: two stores need two removals."""
        f = Feeder()
        f.send("n", stored([1], None, A[:4]))
        f.send("n", stored([1], None, A[:4]))
        key = chain_keys(A[:4], BS)[0]
        assert f.index.resident("n", key) == 2
        f.send("n", BlockRemoved([1], "GPU"))
        assert f.index.resident("n", key) == 1
        assert f.index.walk("n", [key]) == 1
        f.send("n", BlockRemoved([1], "GPU"))
        assert f.index.resident("n", key) == 0
        assert f.index.stats("n").blocks == 0  # type: ignore[union-attr]

    def test_identical_blocks_under_different_engine_hashes_share_one_key(self) -> None:
        """Two engine hashes of the same tokens and parent are one own key counted twice."""
        f = Feeder()
        f.send("n", stored([1], None, A[:4]), stored([2], None, A[:4]))
        st_ = f.index.stats("n")
        assert st_ is not None and st_.blocks == 1 and st_.resident_tokens == BS
        f.send("n", BlockRemoved([2], "GPU"))
        assert f.index.walk("n", chain_keys(A, BS)) == 1


class TestEngineMap:
    def test_own_keys_are_the_chain_keys_of_the_token_ids(self) -> None:
        """Stored runs chain through their engine parents; the keys equal chain_keys."""
        f = Feeder()
        f.send("n", stored([b"\x01" * 32, b"\x02" * 32], None, A[:8]))
        f.send("n", stored([b"\x03" * 32, b"\x04" * 32], b"\x02" * 32, A[8:]))
        keys = chain_keys(A, BS)
        assert [f.index.resident("n", k) for k in keys] == [1, 1, 1, 1]
        assert f.index.walk("n", keys) == 4

    def test_removal_resolves_engine_hash_without_reproducing_it(self) -> None:
        """BlockRemoved names engine hashes; the map finds the own key."""
        f = Feeder()
        f.send("n", stored([11, 12, 13, 14], None, A))
        f.send("n", BlockRemoved([13], None))
        assert f.index.walk("n", chain_keys(A, BS)) == 2

    def test_unknown_removal_is_counted_and_ignored(self) -> None:
        f = Feeder()
        f.send("n", stored([11], None, A[:4]))
        f.send("n", BlockRemoved([99], "GPU"))
        st_ = f.index.stats("n")
        assert st_ is not None and st_.unknown_removals == 1 and st_.blocks == 1


class TestOrphans:
    def test_unknown_parent_is_resident_but_matches_nothing(self) -> None:
        """A block whose parent engine hash was never seen counts, but no chain reaches it."""
        f = Feeder()
        f.send("n", stored([13, 14], 12, A[8:]))
        st_ = f.index.stats("n")
        assert st_ is not None and st_.blocks == 2 and st_.orphans == 1
        assert f.index.walk("n", chain_keys(A, BS)) == 0
        f.send("n", stored([11, 12], None, A[:8]))
        assert f.index.walk("n", chain_keys(A, BS)) == 2  # the orphans still do not join

    def test_children_of_an_orphan_are_orphans(self) -> None:
        f = Feeder()
        f.send("n", stored([13], 12, A[8:12]))
        f.send("n", stored([14], 13, A[12:]))
        assert all(f.index.resident("n", k) == 0 for k in chain_keys(A, BS))
        assert f.index.stats("n").blocks == 2  # type: ignore[union-attr]


class TestClear:
    def test_all_blocks_cleared_drops_the_node_only(self) -> None:
        f = Feeder()
        f.send("n1", stored([1, 2], None, A[:8]))
        f.send("n2", stored([1, 2], None, A[:8]))
        f.send("n1", AllBlocksCleared())
        assert f.index.stats("n1").blocks == 0  # type: ignore[union-attr]
        assert f.index.stats("n2").blocks == 2  # type: ignore[union-attr]
        assert f.index.take_cleared() == ["n1"]
        assert f.index.take_cleared() == []

    def test_seq_going_backwards_clears_and_bumps_the_incarnation(self) -> None:
        """An engine restart numbers from 0 again: clear the node, new incarnation."""
        idx = KvIndex()
        idx.apply("n", 5, batch(stored([1], None, A[:4])), 1.0)
        res = idx.apply("n", 0, batch(stored([7], None, DOCS[3][:4])), 2.0)
        assert res.action == "restart" and res.cleared
        st_ = idx.stats("n")
        assert st_ is not None
        assert (st_.incarnation, st_.seq, st_.blocks) == (1, 0, 1)
        assert idx.walk("n", chain_keys(A, BS)) == 0

    def test_gap_is_reported_and_applied(self) -> None:
        idx = KvIndex()
        idx.apply("n", 0, batch(stored([1], None, A[:4])), 1.0)
        res = idx.apply("n", 3, batch(stored([2], 1, A[4:8])), 1.0)
        assert res.action == "gap" and not res.cleared
        assert idx.walk("n", chain_keys(A, BS)) == 2


class TestFilters:
    def test_only_gpu_medium_counts(self) -> None:
        f = Feeder()
        f.send("n", stored([1], None, A[:4], medium="CPU"))
        assert f.index.stats("n").blocks == 0  # type: ignore[union-attr]
        f.send("n", stored([1], None, A[:4], medium=None))
        f.send("n", BlockRemoved([1], "CPU"))
        assert f.index.stats("n").blocks == 1  # type: ignore[union-attr]

    def test_hybrid_model_counts_only_the_full_attention_group(self) -> None:
        """Sliding-window stores are ignored; a removal in that group (same engine hash) does
        not touch the full-attention block."""
        f = Feeder()
        f.send(
            "n",
            stored([1], None, A[:4], group_idx=0, kv_cache_spec_kind="full_attention"),
            stored([1], None, A[:4], group_idx=1, kv_cache_spec_kind="sliding_window"),
        )
        assert f.index.resident("n", chain_keys(A[:4], BS)[0]) == 1
        f.send("n", BlockRemoved([1], "GPU", group_idx=1))
        assert f.index.resident("n", chain_keys(A[:4], BS)[0]) == 1
        f.send("n", BlockRemoved([1], "GPU", group_idx=0))
        assert f.index.resident("n", chain_keys(A[:4], BS)[0]) == 0

    def test_a_group_named_after_unnamed_stores_is_adopted(self) -> None:
        """An engine that starts naming its group keeps counting (None, then 0)."""
        f = Feeder()
        f.send("n", stored([1], None, A[:4]))
        f.send("n", stored([2], 1, A[4:8], group_idx=0, kv_cache_spec_kind="full_attention"))
        f.send("n", stored([2], 1, A[4:8], group_idx=1, kv_cache_spec_kind="full_attention"))
        assert f.index.walk("n", chain_keys(A, BS)) == 2
        assert f.index.resident("n", chain_keys(A, BS)[1]) == 1

    def test_mla_counts_as_full_attention_and_mamba_does_not(self) -> None:
        f = Feeder()
        f.send("a", stored([1], None, A[:4], group_idx=0, kv_cache_spec_kind="mla_attention"))
        f.send("b", stored([1], None, A[:4], group_idx=0, kv_cache_spec_kind="mamba"))
        assert f.index.stats("a").blocks == 1  # type: ignore[union-attr]
        assert f.index.stats("b").blocks == 0  # type: ignore[union-attr]

    def test_lora_blocks_chain_from_the_adapter_root(self) -> None:
        f = Feeder()
        f.send("n", stored([1], None, A[:4], lora_name="adapter"))
        assert f.index.walk("n", chain_keys(A[:4], BS, ROOT)) == 0
        assert f.index.walk("n", chain_keys(A[:4], BS, root_for("adapter"))) == 1

    def test_blocks_with_extra_keys_never_match_token_chains(self) -> None:
        f = Feeder()
        f.send("n", stored([1, 2], None, A[:8], extra_keys=[None, ("salt",)]))
        assert f.index.walk("n", chain_keys(A[:8], BS)) == 1
        assert f.index.stats("n").blocks == 2  # type: ignore[union-attr]


class TestSessions:
    def test_prefix_follows_stores_and_evictions_and_is_drained_once(self) -> None:
        f = Feeder()
        f.index.register("s", chain_keys(A, BS), BS, 0.5)
        assert f.index.drain() == []
        f.send("n", stored([1, 2, 3], None, A[:12]), t=2.0)
        out = f.index.drain()
        assert [(r.session, r.node, r.tokens, r.stamp) for r in out] == [("s", "n", 12, 2.0)]
        assert f.index.drain() == []
        f.send("n", BlockRemoved([2], "GPU"), t=3.0)
        assert [(r.tokens, r.stamp) for r in f.index.drain()] == [(4, 3.0)]
        f.send("n", AllBlocksCleared(), t=4.0)
        assert [(r.tokens, r.stamp) for r in f.index.drain()] == [(0, 4.0)]

    def test_registering_a_chain_on_resident_blocks_marks_it_dirty(self) -> None:
        f = Feeder()
        f.send("n1", stored([1, 2], None, B[:8]))
        f.index.register("s", chain_keys(A, BS), BS, 7.0)
        assert [(r.node, r.tokens, r.stamp) for r in f.index.drain()] == [("n1", 8, 7.0)]
        assert f.index.prefix_tokens("s", "n1") == 8

    def test_an_older_chain_is_ignored(self) -> None:
        """Registering a chain stamped before the held one changes nothing (False); the same
        stamp or a later one replaces it."""
        f = Feeder()
        other = chain_keys(list(range(300, 316)), BS)  # shares no block with A
        f.send("n", stored([1, 2], None, A[:8]))
        assert f.index.register("s", chain_keys(A, BS), BS, 5.0)
        f.index.drain()
        assert not f.index.register("s", other, BS, 4.0)
        assert f.index.drain() == [] and f.index.prefix_tokens("s", "n") == 8
        assert f.index.register("s", other, BS, 5.0)
        assert f.index.prefix_tokens("s", "n") == 0

    def test_forget_drops_the_session_and_its_dirty_pairs(self) -> None:
        f = Feeder()
        f.index.register("s", chain_keys(A, BS), BS, 0.0)
        f.send("n", stored([1], None, A[:4]))
        f.index.forget("s")
        assert f.index.drain() == [] and f.index.sessions() == 0
        f.send("n", stored([2], 1, A[4:8]))
        assert f.index.drain() == []


# --- property: incremental prefixes equal a brute-force walk, refs equal a model ---------------

DOCS = [A, B, A[:4] + list(range(300, 312)), list(range(400, 416))]


def engine_hash(doc: int, block: int) -> int:
    """The engine hash of block ``block`` of ``DOCS[doc]``: one id per distinct token prefix."""
    prefix = tuple(DOCS[doc][: (block + 1) * BS])
    return PREFIX_IDS.setdefault(prefix, len(PREFIX_IDS) + 1)


PREFIX_IDS: dict[tuple[int, ...], int] = {}
NODES = ("n0", "n1")
op_st = st.one_of(
    st.tuples(
        st.just("store"),
        st.sampled_from(NODES),
        st.integers(0, 3),
        st.integers(0, 3),
        st.integers(1, 4),
    ),
    st.tuples(
        st.just("remove"), st.sampled_from(NODES), st.integers(0, 3), st.integers(0, 3), st.just(1)
    ),
    st.tuples(st.just("clear"), st.sampled_from(NODES), st.just(0), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.sampled_from(NODES), st.just(0), st.just(0), st.just(0)),
    st.tuples(
        st.just("register"),
        st.sampled_from(("s0", "s1", "s2")),
        st.integers(0, 3),
        st.integers(0, 4),
        st.just(0),
    ),
    st.tuples(st.just("forget"), st.sampled_from(("s0", "s1")), st.just(0), st.just(0), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=60))
def test_incremental_prefixes_equal_a_brute_force_walk(
    ops: list[tuple[str, str, int, int, int]],
) -> None:
    """After any sequence of stores, removals, clears, restarts and (re)registrations: each
    (session, node) prefix equals a walk of the chain, the resident counts equal a model
    multiset, and a store fed only by drain() holds exactly the non-zero prefixes."""
    idx = KvIndex()
    seq = {n: -1 for n in NODES}
    model: dict[str, Counter[int]] = {n: Counter() for n in NODES}
    own = {
        engine_hash(d, j): k
        for d, doc in enumerate(DOCS)
        for j, k in enumerate(chain_keys(doc, BS))
    }
    chains: dict[str, list[int]] = {}
    shadow: dict[tuple[str, str], int] = {}
    t = 0.0
    for op, who, a, b, c in ops:
        t += 1.0
        if op in ("store", "remove", "clear", "restart"):
            node = who
            if op == "restart":
                seq[node] = -1
                model[node].clear()
            events: list[KVEvent] = []
            if op == "store":
                start, n = b, min(c, 4 - b)
                parent = None if start == 0 else engine_hash(a, start - 1)
                if parent is not None and model[node][parent] == 0:
                    continue  # keep the model free of orphans
                hashes = [engine_hash(a, j) for j in range(start, start + n)]
                tokens = DOCS[a][start * BS : (start + n) * BS]
                events.append(stored(hashes, parent, tokens))  # type: ignore[arg-type]
                model[node].update(hashes)
            elif op == "remove":
                h = engine_hash(a, b)
                events.append(BlockRemoved([h], "GPU"))
                if model[node][h] > 0:
                    model[node][h] -= 1
            elif op == "clear":
                events.append(AllBlocksCleared())
                model[node].clear()
            else:
                events.append(stored([engine_hash(0, 0)], None, A[:4]))
                model[node].update([engine_hash(0, 0)])
            seq[node] += 1
            idx.apply(node, seq[node], batch(*events), t)
        elif op == "register":
            keys = chain_keys(DOCS[a][: b * BS], BS)
            chains[who] = keys
            idx.register(who, keys, BS, t)
        else:
            chains.pop(who, None)
            idx.forget(who)
            for node in NODES:
                shadow.pop((who, node), None)
        for node in idx.take_cleared():
            for pair in [p for p in shadow if p[1] == node]:
                del shadow[pair]
        for r in idx.drain():
            if r.tokens:
                shadow[(r.session, r.node)] = r.tokens
            else:
                shadow.pop((r.session, r.node), None)
        for node in NODES:
            resident = {own[h] for h, cnt in model[node].items() if cnt > 0}
            st_ = idx.stats(node)
            assert (0 if st_ is None else st_.blocks) == len(resident)
            for h, cnt in model[node].items():
                assert idx.resident(node, own[h]) == cnt
            for sid, keys in chains.items():
                brute = 0
                while brute < len(keys) and keys[brute] in resident:
                    brute += 1
                assert idx.prefix_blocks(sid, node) == brute == idx.walk(node, keys)
                assert shadow.get((sid, node), 0) == brute * BS
            # The filters that spare blocks the reverse-map lookup, recounted from scratch.
            held: Counter[int] = Counter()
            want: Counter[int] = Counter()
            for sid, keys in chains.items():
                p = idx.prefix_blocks(sid, node)
                held.update(keys[:p])
                if 0 < p < len(keys):
                    want[keys[p]] += 1
            state = idx._nodes.get(node)
            assert dict(held) == ({} if state is None else state.held)
            assert dict(want) == ({} if state is None else state.want)
        # The reverse map: each key to the sessions whose chain has it, at its first position.
        rev: dict[int, dict[str, int]] = {}
        for sid, keys in chains.items():
            for pos, key in enumerate(keys):
                rev.setdefault(key, {}).setdefault(sid, pos)
        assert idx._rev == rev


class TestEvidence:
    """``evidence(node)`` = (complete since, up to): what the valuation confirms credit by."""

    def test_a_healthy_stream_confirms_up_to_its_latest_batch(self) -> None:
        f = Feeder()
        assert f.index.evidence("n") is None
        f.send("n", stored([1], None, A[:4]), t=10.0)
        assert f.index.evidence("n") == (10.0, 10.0)
        f.send("n", stored([2], 1, A[4:8]), t=12.0)
        f.send("n", BlockRemoved([2], "GPU"), t=11.5)  # a stamp back in time moves nothing
        assert f.index.evidence("n") == (10.0, 12.0)

    def test_a_gap_restarts_the_stretch(self) -> None:
        f = Feeder()
        f.send("n", stored([1], None, A[:4]), t=10.0)
        f.index.apply("n", 5, batch(), 20.0)  # seq 1..4 lost
        assert f.index.evidence("n") == (20.0, 20.0)
        f.index.apply("n", 6, batch(), 21.0)
        assert f.index.evidence("n") == (20.0, 21.0)

    def test_clears_and_restarts_restart_it(self) -> None:
        f = Feeder()
        f.send("n", stored([1], None, A[:4]), t=10.0)
        f.send("n", AllBlocksCleared(), t=15.0)
        assert f.index.evidence("n") == (15.0, 15.0)
        f.index.apply("n", 0, batch(), 17.0)  # seq back to 0: an engine restart
        assert f.index.evidence("n") == (17.0, 17.0)
        f.index.clear("n", 30.0, restart=True)
        assert f.index.evidence("n") == (30.0, 30.0)
        stats = f.index.stats("n")
        assert stats is not None and stats.since == 30.0

    def test_unconfirm_moves_the_start_past_a_usage_observation(self) -> None:
        """Residency written from usage at 12 is not the stream's: its stretch starts after
        12, so an observation at 12 is not confirmed, one after is."""
        f = Feeder()
        f.send("n", stored([1], None, A[:4]), t=10.0)
        f.index.unconfirm("n", 12.0)
        f.index.unconfirm("n", 11.0)  # never back
        f.index.unconfirm("other", 12.0)  # a node never heard from: nothing
        since, until = f.index.evidence("n") or (0.0, 0.0)
        assert 12.0 < since < 12.0 + 1e-9 and until == 10.0
        f.send("n", stored([2], 1, A[4:8]), t=14.0)
        assert f.index.evidence("n") == (since, 14.0)
        assert f.index.evidence("other") is None
