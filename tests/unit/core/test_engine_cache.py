"""Block pool: ref counts, the LRU free queue, caching and eviction (vLLM v1 semantics)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.kv import BlockRemoved, BlockStored
from shared.core.engine import ROOT_HASH, BlockPool, chain_hash


def _toks(start: int) -> list[int]:
    return list(range(start, start + 4))


class TestChainHash:
    """Block hashes chain on the parent and are stable values."""

    def test_parent_matters(self) -> None:
        """The same tokens after different parents hash differently."""
        assert chain_hash(ROOT_HASH, _toks(0)) != chain_hash(1, _toks(0))

    def test_deterministic_64_bit(self) -> None:
        """A hash is a non-negative 64-bit int and equal for equal input."""
        h = chain_hash(ROOT_HASH, _toks(7))
        assert h == chain_hash(ROOT_HASH, _toks(7))
        assert 0 <= h < 2**64


class TestBlockPool:
    """Allocation, release, touch and caching keep the pool consistent."""

    def test_allocate_pops_lru_head(self) -> None:
        """A fresh pool hands out blocks in id order and tracks free + used = total."""
        pool = BlockPool(4, 4)
        assert pool.allocate(2) == [0, 1]
        assert pool.num_free == 2
        assert pool.ref(0) == 1 and pool.ref(2) == 0
        pool.check()

    def test_release_appends_reversed(self) -> None:
        """Released blocks join the free tail last block first, so a sequence's tail goes first."""
        pool = BlockPool(4, 4)
        blocks = pool.allocate(4)
        pool.release(blocks)
        assert pool.free_order() == [3, 2, 1, 0]
        pool.check()

    def test_cached_block_survives_free_until_reallocated(self) -> None:
        """A freed cached block stays findable until allocation evicts it from the LRU head."""
        pool = BlockPool(2, 4, emit_kv_events=True)
        a, b = pool.allocate(2)
        ha = chain_hash(ROOT_HASH, _toks(0))
        pool.cache(a, ha, ROOT_HASH, _toks(0))
        pool.release([a])
        assert pool.lookup(ha) == a
        pool.release([b])
        assert pool.free_order() == [a, b]
        pool.allocate(1)
        assert pool.lookup(ha) is None
        events = pool.drain_events()
        assert [type(e) for e in events] == [BlockStored, BlockRemoved]
        stored = events[0]
        assert isinstance(stored, BlockStored)
        assert stored.block_hashes == [ha] and stored.parent_block_hash is None
        assert stored.token_ids == _toks(0) and stored.block_size == 4
        assert pool.drain_events() == []
        pool.check()

    def test_touch_takes_free_block_back(self) -> None:
        """Touching a free cached block removes it from the free queue and ref-counts it."""
        pool = BlockPool(3, 4)
        (a,) = pool.allocate(1)
        pool.cache(a, 11, ROOT_HASH, _toks(0))
        pool.release([a])
        pool.touch([a])
        assert pool.ref(a) == 1 and a not in pool.free_order()
        pool.touch([a])
        assert pool.ref(a) == 2
        pool.release([a])
        assert pool.ref(a) == 1 and pool.num_free == 2
        pool.check()

    def test_duplicate_hash_cached_once(self) -> None:
        """A second block with an already cached hash stays uncached."""
        pool = BlockPool(2, 4)
        a, b = pool.allocate(2)
        pool.cache(a, 5, ROOT_HASH, _toks(0))
        pool.cache(b, 5, ROOT_HASH, _toks(0))
        assert pool.lookup(5) == a and pool.num_cached == 1
        pool.check()

    def test_over_allocation_rejected(self) -> None:
        """Asking for more blocks than are free raises instead of going negative."""
        pool = BlockPool(2, 4)
        pool.allocate(2)
        with pytest.raises(ValueError, match="cannot allocate"):
            pool.allocate(1)

    def test_longest_hit_stops_at_first_miss(self) -> None:
        """Only the leading run of cached hashes counts as a hit."""
        pool = BlockPool(3, 4)
        a, _b, c = pool.allocate(3)
        pool.cache(a, 1, ROOT_HASH, _toks(0))
        pool.cache(c, 3, 2, _toks(8))
        assert pool.longest_hit([1, 2, 3], 3) == [a]
        assert pool.longest_hit([1, 2, 3], 0) == []

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from("arc"), st.integers(0, 5)), max_size=60))
    def test_random_ops_keep_invariants(self, ops: list[tuple[str, int]]) -> None:
        """Any sequence of allocate/release/cache keeps free + used = total and refs >= 0."""
        pool = BlockPool(6, 4)
        held: list[int] = []
        for op, x in ops:
            if op == "a" and x <= pool.num_free:
                held.extend(pool.allocate(x))
            elif op == "r" and held:
                pool.release([held.pop(x % len(held))])
            elif op == "c" and held:
                pool.cache(held[x % len(held)], 100 + x, ROOT_HASH, _toks(x))
            pool.check()
            used = sum(1 for b in range(6) if pool.ref(b) > 0)
            assert used + pool.num_free == 6


class _RefPool:
    """The obvious pure-Python pool (what :class:`BlockPool` was before its arrays and
    kernels): ref list, insertion-ordered dict as the LRU free queue, hash dict."""

    def __init__(self, n: int) -> None:
        self.ref = [0] * n
        self.hash: list[int | None] = [None] * n
        self.free: dict[int, None] = dict.fromkeys(range(n))
        self.cached: dict[int, int] = {}
        self.log: list[int] = []
        self.removed: list[int] = []  # evicted by allocation (BlockRemoved events)

    def allocate(self, n: int) -> list[int]:
        out = list(self.free)[:n]
        for b in out:
            del self.free[b]
            self.ref[b] = 1
            h = self.hash[b]
            if h is not None:
                del self.cached[h]
                self.log.append(h)
                self.removed.append(h)
                self.hash[b] = None
        return out

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def cache_many(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        for j in range(start, stop):
            h, b = hashes[j], blocks[j]
            if h not in self.cached and self.hash[b] is None:
                self.cached[h] = b
                self.hash[b] = h

    def longest_hit(self, hashes: list[int], limit: int) -> list[int]:
        out: list[int] = []
        for h in hashes[:limit]:
            if h not in self.cached:
                break
            out.append(self.cached[h])
        return out

    def reset(self) -> bool:
        if len(self.free) != len(self.ref):
            return False
        self.log.extend(self.cached)
        self.cached.clear()
        self.hash = [None] * len(self.ref)
        return True


class TestAgainstReference:
    """The array/kernel pool does exactly what the plain-Python one does, op by op: same blocks
    handed out, free order, ref counts, hits, evictions (and their order) and KV events."""

    @settings(max_examples=200, deadline=None)
    @given(
        st.integers(1, 24),
        st.sampled_from([4, 40, 2**64]),
        st.lists(st.tuples(st.sampled_from("aarrcchtzl"), st.integers(0, 2**32)), max_size=80),
    )
    def test_same_as_reference(self, n: int, hspace: int, ops: list[tuple[str, int]]) -> None:
        """Random allocate/release/cache/hit+touch/reset/lookup sequences, hash collisions
        included (a small hash space), on both pools."""
        pool = BlockPool(n, 4, emit_kv_events=True)
        ref = _RefPool(n)
        held: list[list[int]] = []
        for op, x in ops:
            if op == "a":
                k = x % (ref.ref.count(0) + 1)
                got = pool.allocate(k)
                assert got == ref.allocate(k)
                held.append(got)
            elif op == "r" and held:
                blocks = held.pop(x % len(held))
                pool.release(blocks)
                ref.release(blocks)
            elif op == "c" and held and held[x % len(held)]:
                blocks = held[x % len(held)]
                hashes = [(x * 7919 + 104729 * j) % hspace for j in range(len(blocks))]
                start = x % len(blocks)
                toks = list(range(4 * len(blocks)))
                pool.cache_many(blocks, hashes, start, len(blocks), ROOT_HASH, toks)
                ref.cache_many(blocks, hashes, start, len(blocks))
            elif op in "ht":
                hashes = [(x * 31 + 104729 * j) % hspace for j in range(x % 9)]
                hit = pool.longest_hit(hashes, x % 10)
                assert hit == ref.longest_hit(hashes, x % 10)
                assert pool.count_free(hit) == [ref.ref[b] for b in hit].count(0)
                assert pool.resident_run(hashes, 0, len(hashes)) == len(
                    ref.longest_hit(hashes, len(hashes))
                )
                if op == "t" and hit:
                    pool.touch(hit)
                    ref.touch(hit)
                    held.append(hit)
            elif op == "z":
                assert pool.reset_cache() == ref.reset()
            elif op == "l":
                h = x % hspace
                assert pool.lookup(h) == ref.cached.get(h)
            assert pool.free_order() == list(ref.free)
            assert [pool.ref(b) for b in range(n)] == ref.ref
            assert pool.num_cached == len(ref.cached)
            assert pool.evicted == len(ref.log) and pool.evicted_since(0) == ref.log
            pool.check()
        removed = [
            h for ev in pool.drain_events() if isinstance(ev, BlockRemoved) for h in ev.block_hashes
        ]
        assert removed == ref.removed  # a reset logs its hashes but emits AllBlocksCleared
