"""The host KV tier of one engine: vLLM 0.32's ``OffloadingConnector`` with its CPU backend.

What it does, as vLLM's code does it (citations: docs/kv-tier.md, whose short names and
``file:L@0.32`` form are used here):

* **Write-through stores.** In the step that computes a request's full *prompt* blocks
  (``offload_prompt_only``, default on: ``base:616-622``), each block the host does not already
  hold is queued for a device→host copy (``osched:1846-1885,450-493``; ``cpumgr:262-270``).
  Decode blocks and partial blocks are never stored. A GPU eviction does nothing here.
* **Stores are deferred one step and serialised.** A step's stores start when the next step
  starts (``oworker:259-271``), in one FIFO queue per direction (``gpuworker:255-260,666-670``);
  a stored block is not hittable until its copy completes, and only then is its host
  ``BlockStored`` (medium ``"CPU"``) published (``pbase:36-45``; ``cpumgr:345-353,390-397``).
* **LRU on demand.** Room is made only when a store needs it, by evicting the least recently
  used *ready, unpinned* blocks (``cpumgr:310-334``; ``lru:115-159``); each eviction publishes a
  host ``BlockRemoved``. When too few blocks can be evicted the store is skipped and offered
  again on the request's next step (``osched:1732-1740``). A request's blocks are re-ranked when
  it finishes, in reverse prefix order, so a sequence's tail is evicted before its head
  (``cpumgr:399-426``; ``lru:96-104``).
* **Loads.** A waiting request's host hit is counted from its GPU hit onwards, up to the first
  block the host does not hold ready (``osched:752-858``). A hit of one block or more is always
  an asynchronous load: the request takes its GPU blocks at admission, waits out the
  host→device copy behind the FIFO of earlier loads, and is scheduled from the first step that
  starts after the copy ends (``vsched:1241-1341,3175-3189``; ``oworker:273-308``). The load
  stalls no other request's step. Its blocks are pinned in the host while it runs
  (``cpumgr:211-248``).

Simplifications, each small against a tool call's seconds: a block whose store is still in flight
counts as a miss (vLLM defers the request one pass instead, ``osched:697-699``); the one-step
stall of a preemption with pending stores (``oworker:219-244``) is not charged; events carry
vLLM's default placeholder payload (one hash, no tokens, ``block_size = 0``,
``oevents:337-379``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final

import numpy as np

from shared.contracts.kv import BlockRemoved, BlockStored, KVEvent
from shared.core.engine import hostkernels as k
from shared.core.engine.cache import _u64 as _hashes
from shared.core.tiers import CPU, HostLink

__all__ = ["HostCache"]

_LOG_KEEP: Final = 1 << 16
"""Evicted hashes kept for :meth:`HostCache.evicted_since` (trimmed past twice this)."""


class HostCache:
    """One engine's host tier: its slots of ready/pending/pinned blocks, the hash → slot table,
    the LRU of evictable ones and the two transfer queues, on arrays walked by numba kernels
    (:mod:`.hostkernels`). Pure: every call takes the engine's virtual time."""

    __slots__ = (
        "_d2h_free_at",
        "_emit",
        "_events",
        "_evict_log",
        "_free",
        "_h2d_free_at",
        "_hk",
        "_log_base",
        "_nxt",
        "_pending",
        "_pin",
        "_prv",
        "_st",
        "_tk",
        "_tv",
        "block_size",
        "evicted",
        "generation",
        "link",
        "loaded_blocks",
        "store_failures",
        "stored_blocks",
    )

    def __init__(self, link: HostLink, *, emit_kv_events: bool = False) -> None:
        self.link = link
        self.block_size = link.block_size
        c = link.blocks
        self._hk = np.zeros(c, dtype=np.uint64)
        self._pin = np.full(c, k.FREE, dtype=np.int64)
        """Per slot: ``FREE``, ``PENDING`` (store in flight), 0 ready and evictable (then in
        the LRU), > 0 ready and being loaded (pin count)."""
        self._nxt = np.full(c + 1, c, dtype=np.int64)
        self._prv = np.full(c + 1, c, dtype=np.int64)
        """The LRU of ready, unpinned slots, least recently used first (sentinel ``c``)."""
        self._free = np.arange(c - 1, -1, -1, dtype=np.int64)
        """Empty slots, a stack (slot 0 on top)."""
        self._st = np.array([c, 0], dtype=np.int64)
        """[empty slots, LRU length]."""
        size = 8
        while size < 4 * c:
            size *= 2
        self._tk = np.zeros(size, dtype=np.uint64)
        self._tv = np.full(size, -1, dtype=np.int64)
        self._pending: deque[tuple[float, np.ndarray]] = deque()
        """Store jobs in flight: (completion time, slots), in completion order (one FIFO)."""
        self._d2h_free_at = 0.0
        self._h2d_free_at = 0.0
        self._emit = emit_kv_events
        self._events: list[KVEvent] = []
        self.generation = 0
        """Bumped whenever what a hit walk sees may change (a block turns ready or leaves)."""
        self.evicted = 0
        """Blocks evicted so far (monotone): while it stays the same, a run found ready stays
        ready (blocks leave only by eviction), so a caller may resume a walk where it ended."""
        self._evict_log: list[int] = []
        """Evicted hashes from number ``_log_base`` on, oldest first (:meth:`evicted_since`)."""
        self._log_base = 0
        self.stored_blocks = 0
        self.loaded_blocks = 0
        self.store_failures = 0

    # -- queries ---------------------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """Host capacity in blocks."""
        return self.link.blocks

    @property
    def num_blocks(self) -> int:
        """Blocks held (ready or being stored)."""
        return self.link.blocks - int(self._st[0])

    def holds(self, block_hash: int) -> bool:
        """Whether ``block_hash`` is ready in the host (its store completed)."""
        s = k.t_find(self._tk, self._tv, np.uint64(block_hash))
        return s >= 0 and self._pin[s] >= 0

    def run(self, hashes: np.ndarray | Sequence[int], start: int, stop: int) -> int:
        """Smallest ``j`` in ``[start, stop]`` with ``hashes[j]`` not ready in the host
        (``stop`` if all are)."""
        if start >= stop:
            return start
        arr = _hashes(hashes)
        return int(k.h_run(self._tk, self._tv, self._pin, arr, start, min(stop, len(arr))))

    # -- time ------------------------------------------------------------------------------------

    def complete(self, now: float) -> None:
        """Finish the store jobs whose copy ended by ``now``: their blocks turn ready (most
        recently used) and are announced."""
        pending = self._pending
        if not pending or pending[0][0] > now:
            return
        self.generation += 1
        while pending and pending[0][0] <= now:
            _, slots = pending.popleft()
            out = np.empty(len(slots), dtype=np.uint64)
            n = k.h_complete(self._hk, self._pin, self._nxt, self._prv, self._st, slots, out)
            if self._emit:
                self._events.extend(
                    BlockStored(
                        block_hashes=[h],
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=0,
                        lora_id=None,
                        medium=CPU,
                    )
                    for h in out[:n].tolist()
                )

    def next_completion(self) -> float | None:
        """When the oldest store in flight completes, or ``None``."""
        return self._pending[0][0] if self._pending else None

    # -- stores ----------------------------------------------------------------------------------

    def offer(self, hashes: np.ndarray | Sequence[int], start_at: float) -> bool:
        """Queue a store of the blocks of ``hashes`` the host does not hold, its copy starting no
        earlier than ``start_at``; ``False`` (nothing stored, offer again later) when too few
        blocks can be evicted to make room."""
        arr = _hashes(hashes)
        new = np.empty(len(arr), dtype=np.uint64)
        n = int(k.h_new(self._tk, self._tv, arr, self.link.blocks, new))
        if not n:
            return True
        short = n - int(self._st[0])  # held + new - capacity (n > capacity: always short)
        if short > 0:
            if short > int(self._st[1]):
                self.store_failures += 1
                return False
            self._evict(short)
        slots = np.empty(n, dtype=np.int64)
        k.h_store(self._hk, self._pin, self._free, self._st, self._tk, self._tv, new, n, slots)
        t0 = max(start_at, self._d2h_free_at)
        done = t0 + self.link.store_s(n * self.block_size)
        self._d2h_free_at = done
        self._pending.append((done, slots))
        self.stored_blocks += n
        return True

    def _evict(self, n: int) -> None:
        self.generation += 1
        self.evicted += n
        gone = np.empty(n, dtype=np.uint64)
        k.h_evict(
            self._hk, self._pin, self._nxt, self._prv, self._free, self._st, self._tk, self._tv,
            n, gone,
        )  # fmt: skip
        hashes: list[int] = gone.tolist()
        log = self._evict_log
        log.extend(hashes)
        if self._emit:
            self._events.extend(BlockRemoved(block_hashes=[h], medium=CPU) for h in hashes)
        if len(log) > 2 * _LOG_KEEP:
            drop = len(log) - _LOG_KEEP
            del log[:drop]
            self._log_base += drop

    def evicted_since(self, mark: int) -> list[int] | None:
        """Hashes evicted since :attr:`evicted` was ``mark``, oldest first; ``None`` when the log
        no longer reaches back that far (it keeps the last ``_LOG_KEEP`` or more)."""
        if mark < self._log_base:
            return None
        return self._evict_log[mark - self._log_base :]

    # -- loads -----------------------------------------------------------------------------------

    def load(self, hashes: np.ndarray | Sequence[int], start_at: float) -> float:
        """Pin the ready ``hashes`` and queue their host→device copy after ``start_at`` and the
        loads before it; the time the copy ends."""
        arr = _hashes(hashes)
        k.h_load(self._pin, self._nxt, self._prv, self._st, self._tk, self._tv, arr)
        t0 = max(start_at, self._h2d_free_at)
        done = t0 + self.link.load_s(len(arr) * self.block_size)
        self._h2d_free_at = done
        self.loaded_blocks += len(arr)
        return done

    def unpin(self, hashes: np.ndarray | Sequence[int]) -> None:
        """A load of ``hashes`` ended (or was dropped): unpin them; an unpinned block is most
        recently used."""
        arr = _hashes(hashes)
        k.h_unpin(self._pin, self._nxt, self._prv, self._st, self._tk, self._tv, arr)

    def touch(self, hashes: np.ndarray | Sequence[int]) -> None:
        """A request that used ``hashes`` (a prefix chain) finished: re-rank the evictable ones in
        reverse prefix order, so the head is the most recently used."""
        k.h_touch(self._pin, self._nxt, self._prv, self._tk, self._tv, _hashes(hashes))

    def drain_events(self) -> list[KVEvent]:
        """Host-tier events since the last drain, oldest first."""
        events, self._events = self._events, []
        return events

    def check(self) -> None:
        """Raise ``AssertionError`` if an invariant is broken (tests)."""
        c = self.link.blocks
        pin = self._pin
        held = np.flatnonzero(pin != k.FREE)
        if len(held) + int(self._st[0]) != c:
            raise AssertionError(f"{len(held)} slots held, {int(self._st[0])} empty, capacity {c}")
        lru: list[int] = []
        s = int(self._nxt[c])
        while s != c:
            lru.append(s)
            if len(lru) > c:
                raise AssertionError("the LRU list has a cycle")
            s = int(self._nxt[s])
        if len(lru) != int(self._st[1]):
            raise AssertionError(f"LRU length {len(lru)}, counted {int(self._st[1])}")
        in_lru = set(lru)
        for s in held.tolist():
            if (pin[s] == 0) != (s in in_lru):
                raise AssertionError(f"slot {s}: pins {int(pin[s])}, in LRU {s in in_lru}")
            if k.t_find(self._tk, self._tv, self._hk[s]) != s:
                raise AssertionError(f"slot {s}: its hash does not map to it")
        if not in_lru <= set(held.tolist()):
            raise AssertionError("LRU holds slots the host does not")
