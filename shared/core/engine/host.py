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

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import filterfalse, repeat
from typing import Final

import numpy as np

from shared.contracts.kv import BlockRemoved, BlockStored, KVEvent
from shared.core.tiers import CPU, HostLink

__all__ = ["HostCache"]

_LOG_KEEP: Final = 1 << 16
"""Evicted hashes kept for :meth:`HostCache.evicted_since` (trimmed past twice this)."""


class HostCache:
    """One engine's host tier: ready/pending/pinned blocks by hash, the LRU of evictable ones
    and the two transfer queues. Pure: every call takes the engine's virtual time."""

    __slots__ = (
        "_d2h_free_at",
        "_emit",
        "_events",
        "_evict_log",
        "_h2d_free_at",
        "_log_base",
        "_lru",
        "_pending",
        "_pins",
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
        self._pins: dict[int, int] = {}
        """hash → pin count of every block the host holds: -1 while its store is in flight,
        0 ready and evictable (then also in ``_lru``), > 0 ready and being loaded."""
        self._lru: OrderedDict[int, None] = OrderedDict()
        """Ready, unpinned blocks, least recently used first."""
        self._pending: deque[tuple[float, list[int]]] = deque()
        """Store jobs in flight: (completion time, hashes), in completion order (one FIFO)."""
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
        return len(self._pins)

    def holds(self, block_hash: int) -> bool:
        """Whether ``block_hash`` is ready in the host (its store completed)."""
        return self._pins.get(block_hash, -1) >= 0

    def run(self, hashes: np.ndarray | Sequence[int], start: int, stop: int) -> int:
        """Smallest ``j`` in ``[start, stop]`` with ``hashes[j]`` not ready in the host
        (``stop`` if all are)."""
        get = self._pins.get
        j = start
        step = 32
        while j < stop:  # chunks growing 4x, each looked up C-level; the first miss ends it
            e = min(stop, j + step)
            chunk = hashes[j:e]
            keys = chunk.tolist() if isinstance(chunk, np.ndarray) else list(chunk)
            pins = list(map(get, keys, repeat(-1, len(keys))))
            if min(pins) >= 0:
                j = e
                step *= 4
                continue
            return j + next(k for k, p in enumerate(pins) if p < 0)
        return j

    # -- time ------------------------------------------------------------------------------------

    def complete(self, now: float) -> None:
        """Finish the store jobs whose copy ended by ``now``: their blocks turn ready (most
        recently used) and are announced."""
        pending = self._pending
        if not pending or pending[0][0] > now:
            return
        self.generation += 1
        pins, lru = self._pins, self._lru
        while pending and pending[0][0] <= now:
            _, hashes = pending.popleft()
            for h in hashes:
                if pins.get(h) == -1:
                    pins[h] = 0
                    lru[h] = None
                    if self._emit:
                        self._events.append(
                            BlockStored(
                                block_hashes=[h],
                                parent_block_hash=None,
                                token_ids=[],
                                block_size=0,
                                lora_id=None,
                                medium=CPU,
                            )
                        )

    def next_completion(self) -> float | None:
        """When the oldest store in flight completes, or ``None``."""
        return self._pending[0][0] if self._pending else None

    # -- stores ----------------------------------------------------------------------------------

    def offer(self, hashes: Sequence[int], start_at: float) -> bool:
        """Queue a store of the blocks of ``hashes`` the host does not hold, its copy starting no
        earlier than ``start_at``; ``False`` (nothing stored, offer again later) when too few
        blocks can be evicted to make room."""
        pins = self._pins
        new = list(filterfalse(pins.__contains__, hashes))  # C-level: offers are whole contexts
        if not new:
            return True
        if len(set(new)) != len(new):  # a chain repeating a block (rare): store it once
            new = list(dict.fromkeys(new))
        short = len(pins) + len(new) - self.link.blocks
        if short > 0:
            if short > len(self._lru):
                self.store_failures += 1
                return False
            self._evict(short)
        for h in new:
            pins[h] = -1
        t0 = max(start_at, self._d2h_free_at)
        done = t0 + self.link.store_s(len(new) * self.block_size)
        self._d2h_free_at = done
        self._pending.append((done, new))
        self.stored_blocks += len(new)
        return True

    def _evict(self, n: int) -> None:
        self.generation += 1
        self.evicted += n
        lru, pins, log = self._lru, self._pins, self._evict_log
        for _ in range(n):
            h, _ = lru.popitem(last=False)
            del pins[h]
            log.append(h)
            if self._emit:
                self._events.append(BlockRemoved(block_hashes=[h], medium=CPU))
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

    def load(self, hashes: Sequence[int], start_at: float) -> float:
        """Pin the ready ``hashes`` and queue their host→device copy after ``start_at`` and the
        loads before it; the time the copy ends."""
        pins, lru = self._pins, self._lru
        for h in hashes:
            if pins[h] == 0:
                del lru[h]
            pins[h] += 1
        t0 = max(start_at, self._h2d_free_at)
        done = t0 + self.link.load_s(len(hashes) * self.block_size)
        self._h2d_free_at = done
        self.loaded_blocks += len(hashes)
        return done

    def unpin(self, hashes: Sequence[int]) -> None:
        """A load of ``hashes`` ended (or was dropped): unpin them; an unpinned block is most
        recently used."""
        pins, lru = self._pins, self._lru
        for h in hashes:
            pins[h] -= 1
            if pins[h] == 0:
                lru[h] = None

    def touch(self, hashes: Sequence[int]) -> None:
        """A request that used ``hashes`` (a prefix chain) finished: re-rank the evictable ones in
        reverse prefix order, so the head is the most recently used."""
        lru = self._lru
        # C-level iteration (a finished request re-ranks its whole prompt): the same as
        # ``for h in reversed(hashes): if h in lru: lru.move_to_end(h)``
        deque(map(lru.move_to_end, filter(lru.__contains__, reversed(hashes))), maxlen=0)

    def drain_events(self) -> list[KVEvent]:
        """Host-tier events since the last drain, oldest first."""
        events, self._events = self._events, []
        return events

    def check(self) -> None:
        """Raise ``AssertionError`` if an invariant is broken (tests)."""
        if len(self._pins) > self.link.blocks:
            raise AssertionError(f"{len(self._pins)} blocks held, capacity {self.link.blocks}")
        for h, p in self._pins.items():
            if (p == 0) != (h in self._lru):
                raise AssertionError(f"block {h}: pins {p}, in LRU {h in self._lru}")
        if len(self._lru) > len(self._pins):
            raise AssertionError("LRU holds blocks the host does not")
