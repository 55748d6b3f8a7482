"""The KV index's host tier (shared/core/kvindex.py, ``medium="CPU"``): vLLM 0.32's placeholder
and self-describing host events named through the GPU stores' hashes, reference counts, clears
and restarts per tier, skipped media, and session prefixes per tier against a brute-force walk.

The event shapes are vLLM 0.32's (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/
events.py``, "oevents" below; docs/kv-tier.md §4): by default a host store is
``BlockStored(block_hashes=[h], parent_block_hash=None, token_ids=[], block_size=0,
lora_id=None, medium="CPU", group_idx=g)`` (oevents:337-357) with ``h`` the GPU event's hash of
that block, and an eviction ``BlockRemoved([h, ...], medium="CPU", group_idx=g)``
(oevents:407-440); with ``self_describing_kv_events`` the store carries the chunk's hashes,
parent, tokens and block size (oevents:359-405), and repeated announcements are to be
reference-counted (oevents:10-13).
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.contracts.kv import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
)
from shared.core.blockkeys import chain_keys
from shared.core.kvindex import GONE_MAX, KvIndex
from shared.core.tiers import CPU, GPU

BS = 4
A = list(range(100, 116))  # 4 blocks
KEYS = chain_keys(A, BS)


def gpu(hashes: list[BlockHash], parent: BlockHash | None, tokens: list[int]) -> BlockStored:
    return BlockStored(hashes, parent, tokens, BS, None, "GPU", None)


def cpu(h: BlockHash, group: int | None = None) -> BlockStored:
    """vLLM 0.32's default host store: one hash, no tokens, block_size 0 (oevents:337-357)."""
    return BlockStored([h], None, [], 0, None, "CPU", None, group_idx=group)


def cpu_full(hashes: list[BlockHash], parent: BlockHash | None, tokens: list[int]) -> BlockStored:
    """A self-describing host store (oevents:383-405)."""
    return BlockStored(
        hashes, parent, tokens, BS, None, "CPU", None, kv_cache_spec_kind="full_attention"
    )


class Feeder:
    """Applies batches to one index with consecutive sequence numbers per node."""

    def __init__(self) -> None:
        self.index = KvIndex()
        self.seq: dict[str, int] = {}

    def send(self, node: str, *events: KVEvent, t: float = 1.0) -> None:
        seq = self.seq.get(node, -1) + 1
        self.seq[node] = seq
        self.index.apply(node, seq, KVEventBatch(ts=t, events=list(events)), t)

    def tiers(self, node: str = "n") -> tuple[int, int]:
        return self.index.walk(node, KEYS, GPU), self.index.walk(node, KEYS, CPU)


class TestPlaceholders:
    def test_a_host_store_is_named_by_the_gpu_store_of_its_hash(self) -> None:
        """The placeholder's hash equals the GPU event's hash of the block (docs/kv-tier.md
        §4): it counts in the host tier under that block's own key, after the GPU events of
        the same batch (vsched:2370-2385)."""
        f = Feeder()
        f.send("n", gpu([1, 2, 3, 4], None, A), cpu(1), cpu(2))
        assert f.tiers() == (4, 2)
        assert f.index.resident("n", KEYS[0], CPU) == 1
        st_ = f.index.stats("n")
        assert st_ is not None and (st_.blocks, st_.host_blocks) == (4, 2)
        assert st_.host_resident_tokens == 2 * BS

    def test_gpu_eviction_leaves_the_host_copy(self) -> None:
        """Write-through and inclusive: a GPU eviction does nothing to the host tier (§1)."""
        f = Feeder()
        f.send("n", gpu([1, 2, 3, 4], None, A), *(cpu(h) for h in (1, 2, 3, 4)))
        f.send("n", BlockRemoved([3, 4], "GPU"))
        assert f.tiers() == (2, 4)
        f.send("n", BlockRemoved([4], "CPU"))
        assert f.tiers() == (2, 3)

    def test_a_host_store_completing_after_the_gpu_eviction_still_resolves(self) -> None:
        """The store completes steps after the block was computed (§1), possibly after its GPU
        copy was evicted: a node with a host tier (one host event seen) remembers the hashes of
        removed GPU blocks."""
        f = Feeder()
        f.send("n", cpu(10**9))
        f.send("n", gpu([1, 2], None, A[:8]))
        f.send("n", BlockRemoved([1, 2], "GPU"))
        f.send("n", cpu(1), cpu(2))
        assert f.tiers() == (0, 2)

    def test_an_unnamed_hash_waits_for_its_gpu_store(self) -> None:
        """A host store of a hash no GPU store named (the stream joined late) is counted and
        held by hash; the GPU store that names it (a load back re-announces on the GPU,
        vsched:3155-3157) makes it resident; an eviction before that forgets it."""
        f = Feeder()
        f.send("n", cpu(1), cpu(2), cpu(9))
        st_ = f.index.stats("n")
        assert st_ is not None and (st_.host_blocks, st_.host_unresolved) == (0, 3)
        f.send("n", BlockRemoved([9], "CPU"))
        f.send("n", gpu([1, 2], None, A[:8]))
        assert f.tiers() == (2, 2)
        st_ = f.index.stats("n")
        assert st_ is not None and (st_.host_unresolved, st_.unknown_removals) == (0, 0)
        f.send("n", BlockRemoved([77], "CPU"))
        assert f.index.stats("n").unknown_removals == 1  # type: ignore[union-attr]

    def test_removed_gpu_hashes_are_remembered_within_a_bound(self) -> None:
        """The memory of evicted GPU hashes keeps the latest ones (GONE_MAX)."""
        f = Feeder()
        f.send("n", cpu(10**9))  # the node has a host tier
        tokens = list(range(GONE_MAX + 8))
        for lo in range(0, GONE_MAX + 8, 4096):
            hashes = list(range(lo, min(lo + 4096, GONE_MAX + 8)))
            f.send("n", *(gpu([h], None, [tokens[h]] * BS) for h in hashes))
            f.send("n", BlockRemoved(hashes, "GPU"))
        host = f.index._nodes["n"].host
        assert host is not None and len(host.gone) <= GONE_MAX
        assert GONE_MAX + 7 in host.gone and 0 not in host.gone

    def test_placeholders_of_another_group_are_filtered(self) -> None:
        """Hybrid models: only the counted (full-attention) group's host blocks count."""
        f = Feeder()
        g0 = BlockStored([1], None, A[:4], BS, None, "GPU", None, group_idx=0)
        f.send("n", g0, cpu(1, group=1))
        assert f.tiers() == (1, 0)
        f.send("n", cpu(1, group=0))
        assert f.tiers() == (1, 1)
        f.send("n", BlockRemoved([1], "CPU", group_idx=1))
        assert f.tiers() == (1, 1)


class TestSelfDescribing:
    def test_a_self_describing_store_is_keyed_from_its_tokens(self) -> None:
        """Tokens, parent and block size key the chunk as a GPU store is; the parent is named
        through the GPU map (or the host's own)."""
        f = Feeder()
        f.send("n", gpu([1, 2], None, A[:8]), cpu_full([1, 2], None, A[:8]))
        f.send("n", BlockRemoved([1, 2], "GPU"))
        f.send("n", cpu_full([3, 4], 2, A[8:]))
        assert f.tiers() == (0, 4)

    def test_repeated_announcements_are_reference_counted(self) -> None:
        """Chunks overlapping a shared prefix re-announce its hashes (oevents:10-13): one
        eviction of a twice-announced block leaves it resident."""
        f = Feeder()
        f.send("n", cpu_full([1, 2], None, A[:8]), cpu_full([2], 1, A[4:8]))
        assert f.index.resident("n", KEYS[1], CPU) == 2
        f.send("n", BlockRemoved([1, 2], "CPU"))  # an eviction fans out to the chunk's hashes
        assert f.tiers() == (0, 0)
        assert f.index.resident("n", KEYS[1], CPU) == 1
        f.send("n", BlockRemoved([2], "CPU"))
        assert f.index.resident("n", KEYS[1], CPU) == 0


class TestMedia:
    @pytest.mark.parametrize("medium", ["STORAGE", "DISK", "cpu"])
    def test_other_media_are_skipped_and_counted(self, medium: str) -> None:
        f = Feeder()
        f.send("n", gpu([1], None, A[:4]))
        f.send(
            "n",
            BlockStored([1], None, A[:4], BS, None, medium, None),
            BlockRemoved([1], medium),
        )
        st_ = f.index.stats("n")
        assert st_ is not None and st_.other_media == 2
        assert f.tiers() == (1, 0)

    def test_no_medium_is_the_gpu(self) -> None:
        """vLLM before 0.11 reported GPU blocks only, with no medium."""
        f = Feeder()
        f.send("n", BlockStored([1], None, A[:4], BS, None, None, None))
        assert f.tiers() == (1, 0)


# Clear, restart, gap and replay per tier: what each does to each tier.
CASES = [
    # (what, events after the setup, GPU blocks, host blocks, cleared)
    ("AllBlocksCleared", [AllBlocksCleared()], 0, 0, True),
    ("GPU eviction", [BlockRemoved([1, 2, 3, 4], "GPU")], 0, 4, False),
    ("host eviction", [BlockRemoved([1, 2, 3, 4], "CPU")], 4, 0, False),
    (
        "clear, then the host re-announced",
        [AllBlocksCleared(), cpu_full([1], None, A[:4])],
        0,
        1,
        True,
    ),
]


class TestClearsPerTier:
    @pytest.mark.parametrize(("what", "events", "gpu_blocks", "host_blocks", "cleared"), CASES)
    def test_events_after_a_tiered_setup(
        self, what: str, events: list[KVEvent], gpu_blocks: int, host_blocks: int, cleared: bool
    ) -> None:
        """AllBlocksCleared drops both tiers: vLLM emits it from the GPU pool only
        (block_pool.py:827-866), and with reset_connector the host tier is emptied with no
        event at all (cpumgr reset_cache, manager.py:429-441), so the index cannot tell the
        two resets apart and keeps nothing it may no longer hold."""
        f = Feeder()
        f.index.register("s", KEYS, BS, 0.0)
        f.send("n", gpu([1, 2, 3, 4], None, A), *(cpu(h) for h in (1, 2, 3, 4)))
        f.index.drain()
        f.send("n", *events, t=5.0)
        assert f.tiers() == (gpu_blocks, host_blocks), what
        assert (f.index.take_cleared() == ["n"]) is cleared
        out = {(r.session, r.node): (r.tokens, r.host_tokens) for r in f.index.drain()}
        assert out == {("s", "n"): (gpu_blocks * BS, host_blocks * BS)}

    @pytest.mark.parametrize("how", ["seq backwards", "clear(restart=True)"])
    def test_a_restart_drops_both_tiers(self, how: str) -> None:
        """A restarted engine has an empty GPU pool and an empty host tier."""
        idx = KvIndex()
        idx.apply("n", 5, KVEventBatch(ts=1.0, events=[gpu([1], None, A[:4]), cpu(1)]), 1.0)
        if how == "seq backwards":
            res = idx.apply("n", 0, KVEventBatch(ts=2.0, events=[]), 2.0)
            assert res.cleared
        else:
            idx.clear("n", 2.0, restart=True)
        assert (idx.walk("n", KEYS, GPU), idx.walk("n", KEYS, CPU)) == (0, 0)
        assert idx.stats("n").incarnation == 1  # type: ignore[union-attr]

    def test_a_replayed_stream_rebuilds_both_tiers(self) -> None:
        """A fresh index fed the same batches (a restarted telemetry's catch-up replay) holds
        the same residency in both tiers; a gap is applied as any batch is."""
        batches = [
            [gpu([1, 2, 3, 4], None, A), cpu(1), cpu(2)],
            [BlockRemoved([3, 4], "GPU"), cpu(3)],
            [cpu(4), BlockRemoved([1], "GPU")],
        ]
        first, again = KvIndex(), KvIndex()
        for seq, events in enumerate(batches):
            first.apply("n", seq, KVEventBatch(ts=1.0, events=events), 1.0)
        again.register("s", KEYS, BS, 0.0)
        for seq, events in enumerate(batches):
            again.apply("n", seq * 2, KVEventBatch(ts=1.0, events=events), 1.0)  # gaps
        for idx in (first, again):
            assert (idx.walk("n", KEYS, GPU), idx.walk("n", KEYS, CPU)) == (0, 4)
        assert again.tiers("s") == {"n": {CPU: 16}}


class TestSessionsPerTier:
    def test_a_session_holds_a_run_in_each_tier(self) -> None:
        """The leading run of the chain resident in each tier, drained together per pair."""
        f = Feeder()
        f.index.register("s", KEYS, BS, 0.0)
        f.send("n", gpu([1, 2, 3], None, A[:12]), cpu(1), cpu(2), t=2.0)
        assert [(r.tokens, r.host_tokens, r.stamp) for r in f.index.drain()] == [(12, 8, 2.0)]
        assert f.index.prefix_tokens("s", "n", CPU) == 8
        f.send("n", BlockRemoved([1, 2, 3], "GPU"), t=3.0)
        assert [(r.tokens, r.host_tokens) for r in f.index.drain()] == [(0, 8)]
        assert f.index.tiers("s") == {"n": {CPU: 8}}

    def test_registering_over_host_blocks_finds_the_host_run(self) -> None:
        f = Feeder()
        f.send("n", gpu([1, 2], None, A[:8]), cpu(1), cpu(2))
        f.send("n", BlockRemoved([1, 2], "GPU"))
        f.index.register("s", KEYS, BS, 7.0)
        assert [(r.tokens, r.host_tokens, r.stamp) for r in f.index.drain()] == [(0, 8, 7.0)]

    def test_forget_drops_the_host_run_too(self) -> None:
        f = Feeder()
        f.index.register("s", KEYS, BS, 0.0)
        f.send("n", gpu([1], None, A[:4]), cpu(1))
        f.index.forget("s")
        assert f.index.tiers("s") == {} and f.index.drain() == []
        host = f.index._nodes["n"].host
        assert host is not None and host.held == {} and host.want == {}


# --- property: per-tier prefixes equal a brute-force walk, refs equal a model ------------------

NODES = ("n0", "n1")
DOCS = [A, A[:8] + list(range(200, 208)), list(range(400, 416))]
PREFIX_IDS: dict[tuple[int, ...], int] = {}


def engine_hash(doc: int, block: int) -> int:
    prefix = tuple(DOCS[doc][: (block + 1) * BS])
    return PREFIX_IDS.setdefault(prefix, len(PREFIX_IDS) + 1)


op_st = st.one_of(
    st.tuples(
        st.sampled_from(["gpu", "gpu_rm", "cpu", "cpu_rm"]),
        st.sampled_from(NODES),
        st.integers(0, 2),
        st.integers(0, 3),
    ),
    st.tuples(st.just("clear"), st.sampled_from(NODES), st.just(0), st.just(0)),
    st.tuples(
        st.just("register"), st.sampled_from(("s0", "s1")), st.integers(0, 2), st.integers(0, 4)
    ),
    st.tuples(st.just("forget"), st.sampled_from(("s0", "s1")), st.just(0), st.just(0)),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(op_st, max_size=60))
@example([("gpu", "n0", 0, 0), ("gpu_rm", "n0", 0, 0), ("cpu", "n0", 0, 0)])  # not yet tiered
@example([("cpu", "n0", 2, 0), ("gpu", "n0", 0, 0), ("gpu_rm", "n0", 0, 0), ("cpu", "n0", 0, 0)])
def test_per_tier_prefixes_equal_a_brute_force_walk(ops: list[tuple[str, str, int, int]]) -> None:
    """After any sequence of GPU and host stores (placeholders) and removals, clears and
    (re)registrations: per node and tier, the counts equal a model multiset (a host store of
    a hash nothing names waits, as the index holds it; a node remembers removed GPU hashes
    from its first host event on) and each session's run equals a walk of its chain."""
    idx = KvIndex()
    seq = dict.fromkeys(NODES, -1)
    own = {
        engine_hash(d, j): k
        for d, doc in enumerate(DOCS)
        for j, k in enumerate(chain_keys(doc, BS))
    }
    gpu_m = {n: Counter[int]() for n in NODES}
    host_m = {n: Counter[int]() for n in NODES}
    waiting = {n: Counter[int]() for n in NODES}
    gone = {n: set[int]() for n in NODES}  # GPU hashes removed while the node had a host tier
    tiered = dict.fromkeys(NODES, False)  # a host event was seen (the index keeps a host tier)
    chains: dict[str, list[int]] = {}

    def named(node: str, h: int) -> bool:
        return gpu_m[node][h] > 0 or host_m[node][h] > 0 or h in gone[node]

    for op, who, a, b in ops:
        events: list[KVEvent] = []
        if op == "register":
            chains[who] = chain_keys(DOCS[a][: b * BS], BS)
            idx.register(who, chains[who], BS, 0.0)
            continue
        if op == "forget":
            chains.pop(who, None)
            idx.forget(who)
            continue
        node, h = who, engine_hash(a, b)
        if op == "gpu":
            parent = None if b == 0 else engine_hash(a, b - 1)
            if parent is not None and gpu_m[node][parent] == 0:
                continue  # keep the model free of orphans
            events.append(gpu([h], parent, DOCS[a][b * BS : (b + 1) * BS]))
            gpu_m[node][h] += 1
            host_m[node][h] += waiting[node].pop(h, 0)
        elif op == "gpu_rm":
            events.append(BlockRemoved([h], "GPU"))
            if gpu_m[node][h]:
                gpu_m[node][h] -= 1
                if gpu_m[node][h] == 0 and tiered[node]:
                    gone[node].add(h)
        elif op == "cpu":
            events.append(cpu(h))
            tiered[node] = True
            if named(node, h):
                host_m[node][h] += 1
            else:
                waiting[node][h] += 1
        elif op == "cpu_rm":
            events.append(BlockRemoved([h], "CPU"))
            tiered[node] = True
            if host_m[node][h]:
                host_m[node][h] -= 1
            elif waiting[node][h]:
                waiting[node][h] -= 1
        else:
            events.append(AllBlocksCleared())
            for m in (gpu_m, host_m, waiting):
                m[node].clear()
            gone[node].clear()
        seq[node] += 1
        idx.apply(node, seq[node], KVEventBatch(ts=0.0, events=events), 0.0)
        for n in NODES:
            for tier, model in ((GPU, gpu_m[n]), (CPU, host_m[n])):
                resident = {own[x] for x, c in model.items() if c > 0}
                for x, c in model.items():
                    assert idx.resident(n, own[x], tier) == c
                for sid, keys in chains.items():
                    brute = 0
                    while brute < len(keys) and keys[brute] in resident:
                        brute += 1
                    assert idx.prefix_blocks(sid, n, tier) == brute == idx.walk(n, keys, tier)
            st_ = idx.stats(n)
            assert (0 if st_ is None else st_.host_unresolved) == sum(waiting[n].values())
