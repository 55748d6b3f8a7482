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
