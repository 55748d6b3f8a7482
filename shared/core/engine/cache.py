"""Block pool with automatic prefix caching, after vLLM v1's KV cache manager.

Semantics (vLLM ``v1/core/block_pool.py`` and ``kv_cache_manager.py``, described in
https://docs.vllm.ai/en/latest/design/prefix_caching.html):

* KV memory is ``num_blocks`` blocks of ``block_size`` tokens. A *full* block is keyed by a chain
  hash of (parent block hash, its token ids); partial blocks are never cached.
* Blocks are ref-counted by the requests using them. A block whose count drops to 0 goes to the
  *tail* of an LRU free queue and stays cached (findable by hash) until it is re-allocated.
* Allocation pops from the *head* of the free queue; popping a cached block evicts it (its hash
  is removed and a ``BlockRemoved`` event is emitted).
* A request's blocks are freed in reverse order, so that the tail of a sequence is evicted
  before its head (vLLM ``free_blocks(reversed(...))``).
* A hit on a free cached block takes it out of the free queue ("touch") and ref-counts it.

Hashes are Python ``hash`` of a tuple of ints, masked to 64 bits: ints and tuples of ints hash
the same in every process (only ``str``/``bytes`` hashing is salted by PYTHONHASHSEED), so the
hashes are deterministic. An identical block computed twice is cached once (vLLM may keep
duplicates; the first one wins here, the second stays uncached and is freed as a plain block).

Invariants (checked by :meth:`BlockPool.check`): every block is either in the free queue with
ref 0 or out of it with ref > 0; the hash map and the blocks' hashes agree.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import islice, takewhile
from operator import is_not
from typing import Final, cast

from shared.contracts.kv import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent

__all__ = ["ROOT_HASH", "BlockPool", "chain_hash"]

ROOT_HASH: Final = 0x9E37_79B9_7F4A_7C15
"""The parent hash of a sequence's first block."""

_MASK64: Final = (1 << 64) - 1

_NOT_NONE: Final = partial(is_not, None)

_MAX_HOLES: Final = 8192
"""Deletions from the free queue between compactions (bounds the head search's hole skipping)."""

_LOG_KEEP: Final = 1 << 16
"""Evicted hashes the pool keeps for :meth:`BlockPool.evicted_since` (trimmed past twice this)."""


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """The 64-bit hash of a full block with these ``tokens`` after the block hashed ``parent``."""
    return hash((parent, *tokens)) & _MASK64


class BlockPool:
    """Fixed pool of KV blocks: ref counts, the hash → block map and the LRU free queue."""

    __slots__ = (
        "_cached",
        "_emit",
        "_events",
        "_evict_log",
        "_free",
        "_hash",
        "_holes",
        "_log_base",
        "_ref",
        "block_size",
        "evicted",
        "generation",
        "num_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int, *, emit_kv_events: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks: must be >= 1, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: dict[int, None] = dict.fromkeys(range(num_blocks))
        """The LRU free queue (a dict keeps insertion order): head = next evicted."""
        self._holes = 0
        """Deletions from ``_free`` since it was last compacted: a dict leaves a hole per deleted
        entry, and finding its head skips the holes before it (see :meth:`allocate`)."""
        self._cached: dict[int, int] = {}
        self._emit = emit_kv_events
        self._events: list[KVEvent] = []
        self.evicted = 0
        """Blocks un-cached so far (monotone): a hash leaves the map only through eviction."""
        self._evict_log: list[int] = []
        self._log_base = 0
        self.generation = 0
        """Bumped by every mutation (touch, allocate, release, cache): equal generations mean
        an identical pool (callers cache derived answers on it)."""

    # -- queries ---------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks with ref count 0 (free, possibly still cached)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks findable by hash (in use or free)."""
        return len(self._cached)

    def lookup(self, block_hash: int) -> int | None:
        """The block id cached under ``block_hash``, or ``None``."""
        return self._cached.get(block_hash)

    def ref(self, block: int) -> int:
        """The ref count of ``block``."""
        return self._ref[block]

    def count_free(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` have ref count 0."""
        return list(map(self._ref.__getitem__, blocks)).count(0)

    def free_order(self) -> list[int]:
        """Free block ids from LRU head (next evicted) to tail."""
        return list(self._free)

    def longest_hit(
        self, hashes: Sequence[int], limit: int, known: list[int] | None = None
    ) -> list[int]:
        """Block ids of the longest cached run of ``hashes[:limit]`` from the start. ``known``:
        an earlier answer for the same hashes with nothing evicted since (a hash leaves the
        map, and its block changes, only by eviction), so still valid; the walk resumes after
        it."""
        stop = min(limit, len(hashes))
        start = 0 if known is None else min(len(known), stop)
        # C-level walk: block ids of hashes[start:stop] up to the first one not cached
        # (block ids are ints >= 0, so "not None" is the test, not truthiness).
        walk = takewhile(_NOT_NONE, map(self._cached.get, islice(hashes, start, stop)))
        run = cast("list[int]", list(walk))
        if known is None:
            return run
        return known[:start] + run

    def evicted_since(self, mark: int) -> list[int] | None:
        """Hashes un-cached since :attr:`evicted` was ``mark``, oldest first; ``None`` when the
        log no longer reaches back that far (it keeps the last ``_LOG_KEEP`` or more)."""
        if mark < self._log_base:
            return None
        return self._evict_log[mark - self._log_base :]

    def resident_run(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """Smallest ``j`` in ``[start, stop]`` with ``hashes[j]`` not cached (``stop`` if all
        are): with ``hashes[:start]`` known cached, the length of the cached run."""
        cached = self._cached
        j = start
        while j < stop and hashes[j] in cached:
            j += 1
        return j

    # -- mutations -------------------------------------------------------------------------------

    def touch(self, blocks: Iterable[int]) -> None:
        """Take hit ``blocks`` into use: ref++ and out of the free queue when they were free."""
        self.generation += 1
        ref = self._ref
        free = self._free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
                self._holes += 1
            ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the free-queue head (evicting cached ones); caller checks room."""
        free = self._free
        if n > len(free):
            raise ValueError(f"cannot allocate {n} blocks, {len(free)} free")
        self.generation += 1
        self._holes += n
        if self._holes > _MAX_HOLES:  # compact: a copy re-inserts the entries without holes
            self._free = free = dict(free)
            self._holes = n
        if n == 1:  # the decode path: one block at a time
            b = next(iter(free))
            del free[b]
            self._ref[b] = 1
            h = self._hash[b]
            if h is None:
                return [b]
            self._hash[b] = None
            del self._cached[h]
            self._log_evicted([h])
            return [b]
        out = list(islice(free, n))
        ref = self._ref
        hashes = self._hash
        cached = self._cached
        deque(map(free.__delitem__, out), maxlen=0)  # C-level loop: pop them off the head
        gone = [h for h in map(hashes.__getitem__, out) if h is not None]
        for b in out:
            ref[b] = 1
            hashes[b] = None
        if gone:
            deque(map(cached.__delitem__, gone), maxlen=0)
            self._log_evicted(gone)
        return out

    def _log_evicted(self, gone: list[int]) -> None:
        """Record the un-cached hashes ``gone`` (already out of the hash map)."""
        log = self._evict_log
        log.extend(gone)
        if self._emit:
            self._events.extend(BlockRemoved(block_hashes=[h], medium="GPU") for h in gone)
        self.evicted = self._log_base + len(log)
        if len(log) > 2 * _LOG_KEEP:
            drop = len(log) - _LOG_KEEP
            del log[:drop]
            self._log_base += drop

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of ``blocks``, freeing them tail first."""
        self.generation += 1
        ref = self._ref
        free = self._free
        for b in reversed(blocks):
            c = ref[b] - 1
            ref[b] = c
            if not c:
                free[b] = None

    def cache(self, block: int, block_hash: int, parent: int, tokens: Sequence[int]) -> None:
        """Cache the full, in-use ``block`` under ``block_hash`` (no-op for a duplicate)."""
        self.cache_many([block], [block_hash], 0, 1, parent, tokens)

    def cache_many(
        self,
        blocks: Sequence[int],
        hashes: Sequence[int],
        start: int,
        stop: int,
        parent: int,
        tokens: Sequence[int],
    ) -> None:
        """Cache ``blocks[j]`` under ``hashes[j]`` for ``start <= j < stop``; ``parent`` is the
        hash before ``hashes[start]`` and ``tokens[j*block_size:]`` block ``j``'s tokens."""
        self.generation += 1
        cached = self._cached
        block_hash = self._hash
        if not self._emit:
            if stop - start == 1:  # the decode path: one block at a time
                h = hashes[start]
                b = blocks[start]
                if h not in cached and block_hash[b] is None:
                    cached[h] = b
                    block_hash[b] = h
                return
            for h, b in zip(hashes[start:stop], blocks[start:stop], strict=True):
                if h not in cached and block_hash[b] is None:
                    cached[h] = b
                    block_hash[b] = h
            return
        bs = self.block_size
        for j in range(start, stop):
            h = hashes[j]
            b = blocks[j]
            if h not in cached and block_hash[b] is None:
                cached[h] = b
                block_hash[b] = h
                if self._emit:
                    self._events.append(
                        BlockStored(
                            block_hashes=[h],
                            parent_block_hash=None if parent == ROOT_HASH else parent,
                            token_ids=list(tokens[j * bs : j * bs + bs]),
                            block_size=bs,
                            lora_id=None,
                            medium="GPU",
                        )
                    )
            parent = h

    def reset_cache(self) -> bool:
        """Un-cache every block, as vLLM's ``BlockPool.reset_prefix_cache``: refused (``False``)
        while any block is held by a request; else every hash is dropped, logged as evicted
        (so :meth:`evicted_since` stays exact) and one ``AllBlocksCleared`` is emitted (vLLM
        emits no ``BlockRemoved`` for them)."""
        if len(self._free) != self.num_blocks:
            return False
        self.generation += 1
        gone = list(self._cached)
        self._cached.clear()
        self._hash = [None] * self.num_blocks
        emit, self._emit = self._emit, False
        try:
            self._log_evicted(gone)
        finally:
            self._emit = emit
        if emit:
            self._events.append(AllBlocksCleared())
        return True

    def drain_events(self) -> list[KVEvent]:
        """The KV events since the last drain, oldest first."""
        events, self._events = self._events, []
        return events

    def check(self) -> None:
        """Raise ``AssertionError`` if an invariant is broken (tests and debugging)."""
        free = self._free
        for b in range(self.num_blocks):
            in_free = b in free
            if self._ref[b] < 0 or in_free != (self._ref[b] == 0):
                raise AssertionError(f"block {b}: ref {self._ref[b]}, in free queue {in_free}")
        for h, b in self._cached.items():
            if self._hash[b] != h:
                raise AssertionError(f"hash map says {h} -> {b}, block has {self._hash[b]}")
        if sum(h is not None for h in self._hash) != len(self._cached):
            raise AssertionError("blocks with a hash and the hash map disagree")
