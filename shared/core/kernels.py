"""numba kernels for the planner. Each public one has a slow, obvious twin in
:mod:`shared.core.reference` with the same signature; the private helpers are steps of a
kernel (:func:`expand_layer`: :func:`_bubble`, :func:`_probe`) and are checked through it.
They are also ``inline="always"`` (numba inlines them before typing): :func:`expand_layer` is
the planner's hot loop, and helpers there measured slower as calls, and slower still when they
wrote the output rows (see ``docs/benchmarks.md``).

Values are lexicographic 4-tuples ``(k, r, t, count)`` held as four int64 columns and compared
component by component (:func:`lex_cmp`), never summed with weights. All kernels are
``@njit(cache=True, nogil=True)``: the planner runs them off the event loop in a worker thread.
With ``NUMBA_DISABLE_JIT=1`` they run as plain Python (one CI step does that for coverage).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shared.core.problem import B1, I64

BoundTables = tuple[I64, I64, int, I64, int]
"""What :func:`bound_of` reads, as one argument: ``(node_table, node_tab_idx, g_node,
agg_tables, g_agg)``, the suffix-knapsack tables per node and over pooled capacity with their
capacity granularities (layout in :func:`bound_of`; the planner builds them). A plain tuple:
numba dispatches it about as fast as separate arguments (≈0.1 µs more a call; a NamedTuple
adds ≈0.9 µs)."""
Candidate = tuple[int, B1, I64, int, int]
"""The candidate :func:`expand_layer` places: ``(w, elig_row, k_row, r, t)``, its weight, its
eligibility and credit per node, its readiness and tokens."""

_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def lex_cmp(a0: int, a1: int, a2: int, a3: int, b0: int, b1: int, b2: int, b3: int) -> int:
    """-1, 0 or 1 as (a0, a1, a2, a3) is less than, equal to or greater than (b0, …)."""
    if a0 != b0:
        return 1 if a0 > b0 else -1
    if a1 != b1:
        return 1 if a1 > b1 else -1
    if a2 != b2:
        return 1 if a2 > b2 else -1
    if a3 != b3:
        return 1 if a3 > b3 else -1
    return 0


@njit(cache=True, nogil=True)
def suffix_knapsack(w: I64, v: I64, ok: np.ndarray, cap: int) -> I64:
    """``T[j, c]`` = max Σ v over subsets of items ``j..n-1`` with ``ok`` true and Σ w ≤ c.

    A plain (single-value) 0/1 knapsack, built from the last item backwards. Row ``n`` is 0.
    """
    table = np.zeros((w.shape[0] + 1, cap + 1), dtype=np.int64)
    suffix_knapsack_into(w, v, ok, table)
    return table


@njit(cache=True, nogil=True)
def suffix_knapsack_into(w: I64, v: I64, ok: np.ndarray, table: I64) -> None:
    """:func:`suffix_knapsack` written into a preallocated zeroed ``(n + 1, cap + 1)`` table."""
    n = w.shape[0]
    cap = table.shape[1] - 1
    for j in range(n - 1, -1, -1):
        wj = w[j]
        vj = v[j]
        nxt = table[j + 1]
        row = table[j]
        if not ok[j] or vj <= 0 or wj > cap:
            row[:] = nxt
            continue
        for c in range(wj):
            row[c] = nxt[c]
        for c in range(wj, cap + 1):
            cand = nxt[c - wj] + vj
            row[c] = cand if cand > nxt[c] else nxt[c]


@njit(cache=True, nogil=True)
def suffix_knapsack_lex_into(w: I64, vals: I64, ok: np.ndarray, planes: I64) -> None:
    """Lexicographic suffix knapsack: ``planes[:, j, c]`` is the lexicographically largest sum
    of ``vals`` rows (``q`` components, compared in order) over subsets of items ``j..n-1``
    with ``ok`` true and Σ w ≤ c. ``planes`` is a preallocated zeroed ``(q, n + 1, cap + 1)``.
    """
    q = planes.shape[0]
    n = w.shape[0]
    cap = planes.shape[2] - 1
    for j in range(n - 1, -1, -1):
        wj = w[j]
        useful = ok[j] and wj <= cap
        if useful:
            useful = False
            for x in range(q):
                if vals[j, x] != 0:
                    useful = vals[j, x] > 0
                    break
        for c in range(cap + 1):
            take = False
            if useful and c >= wj:
                for x in range(q):
                    cand = planes[x, j + 1, c - wj] + vals[j, x]
                    cur = planes[x, j + 1, c]
                    if cand != cur:
                        take = cand > cur
                        break
            if take:
                for x in range(q):
                    planes[x, j, c] = planes[x, j + 1, c - wj] + vals[j, x]
            else:
                for x in range(q):
                    planes[x, j, c] = planes[x, j + 1, c]


@njit(cache=True, nogil=True)
def knapsack_lex(w: I64, vals: I64, cap: int) -> np.ndarray:
    """Exact single-knapsack with lexicographic values. ``vals`` is (n, 4). Returns a bool mask.

    ``best[c]`` is the lexicographically largest value reachable with total weight ≤ c; ``take``
    records the decisions for reconstruction. Ties keep the earlier (skip) decision, so the result
    is deterministic.
    """
    n = w.shape[0]
    best = np.zeros((cap + 1, 4), dtype=np.int64)
    take = np.zeros((n, cap + 1), dtype=np.bool_)
    for i in range(n):
        wi = w[i]
        if wi > cap:
            continue
        for c in range(cap, wi - 1, -1):
            a0 = best[c - wi, 0] + vals[i, 0]
            a1 = best[c - wi, 1] + vals[i, 1]
            a2 = best[c - wi, 2] + vals[i, 2]
            a3 = best[c - wi, 3] + vals[i, 3]
            if lex_cmp(a0, a1, a2, a3, best[c, 0], best[c, 1], best[c, 2], best[c, 3]) > 0:
                best[c, 0] = a0
                best[c, 1] = a1
                best[c, 2] = a2
                best[c, 3] = a3
                take[i, c] = True
    chosen = np.zeros(n, dtype=np.bool_)
    c = cap
    for i in range(n - 1, -1, -1):
        if take[i, c]:
            chosen[i] = True
            c -= w[i]
    return chosen


@njit(cache=True, nogil=True)
def _hash_row(row: np.ndarray) -> np.uint64:
    h = np.uint64(0xCBF29CE484222325)
    for x in row:
        h = (h ^ np.uint64(x)) * _HASH_MUL
        h ^= h >> np.uint64(29)
    return h


@njit(cache=True, nogil=True)
def bound_of(rem: np.ndarray, j: int, tables: BoundTables) -> tuple[int, int, int, int]:
    """A lexicographic upper bound on what items ``j..`` can still add at remaining capacities
    ``rem``: every completion's value ``(Σk, Σr, Σt, count)`` is lexicographically ≤ it.

    ``tables`` is :data:`BoundTables` ``(node_table, node_tab_idx, g_node, agg_tables, g_agg)``:
    suffix knapsacks over the DP's candidate order, indexed ``[.., j, capacity]``, per node at
    capacity granularity ``g_node`` and over pooled capacity at ``g_agg``.
    ``node_tab_idx[b, 0]``: node ``b``'s credit table (-1: no credit there).
    ``node_tab_idx[b, 1]``: first of five tables for the sessions that may go anywhere, shared
    by every node (-1: none): lexicographic (r, t, count) planes, then max Σt, then max count.
    ``node_tab_idx[b, 2]``: its Lagrangian credit table (-1 everywhere: off).
    ``node_tab_idx[b, 3]``: first of four lexicographic (k, r, t, count) planes for credit node
    ``b`` (-1: not a credit node, or off).
    ``agg_tables`` over pooled capacity: ``0:3`` lexicographic (r, t, count), ``3`` max Σt,
    ``4`` max count; ``5`` (if present) the suffix sum of λ in column 0; ``6:9`` (if present)
    lexicographic (r, t, count) over the capacity of the nodes without credit.

    It is the lexicographic minimum of bounds that are each valid on their own:

    * ``(U_k, X)``. ``U_k`` bounds Σk alone: Σ over nodes of the credit table (exact when each
      session's credit sits on one node), lowered to the Lagrangian ``Σ_{i≥j} λ_i + Σ_b T^λ_b``
      when on (valid for any λ ≥ 0 since a session goes to at most one node). ``X`` bounds
      (Σr, Σt, count): the smallest of the componentwise maxima (each the smaller of pooled and
      per-node), the pooled lexicographic table and the per-node lexicographic sum. Pooled
      capacity lets a session straddle nodes; per-node sums let it go to several; both relax.
    * ``mixed`` (when credit planes exist): Σ over credit nodes of their own lexicographic
      (k, r, t, count) tables, plus (0, pooled (r, t, count) over the other nodes). It sees the
      capacity that the credit optimum takes from readiness and tokens on the credit nodes.

    Sums of lexicographic bounds are bounds (the order is translation-invariant), and so are
    componentwise maxima. Capacities are rounded up and weights down to each table's
    granularity, which keeps them bounds.
    """
    node_table, node_tab_idx, g_node, agg_tables, g_agg = tables
    m = rem.shape[0]
    lam = m > 0 and node_tab_idx[0, 2] >= 0
    mixed = False
    uk = 0
    uk_lam = agg_tables[5, j, 0] if lam else 0
    pr = 0
    pt = 0
    pc = 0
    pt_max = 0
    pc_max = 0
    per_node = m > 0
    total = 0
    other = 0
    x0 = 0
    x1 = 0
    x2 = 0
    x3 = 0
    for b in range(m):
        total += rem[b]
        c = (rem[b] + g_node - 1) // g_node
        ti = node_tab_idx[b, 0]
        if ti >= 0:
            uk += node_table[ti, j, c]
        if lam:
            uk_lam += node_table[node_tab_idx[b, 2], j, c]
        ci = node_tab_idx[b, 1]
        if ci >= 0:
            pr += node_table[ci, j, c]
            pt += node_table[ci + 1, j, c]
            pc += node_table[ci + 2, j, c]
            pt_max += node_table[ci + 3, j, c]
            pc_max += node_table[ci + 4, j, c]
        else:
            per_node = False
        li = node_tab_idx[b, 3]
        if li >= 0:
            mixed = True
            x0 += node_table[li, j, c]
            x1 += node_table[li + 1, j, c]
            x2 += node_table[li + 2, j, c]
            x3 += node_table[li + 3, j, c]
        else:
            other += rem[b]
    if lam and uk_lam < uk:
        uk = uk_lam
    ca = (total + g_agg - 1) // g_agg
    # pooled lexicographic
    ur = agg_tables[0, j, ca]
    ut = agg_tables[1, j, ca]
    uc = agg_tables[2, j, ca]
    # componentwise maxima (the r plane of a lexicographic table is the max Σr)
    wr = ur
    wt = agg_tables[3, j, ca]
    wc = agg_tables[4, j, ca]
    if per_node:
        wr = min(wr, pr)
        wt = min(wt, pt_max)
        wc = min(wc, pc_max)
        if lex_cmp(pr, pt, pc, 0, ur, ut, uc, 0) < 0:
            ur = pr
            ut = pt
            uc = pc
    if lex_cmp(wr, wt, wc, 0, ur, ut, uc, 0) < 0:
        ur = wr
        ut = wt
        uc = wc
    if mixed:
        co = (other + g_agg - 1) // g_agg
        x1 += agg_tables[6, j, co]
        x2 += agg_tables[7, j, co]
        x3 += agg_tables[8, j, co]
        if lex_cmp(x0, x1, x2, x3, uk, ur, ut, uc) < 0:
            return (x0, x1, x2, x3)
    return (uk, ur, ut, uc)


@njit(cache=True, nogil=True)
def optimistic(used: np.ndarray, vals: I64, cap: I64, j: int, tables: BoundTables) -> I64:
    """Value plus :func:`bound_of` for every state: the beam's ranking key, shape (S, 4)."""
    s_count, m = used.shape
    out = np.empty((s_count, 4), dtype=np.int64)
    rem = np.empty(m, dtype=np.int64)
    for s in range(s_count):
        for b in range(m):
            rem[b] = cap[b] - used[s, b]
        u0, u1, u2, u3 = bound_of(rem, j, tables)
        out[s, 0] = vals[s, 0] + u0
        out[s, 1] = vals[s, 1] + u1
        out[s, 2] = vals[s, 2] + u2
        out[s, 3] = vals[s, 3] + u3
    return out


@njit(cache=True, nogil=True, inline="always")
def _bubble(child: np.ndarray, p: int, g0: int) -> None:
    """Restore canonical form after ``child[p]`` was raised: move it up past the smaller
    coordinates before it in its group (nodes ``g0..``), which keeps the group descending."""
    q = p
    while q > g0 and child[q - 1] < child[q]:
        tmp = child[q - 1]
        child[q - 1] = child[q]
        child[q] = tmp
        q -= 1


@njit(cache=True, nogil=True, inline="always")
def _probe(table: np.ndarray, rows: np.ndarray, child: np.ndarray) -> np.uint64:
    """Where ``child`` belongs in the open-addressing ``table`` (power-of-two size, ``-1`` free,
    else a row of ``rows``): linear probing from its hash to the first slot that is free or
    holds a row equal to ``child``."""
    mask = np.uint64(table.shape[0] - 1)
    h = _hash_row(child) & mask
    while True:
        slot = table[h]
        if slot < 0:
            return h
        same = True
        for b in range(child.shape[0]):
            if rows[slot, b] != child[b]:
                same = False
                break
        if same:
            return h
        h = (h + np.uint64(1)) & mask


@njit(cache=True, nogil=True)
def expand_layer(
    used: np.ndarray,
    vals: I64,
    cap: I64,
    group_start: I64,
    cand: Candidate,
    j_next: int,
    tables: BoundTables,
    lb: I64,
    max_out: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Expand every state by one candidate: skip, or place it on each eligible node that fits.

    ``cand`` is :data:`Candidate` ``(w, elig_row, k_row, r, t)``: its weight, eligibility and
    credit per node, readiness and tokens. ``used`` (S, m) holds capacity used per node in
    canonical form: within each group of interchangeable nodes (contiguous, starting at
    ``group_start[b]``) the values are sorted in descending order, so symmetric states collapse
    into one (:func:`_bubble`). A child is kept only if its value plus the :func:`bound_of`
    (over ``tables``, from item ``j_next``) of what remains beats the incumbent ``lb`` (updated
    in place as children improve it). Children with equal canonical vectors are merged through
    an open-addressing table (:func:`_probe`), keeping the larger value (the first one on ties,
    which keeps the result deterministic).

    Returns ``(used, vals, parent, move, count, lb_slot)``; ``move`` is the canonical position
    placed (``-1`` for skip). ``count == -1`` means more than ``max_out`` children: budget
    exhausted. ``lb_slot`` is the child that last raised ``lb`` (or -1), so the caller can
    rebuild the incumbent even if that child's descendants are pruned later.
    """
    wi, elig_row, k_row, ri, ti = cand
    s_count, m = used.shape
    n_used = np.empty((max_out, m), dtype=used.dtype)
    n_vals = np.empty((max_out, 4), dtype=np.int64)
    n_parent = np.empty(max_out, dtype=np.int32)
    n_move = np.empty(max_out, dtype=np.int32)
    size = 1  # a power of two above 2 × max_out + 1: probes stay short and find a free slot
    while size < 2 * max_out + 2:
        size *= 2
    table = np.full(size, -1, dtype=np.int32)
    child = np.empty(m, dtype=used.dtype)
    rem = np.empty(m, dtype=np.int64)
    count = 0
    lb_slot = -1
    for s in range(s_count):
        for p in range(-1, m):
            if p >= 0:
                if not elig_row[p] or used[s, p] + wi > cap[p]:
                    continue
                # symmetry: within a group, place only on the first node of each used level
                if p > group_start[p] and used[s, p - 1] == used[s, p]:
                    continue
            # the child: the parent's row and value, plus the candidate on p
            for b in range(m):
                child[b] = used[s, b]
            v0 = vals[s, 0]
            v1 = vals[s, 1]
            v2 = vals[s, 2]
            v3 = vals[s, 3]
            if p >= 0:
                child[p] += wi
                v0 += k_row[p]
                v1 += ri
                v2 += ti
                v3 += 1
                _bubble(child, p, group_start[p])
            # prune: value + bound of the rest must beat the incumbent
            for b in range(m):
                rem[b] = cap[b] - child[b]
            u0, u1, u2, u3 = bound_of(rem, j_next, tables)
            if lex_cmp(v0 + u0, v1 + u1, v2 + u2, v3 + u3, lb[0], lb[1], lb[2], lb[3]) <= 0:
                continue
            improves = lex_cmp(v0, v1, v2, v3, lb[0], lb[1], lb[2], lb[3]) > 0
            # merge: a new state takes the next row; an equal one keeps the larger value
            h = _probe(table, n_used, child)
            slot = table[h]
            if slot < 0:
                if count >= max_out:
                    return n_used, n_vals, n_parent, n_move, -1, lb_slot
                table[h] = count
                slot = count
                count += 1
                for b in range(m):
                    n_used[slot, b] = child[b]
                n_vals[slot, 0] = v0
                n_vals[slot, 1] = v1
                n_vals[slot, 2] = v2
                n_vals[slot, 3] = v3
                n_parent[slot] = s
                n_move[slot] = p
            elif (
                lex_cmp(
                    v0,
                    v1,
                    v2,
                    v3,
                    n_vals[slot, 0],
                    n_vals[slot, 1],
                    n_vals[slot, 2],
                    n_vals[slot, 3],
                )
                > 0
            ):
                n_vals[slot, 0] = v0
                n_vals[slot, 1] = v1
                n_vals[slot, 2] = v2
                n_vals[slot, 3] = v3
                n_parent[slot] = s
                n_move[slot] = p
            if improves:
                lb[0] = v0
                lb[1] = v1
                lb[2] = v2
                lb[3] = v3
                lb_slot = slot
    return n_used, n_vals, n_parent, n_move, count, lb_slot


@njit(cache=True, nogil=True)
def _gain_better(g0: int, g1: int, g2: int, g3: int, b0: int, b1: int, b2: int, b3: int) -> bool:
    return lex_cmp(g0, g1, g2, g3, b0, b1, b2, b3) > 0


@njit(cache=True, nogil=True)
def improve(
    choice: I64, w: I64, cap: I64, k: I64, r: I64, t: I64, elig: np.ndarray, max_moves: int
) -> int:
    """Local search on a feasible ``choice`` (modified in place); returns the moves made.

    For each unplaced session ``u`` (in index order) it takes the best lexicographic gain among:
    insert ``u`` on a node with room; swap ``u`` for a placed ``a`` on ``a``'s node; or shift a
    placed ``a`` to another node to make room for ``u``. A move is made only when its gain
    ``(Δk, Δr, Δt, Δcount)`` is lexicographically positive, so the objective strictly rises and
    the search ends. Feasibility is kept at every step.
    """
    n = w.shape[0]
    m = cap.shape[0]
    rem = cap.copy()
    for i in range(n):
        if choice[i] >= 0:
            rem[choice[i]] -= w[i]
    moves = 0
    improved = True
    while improved and moves < max_moves:
        improved = False
        for u in range(n):
            if choice[u] >= 0:
                continue
            bg0 = 0
            bg1 = 0
            bg2 = 0
            bg3 = 0
            kind = -1
            mb = -1
            ma = -1
            mb2 = -1
            for b in range(m):
                if not elig[u, b]:
                    continue
                if rem[b] >= w[u]:
                    if _gain_better(k[u, b], r[u], t[u], 1, bg0, bg1, bg2, bg3):
                        bg0, bg1, bg2, bg3 = k[u, b], r[u], t[u], 1
                        kind, mb = 0, b
                    continue
                for a in range(n):
                    if choice[a] != b or rem[b] + w[a] < w[u]:
                        continue
                    g0 = k[u, b] - k[a, b]
                    g1 = r[u] - r[a]
                    g2 = t[u] - t[a]
                    if _gain_better(g0, g1, g2, 0, bg0, bg1, bg2, bg3):
                        bg0, bg1, bg2, bg3 = g0, g1, g2, 0
                        kind, mb, ma = 1, b, a
                    for b2 in range(m):
                        if b2 == b or not elig[a, b2] or rem[b2] < w[a]:
                            continue
                        g0 = k[u, b] + k[a, b2] - k[a, b]
                        if _gain_better(g0, r[u], t[u], 1, bg0, bg1, bg2, bg3):
                            bg0, bg1, bg2, bg3 = g0, r[u], t[u], 1
                            kind, mb, ma, mb2 = 2, b, a, b2
            if kind < 0:
                continue
            if kind == 0:
                choice[u] = mb
                rem[mb] -= w[u]
            elif kind == 1:
                choice[ma] = -1
                choice[u] = mb
                rem[mb] += w[ma] - w[u]
            else:
                choice[ma] = mb2
                rem[mb2] -= w[ma]
                choice[u] = mb
                rem[mb] += w[ma] - w[u]
            moves += 1
            improved = True
            if moves >= max_moves:
                break
    return moves
