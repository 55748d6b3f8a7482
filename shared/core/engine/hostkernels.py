"""numba kernels of the host KV tier (:mod:`shared.core.engine.host`): its per-block loops.

The tier's state is a handful of arrays over slots ``0 .. C-1`` (``C`` = host capacity in
blocks), laid out as the GPU pool's (:mod:`shared.core.engine.poolkernels`):

* ``hk`` (uint64): the hash a slot holds;
* ``pin`` (int64): ``FREE`` (-2) an empty slot, ``PENDING`` (-1) a store in flight, 0 ready and
  evictable (then linked in the LRU), > 0 ready and being loaded (pin count);
* ``nxt`` / ``prv`` (int64, ``C + 1`` entries): the LRU of ready, unpinned slots as a doubly
  linked list with a sentinel ``C`` (``nxt[C]`` = least recently used, ``prv[C]`` = most);
* ``free`` (int64): a stack of empty slots; ``st`` (int64): ``[empty slots, LRU length]``;
* ``tk`` / ``tv``: the hash → slot table of the pool (open addressing, at most a quarter full).

Every kernel does what the dict-based tier did block by block, in the same order, so evictions,
their order and the LRU order are the same.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shared.core.engine.poolkernels import _t_delete, _t_insert, t_find

__all__ = [
    "FREE",
    "PENDING",
    "h_complete",
    "h_evict",
    "h_load",
    "h_new",
    "h_run",
    "h_store",
    "h_touch",
    "h_unpin",
    "t_find",
]

FREE = -2
PENDING = -1


@njit(cache=True, nogil=True, inline="always")
def _link_tail(nxt: np.ndarray, prv: np.ndarray, s: int) -> None:
    sentinel = nxt.shape[0] - 1
    t = prv[sentinel]
    nxt[t] = s
    prv[s] = t
    nxt[s] = sentinel
    prv[sentinel] = s


@njit(cache=True, nogil=True, inline="always")
def _unlink(nxt: np.ndarray, prv: np.ndarray, s: int) -> None:
    p = prv[s]
    q = nxt[s]
    nxt[p] = q
    prv[q] = p


@njit(cache=True, nogil=True)
def h_run(
    tk: np.ndarray, tv: np.ndarray, pin: np.ndarray, hashes: np.ndarray, start: int, stop: int
) -> int:
    """The first ``j`` in ``[start, stop)`` with ``hashes[j]`` not ready in the host, else
    ``stop``."""
    j = start
    while j < stop:
        s = t_find(tk, tv, hashes[j])
        if s < 0 or pin[s] < 0:
            break
        j += 1
    return j


@njit(cache=True, nogil=True)
def h_new(tk: np.ndarray, tv: np.ndarray, hashes: np.ndarray, mark: int, out: np.ndarray) -> int:
    """The hashes of ``hashes`` the host does not hold (in any state), first occurrences only,
    in order, into ``out``; returns how many, or ``mark`` + 1 as soon as there are more than
    ``mark`` (the capacity: such a store cannot fit whatever is evicted). A repeat within
    ``hashes`` is found by entering each new hash in the table under ``mark`` (no slot) while
    walking; they leave it after. At most capacity + 1 of them with at most capacity held keep
    the table (four times the capacity) under half full: its probes always end."""
    n = 0
    for i in range(hashes.shape[0]):
        h = hashes[i]
        if t_find(tk, tv, h) < 0:
            _t_insert(tk, tv, h, mark)
            out[n] = h
            n += 1
            if n > mark:
                break
    for i in range(n):
        _t_delete(tk, tv, out[i])
    return n


@njit(cache=True, nogil=True)
def h_evict(
    hk: np.ndarray,
    pin: np.ndarray,
    nxt: np.ndarray,
    prv: np.ndarray,
    free: np.ndarray,
    st: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    n: int,
    gone: np.ndarray,
) -> None:
    """Evict the ``n`` least recently used ready, unpinned slots (the caller checked that the
    LRU holds ``n``), their hashes into ``gone`` in eviction order."""
    sentinel = nxt.shape[0] - 1
    for i in range(n):
        s = nxt[sentinel]
        _unlink(nxt, prv, s)
        h = hk[s]
        _t_delete(tk, tv, h)
        pin[s] = FREE
        free[st[0]] = s
        st[0] += 1
        gone[i] = h
    st[1] -= n


@njit(cache=True, nogil=True)
def h_store(
    hk: np.ndarray,
    pin: np.ndarray,
    free: np.ndarray,
    st: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    hashes: np.ndarray,
    n: int,
    slots: np.ndarray,
) -> None:
    """Take an empty slot for each of ``hashes[:n]`` (absent, distinct; room checked), pending
    its store; the slots into ``slots``."""
    for i in range(n):
        st[0] -= 1
        s = free[st[0]]
        h = hashes[i]
        hk[s] = h
        pin[s] = PENDING
        _t_insert(tk, tv, h, s)
        slots[i] = s


@njit(cache=True, nogil=True)
def h_complete(
    hk: np.ndarray,
    pin: np.ndarray,
    nxt: np.ndarray,
    prv: np.ndarray,
    st: np.ndarray,
    slots: np.ndarray,
    out: np.ndarray,
) -> int:
    """The stores of ``slots`` completed: each pending one turns ready, most recently used; its
    hash into ``out``; returns how many."""
    k = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        if pin[s] == PENDING:
            pin[s] = 0
            _link_tail(nxt, prv, s)
            out[k] = hk[s]
            k += 1
    st[1] += k
    return k


@njit(cache=True, nogil=True)
def h_load(
    pin: np.ndarray,
    nxt: np.ndarray,
    prv: np.ndarray,
    st: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    hashes: np.ndarray,
) -> None:
    """Pin each of ``hashes`` (ready), taking an unpinned one out of the LRU."""
    for i in range(hashes.shape[0]):
        s = t_find(tk, tv, hashes[i])
        if pin[s] == 0:
            _unlink(nxt, prv, s)
            st[1] -= 1
        pin[s] += 1


@njit(cache=True, nogil=True)
def h_unpin(
    pin: np.ndarray,
    nxt: np.ndarray,
    prv: np.ndarray,
    st: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    hashes: np.ndarray,
) -> None:
    """Unpin each of ``hashes``; one reaching 0 becomes the most recently used."""
    for i in range(hashes.shape[0]):
        s = t_find(tk, tv, hashes[i])
        pin[s] -= 1
        if pin[s] == 0:
            _link_tail(nxt, prv, s)
            st[1] += 1


@njit(cache=True, nogil=True)
def h_touch(
    pin: np.ndarray,
    nxt: np.ndarray,
    prv: np.ndarray,
    tk: np.ndarray,
    tv: np.ndarray,
    hashes: np.ndarray,
) -> None:
    """Re-rank the evictable ones of ``hashes`` in reverse order, so the first is the most
    recently used."""
    for i in range(hashes.shape[0] - 1, -1, -1):
        s = t_find(tk, tv, hashes[i])
        if s >= 0 and pin[s] == 0:
            _unlink(nxt, prv, s)
            _link_tail(nxt, prv, s)
