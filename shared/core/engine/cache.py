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

The state lives in numpy arrays and the per-block loops are numba kernels
(:mod:`shared.core.engine.poolkernels`). The engine calls the array methods (``*_arr``,
:meth:`BlockPool.allocate_into`) on its requests' block and hash arrays, with no conversion;
the list methods are the same operations for other callers (tests, tools). Hashes must lie in
``[0, 2**64)`` (what :func:`chain_hash` returns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np

from shared.contracts.kv import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from shared.core.engine import poolkernels as k

__all__ = ["ROOT_HASH", "BlockPool", "HashChain", "chain_hash"]

ROOT_HASH: Final = 0x9E37_79B9_7F4A_7C15
"""The parent hash of a sequence's first block."""

_MASK64: Final = (1 << 64) - 1

_LOG_KEEP: Final = 1 << 16
"""Evicted hashes the pool keeps for :meth:`BlockPool.evicted_since` (trimmed past twice this)."""

_FIRST_CHUNK: Final = 32
"""Hashes converted to an array at first by the list walks (then 4x more each round)."""


def chain_hash(parent: int, tokens: Sequence[int]) -> int:
    """The 64-bit hash of a full block with these ``tokens`` after the block hashed ``parent``."""
    return hash((parent, *tokens)) & _MASK64


class HashChain(list[int]):
    """A chain of block hashes that only grows (:meth:`grow`), with a uint64 copy (``array``,
    its first ``len(self)`` entries) that the pool's walks read without converting the list.
    Its owner appends through :meth:`grow` only; readers treat it as a read-only list."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        super().__init__()
        self.array = np.empty(64, dtype=np.uint64)

    def grow(self, new: list[int]) -> None:
        """Append the hashes ``new`` (each in ``[0, 2**64)``)."""
        n = len(self)
        end = n + len(new)
        if end > len(self.array):
            bigger = np.empty(max(2 * len(self.array), end), dtype=np.uint64)
            bigger[:n] = self.array[:n]
            self.array = bigger
        self.array[n:end] = new
        self.extend(new)


def _i64(blocks: Iterable[int]) -> np.ndarray:
    if isinstance(blocks, np.ndarray) and blocks.dtype == np.int64:
        return blocks
    if not isinstance(blocks, (list, tuple, np.ndarray)):
        blocks = list(blocks)
    return np.asarray(blocks, dtype=np.int64)


def _u64(hashes: Sequence[int] | np.ndarray) -> np.ndarray:
    """``hashes`` as a uint64 array (a :class:`HashChain`'s own copy, without converting)."""
    if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64:
        return hashes
    if isinstance(hashes, HashChain):
        return hashes.array[: len(hashes)]
    if not isinstance(hashes, (list, tuple, np.ndarray)):
        hashes = list(hashes)
    return np.asarray(hashes, dtype=np.uint64)


class BlockPool:
    """Fixed pool of KV blocks: ref counts, the hash → block map and the LRU free queue."""

    __slots__ = (
        "_bh",
        "_counter",
        "_emit",
        "_events",
        "_evict_log",
        "_gone",
        "_log_base",
        "_ncached",
        "_new",
        "_nfree",
        "_npending",
        "_nxt",
        "_pending",
        "_prv",
        "_ref",
        "_seq",
        "_tk",
        "_tv",
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
        n = num_blocks
        self._ref = np.zeros(n, dtype=np.int64)
        # The free queue: all blocks in id order, linked through the sentinel n.
        self._nxt = np.arange(1, n + 2, dtype=np.int64)
        self._nxt[n] = 0
        self._prv = np.arange(-1, n, dtype=np.int64)
        self._prv[0] = n
        self._seq = np.zeros(n, dtype=np.int64)
        self._bh = np.zeros(n, dtype=np.uint64)
        cap = 1 << max(4, (4 * n - 1).bit_length())
        self._tk = np.zeros(cap, dtype=np.uint64)
        self._tv = np.full(cap, -1, dtype=np.int64)
        self._counter = np.zeros(1, dtype=np.int64)
        self._gone = np.zeros(n, dtype=np.uint64)
        self._new = np.zeros(n, dtype=np.int64)
        self._nfree = n
        self._ncached = 0
        self._emit = emit_kv_events
        self._events: list[KVEvent] = []
        self.evicted = 0
        """Blocks un-cached so far (monotone): a hash leaves the map only through eviction."""
        self._evict_log: list[int] = []
        """Evicted hashes from number ``_log_base`` on, oldest first, then ``_pending``."""
        self._log_base = 0
        self._pending: list[np.ndarray] = []
        """Evictions not yet converted to ints for the log (done when someone asks)."""
        self._npending = 0
        self.generation = 0
        """Bumped by every mutation (touch, allocate, release, cache): equal generations mean
        an identical pool (callers cache derived answers on it)."""

    # -- queries ---------------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks with ref count 0 (free, possibly still cached)."""
        return self._nfree

    @property
    def num_cached(self) -> int:
        """Blocks findable by hash (in use or free)."""
        return self._ncached

    def lookup(self, block_hash: int) -> int | None:
        """The block id cached under ``block_hash``, or ``None``."""
        if not 0 <= block_hash <= _MASK64:
            return None
        b = int(k.t_find(self._tk, self._tv, np.uint64(block_hash)))
        return None if b < 0 else b

    def ref(self, block: int) -> int:
        """The ref count of ``block``."""
        return int(self._ref[block])

    def count_free(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` have ref count 0."""
        arr = _i64(blocks)
        return self.count_free_arr(arr, len(arr))

    def count_free_arr(self, blocks: np.ndarray, n: int) -> int:
        """How many of ``blocks[:n]`` (int64) have ref count 0."""
        return int(k.k_count_free(self._ref, blocks, n))

    def free_order(self) -> list[int]:
        """Free block ids from LRU head (next evicted) to tail."""
        out = np.empty(self.num_blocks, dtype=np.int64)
        n = k.k_free_order(self._nxt, out)
        order: list[int] = out[:n].tolist()
        return order

    def longest_hit(
        self, hashes: Sequence[int], limit: int, known: list[int] | None = None
    ) -> list[int]:
        """Block ids of the longest cached run of ``hashes[:limit]`` from the start. ``known``:
        an earlier answer for the same hashes with nothing evicted since (a hash leaves the
        map, and its block changes, only by eviction), so still valid; the walk resumes after
        it."""
        stop = min(limit, len(hashes))
        start = 0 if known is None else min(len(known), stop)
        out = np.empty(max(stop, 0), dtype=np.int64)
        if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64:
            end = int(k.k_hit(self._tk, self._tv, hashes, start, stop, out))
        else:
            end = self._walk(hashes, start, stop, out)
        run: list[int] = out[start:end].tolist()
        if known is None:
            return run
        return known[:start] + run

    def hit_arr(self, hashes: np.ndarray, start: int, stop: int, out: np.ndarray) -> int:
        """Walk the uint64 ``hashes[start:stop]`` while cached, writing each block id to
        ``out[j]`` (int64); returns the first ``j`` not cached (``stop`` if all are)."""
        return int(k.k_hit(self._tk, self._tv, hashes, start, stop, out))

    def _walk(
        self, hashes: Sequence[int] | np.ndarray, start: int, stop: int, out: np.ndarray | None
    ) -> int:
        """:meth:`hit_arr` (``out`` given) or :meth:`resident_run` on a list of hashes, converted
        in growing chunks (the walk usually stops early)."""
        j = start
        step = _FIRST_CHUNK
        while j < stop:
            e = min(stop, j + step)
            arr = _u64(hashes[j:e])
            if out is None:
                got = int(k.k_run(self._tk, self._tv, arr, 0, e - j))
            else:
                got = int(k.k_hit(self._tk, self._tv, arr, 0, e - j, out[j:e]))
            j += got
            if j < e:
                break
            step *= 4
        return j

    def evicted_since(self, mark: int) -> list[int] | None:
        """Hashes un-cached since :attr:`evicted` was ``mark``, oldest first; ``None`` when the
        log no longer reaches back that far (it keeps the last ``_LOG_KEEP`` or more)."""
        self._flush_log()
        if mark < self._log_base:
            return None
        return self._evict_log[mark - self._log_base :]

    def resident_run(self, hashes: Sequence[int] | np.ndarray, start: int, stop: int) -> int:
        """Smallest ``j`` in ``[start, stop]`` with ``hashes[j]`` not cached (``stop`` if all
        are): with ``hashes[:start]`` known cached, the length of the cached run."""
        if start >= stop:
            return start
        if isinstance(hashes, HashChain) and stop <= len(hashes):
            return int(k.k_run(self._tk, self._tv, hashes.array, start, stop))
        if isinstance(hashes, np.ndarray) and hashes.dtype == np.uint64:
            return int(k.k_run(self._tk, self._tv, hashes, start, stop))
        return self._walk(hashes, start, stop, None)

    # -- mutations -------------------------------------------------------------------------------

    def touch(self, blocks: Iterable[int]) -> None:
        """Take hit ``blocks`` into use: ref++ and out of the free queue when they were free."""
        arr = _i64(blocks)
        self.touch_arr(arr, len(arr))

    def touch_arr(self, blocks: np.ndarray, n: int) -> None:
        """:meth:`touch` on ``blocks[:n]`` (int64)."""
        self.generation += 1
        self._nfree -= int(k.k_touch(self._ref, self._nxt, self._prv, blocks, n))

    def allocate(self, n: int) -> list[int]:
        """Pop ``n`` blocks from the free-queue head (evicting cached ones); caller checks room."""
        out = np.empty(max(n, 0), dtype=np.int64)
        self.allocate_into(out, 0, n)
        blocks: list[int] = out.tolist()
        return blocks

    def allocate_into(self, out: np.ndarray, pos: int, n: int) -> None:
        """:meth:`allocate` writing the ``n`` block ids to ``out[pos:pos+n]`` (int64)."""
        if n > self._nfree:
            raise ValueError(f"cannot allocate {n} blocks, {self._nfree} free")
        self.generation += 1
        if n <= 0:
            return
        ng = int(
            k.k_allocate(
                self._ref,
                self._nxt,
                self._prv,
                self._seq,
                self._bh,
                self._tk,
                self._tv,
                out,
                pos,
                n,
                self._gone,
            )
        )
        self._nfree -= n
        if not ng:
            return
        self._ncached -= ng
        if self._emit:
            self._log_evicted(self._gone[:ng].tolist())
            return
        # Without events nobody may ask for these: keep them as arrays until someone does.
        self._pending.append(self._gone[:ng].copy())
        self._npending += ng
        self.evicted += ng
        if self._npending > 2 * _LOG_KEEP:  # keep the newest _LOG_KEEP, as the log's trim
            arr = np.concatenate(self._pending)[-_LOG_KEEP:]
            self._log_base = self.evicted - _LOG_KEEP
            self._evict_log = []
            self._pending = [arr]
            self._npending = _LOG_KEEP

    def _flush_log(self) -> None:
        """Move the pending evictions to the log (as ints)."""
        if not self._pending:
            return
        pending = self._pending
        arr = pending[0] if len(pending) == 1 else np.concatenate(pending)
        self._pending = []
        self._npending = 0
        self._log_evicted(arr.tolist())

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
        arr = _i64(blocks)
        self.release_arr(arr, len(arr))

    def release_arr(self, blocks: np.ndarray, n: int) -> None:
        """:meth:`release` of ``blocks[:n]`` (int64)."""
        self.generation += 1
        self._nfree += int(k.k_release(self._ref, self._nxt, self._prv, blocks, n))

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
        self.cache_arr(_i64(blocks), _u64(hashes), start, stop, parent, tokens)

    def cache_arr(
        self,
        blocks: np.ndarray,
        hashes: np.ndarray,
        start: int,
        stop: int,
        parent: int,
        tokens: Sequence[int],
    ) -> None:
        """:meth:`cache_many` on ``blocks`` (int64) and ``hashes`` (uint64) arrays."""
        self.generation += 1
        if stop <= start:
            return
        new = self._new
        if stop - start > len(new):
            new = np.empty(stop - start, dtype=np.int64)
        got = int(
            k.k_cache(
                self._seq,
                self._bh,
                self._tk,
                self._tv,
                self._counter,
                blocks,
                hashes,
                start,
                stop,
                new,
            )
        )
        self._ncached += got
        if not (self._emit and got):
            return
        bs = self.block_size
        for j in new[:got].tolist():
            p = parent if j == start else int(hashes[j - 1])
            self._events.append(
                BlockStored(
                    block_hashes=[int(hashes[j])],
                    parent_block_hash=None if p == ROOT_HASH else p,
                    token_ids=list(tokens[j * bs : j * bs + bs]),
                    block_size=bs,
                    lora_id=None,
                    medium="GPU",
                )
            )

    def reset_cache(self) -> bool:
        """Un-cache every block, as vLLM's ``BlockPool.reset_prefix_cache``: refused (``False``)
        while any block is held by a request; else every hash is dropped, logged as evicted
        in the order they were cached (so :meth:`evicted_since` stays exact) and one
        ``AllBlocksCleared`` is emitted (vLLM emits no ``BlockRemoved`` for them)."""
        if self._nfree != self.num_blocks:
            return False
        self.generation += 1
        self._flush_log()
        seq = self._seq
        held = np.flatnonzero(seq)
        order = held[np.argsort(seq[held], kind="stable")]
        gone: list[int] = self._bh[order].tolist()
        seq[:] = 0
        self._tv[:] = -1
        self._ncached = 0
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
        order = self.free_order()
        free = set(order)
        if len(free) != len(order) or len(order) != self._nfree:
            raise AssertionError(f"free queue: {len(order)} linked, {self._nfree} counted")
        ref = self._ref.tolist()
        for b in range(self.num_blocks):
            in_free = b in free
            if ref[b] < 0 or in_free != (ref[b] == 0):
                raise AssertionError(f"block {b}: ref {ref[b]}, in free queue {in_free}")
        used = np.flatnonzero(self._tv >= 0)
        for i in used.tolist():
            h, b = int(self._tk[i]), int(self._tv[i])
            if self._seq[b] == 0 or int(self._bh[b]) != h:
                raise AssertionError(f"hash map says {h} -> {b}, block has {int(self._bh[b])}")
            if self.lookup(h) != b:
                raise AssertionError(f"hash {h} not findable from its slot")
        if int(np.count_nonzero(self._seq)) != len(used) or len(used) != self._ncached:
            raise AssertionError("blocks with a hash and the hash map disagree")
