"""numba kernels of the block pool (:mod:`shared.core.engine.cache`): its per-block loops.

The pool's state is a handful of arrays over blocks ``0 .. N-1`` (``N = num_blocks``):

* ``ref`` (int64): ref counts;
* ``nxt`` / ``prv`` (int64, ``N + 1`` entries): the LRU free queue as a doubly linked list
  through the free blocks, with a sentinel node ``N`` (``nxt[N]`` = head = next evicted,
  ``prv[N]`` = tail), as vLLM's ``FreeKVCacheBlockQueue``;
* ``seq`` (int64): 0 for a block without a hash, else the (monotone) number of its caching, so
  that sorting cached blocks by it gives the order the hashes were inserted;
* ``bh`` (uint64): the block's hash where ``seq`` is not 0;
* ``tk`` / ``tv``: the hash → block map, an open-addressing table (linear probing, a power-of-
  two size of at least four times ``N``, so it is at most a quarter full) with keys ``tk``
  (uint64) and values ``tv`` (int64 block id, -1 = empty slot); deletion shifts the following
  entries back (no tombstones).

Hashes are uint64 throughout (a Python caller passes ``np.uint64``: a plain int would type as
int64 and mix into float arithmetic). Every kernel is a straight loop doing what the pure-
Python pool did block by block, in the same order, so the results (free order, evictions and
their order, which duplicate wins) are the same.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MUL = np.uint64(0x9E3779B97F4A7C15)
_SHIFT = np.uint64(29)


@njit(cache=True, nogil=True)
def _slot(key: np.uint64, mask: int) -> int:
    return int(np.int64((key * _MUL) >> _SHIFT)) & mask


@njit(cache=True, nogil=True)
def t_find(tk: np.ndarray, tv: np.ndarray, key: np.uint64) -> int:
    """The block stored under ``key``, or -1."""
    mask = tk.shape[0] - 1
    i = _slot(key, mask)
    while True:
        v = tv[i]
        if v < 0:
            return -1
        if tk[i] == key:
            return int(v)
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _t_insert(tk: np.ndarray, tv: np.ndarray, key: np.uint64, val: int) -> None:
    """Store ``key`` → ``val`` (``key`` known absent)."""
    mask = tk.shape[0] - 1
    i = _slot(key, mask)
    while tv[i] >= 0:
        i = (i + 1) & mask
    tk[i] = key
    tv[i] = val


@njit(cache=True, nogil=True)
def _t_delete(tk: np.ndarray, tv: np.ndarray, key: np.uint64) -> None:
    """Remove ``key`` (known present), shifting later entries of its cluster back."""
    mask = tk.shape[0] - 1
    i = _slot(key, mask)
    while tk[i] != key or tv[i] < 0:
        i = (i + 1) & mask
    tv[i] = -1
    j = i
    while True:
        j = (j + 1) & mask
        if tv[j] < 0:
            return
        k = _slot(tk[j], mask)
        # The entry at j may stay if its home k lies cyclically in (i, j].
        stays = i < k <= j if i <= j else k > i or k <= j
        if not stays:
            tk[i] = tk[j]
            tv[i] = tv[j]
            tv[j] = -1
            i = j


@njit(cache=True, nogil=True)
def k_allocate(
    ref: np.ndarray,
    nxt: np.ndarray,
    prv: np.ndarray,
    seq: np.ndarray,
    bh: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    out: np.ndarray,
    pos: int,
    n: int,
    gone: np.ndarray,
) -> int:
    """Pop ``n`` blocks off the free-queue head into ``out[pos:pos+n]`` (ref 1), un-caching the
    cached ones; their hashes go to ``gone`` in pop order; returns how many."""
    sentinel = ref.shape[0]
    ng = 0
    for i in range(n):
        b = nxt[sentinel]
        after = nxt[b]
        nxt[sentinel] = after
        prv[after] = sentinel
        ref[b] = 1
        if seq[b] != 0:
            h = bh[b]
            _t_delete(tk, tv, h)
            seq[b] = 0
            gone[ng] = h
            ng += 1
        out[pos + i] = b
    return ng


@njit(cache=True, nogil=True)
def k_release(ref: np.ndarray, nxt: np.ndarray, prv: np.ndarray, blocks: np.ndarray, n: int) -> int:
    """Drop one reference to each of ``blocks[:n]``, last first; a block reaching 0 goes to the
    free-queue tail. Returns how many were freed."""
    sentinel = ref.shape[0]
    freed = 0
    for i in range(n - 1, -1, -1):
        b = blocks[i]
        c = ref[b] - 1
        ref[b] = c
        if c == 0:
            t = prv[sentinel]
            nxt[t] = b
            prv[b] = t
            nxt[b] = sentinel
            prv[sentinel] = b
            freed += 1
    return freed


@njit(cache=True, nogil=True)
def k_touch(ref: np.ndarray, nxt: np.ndarray, prv: np.ndarray, blocks: np.ndarray, n: int) -> int:
    """ref++ for each of ``blocks[:n]``, unlinking the free ones; returns how many were free."""
    taken = 0
    for i in range(n):
        b = blocks[i]
        if ref[b] == 0:
            p = prv[b]
            q = nxt[b]
            nxt[p] = q
            prv[q] = p
            taken += 1
        ref[b] += 1
    return taken


@njit(cache=True, nogil=True)
def k_cache(
    seq: np.ndarray,
    bh: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    counter: np.ndarray,
    blocks: np.ndarray,
    hashes: np.ndarray,
    start: int,
    stop: int,
    new: np.ndarray,
) -> int:
    """Cache ``blocks[j]`` under ``hashes[j]`` for ``start <= j < stop`` unless the hash is
    cached already or the block has a hash; the ``j`` cached go to ``new``; returns how many."""
    k = 0
    for j in range(start, stop):
        h = hashes[j]
        b = blocks[j]
        if seq[b] == 0 and t_find(tk, tv, h) < 0:
            _t_insert(tk, tv, h, b)
            bh[b] = h
            counter[0] += 1
            seq[b] = counter[0]
            new[k] = j
            k += 1
    return k


@njit(cache=True, nogil=True)
def k_hit(
    tk: np.ndarray, tv: np.ndarray, hashes: np.ndarray, start: int, stop: int, out: np.ndarray
) -> int:
    """Walk ``hashes[start:stop]`` while cached, writing each block to ``out[j]``; returns the
    first ``j`` not cached (``stop`` if all are)."""
    j = start
    while j < stop:
        b = t_find(tk, tv, hashes[j])
        if b < 0:
            break
        out[j] = b
        j += 1
    return j


@njit(cache=True, nogil=True)
def k_run(tk: np.ndarray, tv: np.ndarray, hashes: np.ndarray, start: int, stop: int) -> int:
    """The first ``j`` in ``[start, stop)`` with ``hashes[j]`` not cached, else ``stop``."""
    j = start
    while j < stop and t_find(tk, tv, hashes[j]) >= 0:
        j += 1
    return j


@njit(cache=True, nogil=True)
def k_count_free(ref: np.ndarray, blocks: np.ndarray, n: int) -> int:
    """How many of ``blocks[:n]`` have ref count 0."""
    c = 0
    for i in range(n):
        if ref[blocks[i]] == 0:
            c += 1
    return c


@njit(cache=True, nogil=True)
def k_free_order(nxt: np.ndarray, out: np.ndarray) -> int:
    """The free queue from head to tail into ``out``; returns its length."""
    sentinel = nxt.shape[0] - 1
    b = nxt[sentinel]
    k = 0
    while b != sentinel:
        out[k] = b
        k += 1
        b = nxt[b]
    return k
