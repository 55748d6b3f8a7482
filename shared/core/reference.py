"""Slow, obvious twins of the numba kernels in :mod:`shared.core.kernels` (tests only).

Each function here states what its kernel computes in the plainest Python available: tuples
compared with ``<``, subsets enumerated, states kept in dicts. Nothing is fast and nothing is
clever; hypothesis tests compare every kernel with its twin on small inputs (STYLE rule 12).

Values are lexicographic 4-tuples ``(k, r, t, count)`` of Python ints.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

Value = tuple[int, int, int, int]
Array = npt.NDArray[Any]
State = tuple[int, ...]
BoundTables = tuple[Array, Array, int, Array, int]
"""``(node_table, node_tab_idx, g_node, agg_tables, g_agg)``, as the kernels take them."""
Candidate = tuple[int, Array, Array, int, int]
"""``(w, elig_row, k_row, r, t)``: the candidate a layer places, as the kernels take it."""


def _ints(a: Array) -> list[int]:
    return [int(x) for x in np.asarray(a).reshape(-1)]


def _add(a: Value, b: Value) -> Value:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


def _sub(a: Value, b: Value) -> Value:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3])


def lex_cmp(a0: int, a1: int, a2: int, a3: int, b0: int, b1: int, b2: int, b3: int) -> int:
    """-1, 0 or 1 by Python tuple comparison."""
    a, b = (a0, a1, a2, a3), (b0, b1, b2, b3)
    return (a > b) - (a < b)


def suffix_knapsack(w: Array, v: Array, ok: Array, cap: int) -> list[list[int]]:
    """``T[j][c]`` = max Σ v over subsets of the allowed items ``j..n-1`` with Σ w ≤ c.

    Enumerates the subsets: those of ``j..`` are those of ``j+1..`` with and without item ``j``.
    The empty subset (value 0) is always allowed.
    """
    ws, vs, oks = _ints(w), _ints(v), [bool(x) for x in np.asarray(ok).reshape(-1)]
    n = len(ws)
    subsets: list[tuple[int, int]] = [(0, 0)]  # (Σw, Σv) of every subset of items j..n-1
    table = [[0] * (cap + 1) for _ in range(n + 1)]
    for j in range(n - 1, -1, -1):
        if oks[j]:
            subsets = subsets + [(sw + ws[j], sv + vs[j]) for sw, sv in subsets]
        for c in range(cap + 1):
            table[j][c] = max(sv for sw, sv in subsets if sw <= c)
    return table


def suffix_knapsack_into(w: Array, v: Array, ok: Array, table: Array) -> None:
    """:func:`suffix_knapsack` written into a zeroed ``(n + 1, cap + 1)`` array ``table``."""
    table[:] = np.array(suffix_knapsack(w, v, ok, table.shape[1] - 1), dtype=table.dtype)


def suffix_knapsack_lex_into(w: Array, vals: Array, ok: Array, planes: Array) -> None:
    """``planes[:, j, c]`` = the lexicographically largest Σ of ``vals`` rows over subsets of
    the allowed items ``j..n-1`` with Σ w ≤ c, found by enumerating the subsets."""
    ws, oks = _ints(w), [bool(x) for x in np.asarray(ok).reshape(-1)]
    rows = [tuple(int(x) for x in vals[i]) for i in range(len(ws))]
    q = planes.shape[0]
    subsets: list[tuple[int, tuple[int, ...]]] = [(0, (0,) * q)]
    for j in range(len(ws) - 1, -1, -1):
        if oks[j]:
            subsets = subsets + [
                (sw + ws[j], tuple(a + b for a, b in zip(sv, rows[j], strict=True)))
                for sw, sv in subsets
            ]
        for c in range(planes.shape[2]):
            best = max(sv for sw, sv in subsets if sw <= c)
            for x in range(q):
                planes[x, j, c] = best[x]


def lex_knapsack_best(w: Array, vals: Array, cap: int) -> tuple[tuple[bool, ...], Value]:
    """Every subset enumerated: the first (in ``itertools.product`` order) with the
    lexicographically largest Σ vals among those with Σ w ≤ cap, and that value."""
    ws = _ints(w)
    rows = [tuple(int(x) for x in row) for row in np.asarray(vals).reshape(len(ws), 4)]
    best_mask: tuple[bool, ...] = (False,) * len(ws)
    best: Value = (0, 0, 0, 0)
    for mask in itertools.product((False, True), repeat=len(ws)):
        if sum(wi for wi, on in zip(ws, mask, strict=True) if on) > cap:
            continue
        value: Value = (0, 0, 0, 0)
        for row, on in zip(rows, mask, strict=True):
            if on:
                value = _add(value, (row[0], row[1], row[2], row[3]))
        if value > best:
            best_mask, best = mask, value
    return best_mask, best


def knapsack_lex(w: Array, vals: Array, cap: int) -> tuple[bool, ...]:
    """Twin of the kernel: a mask whose value is the lexicographic optimum (ties may differ)."""
    return lex_knapsack_best(w, vals, cap)[0]


def bound_of(rem: Array, j: int, tables: BoundTables) -> Value:
    """The kernel's bound written out: the lexicographic minimum of ``(U_k, X)`` and, when
    credit nodes carry lexicographic planes, the mixed bound (see the kernel's docstring)."""
    node_table, node_tab_idx, g_node, agg_tables, g_agg = tables
    rems = _ints(rem)
    m = len(rems)
    cols = [-(-left // g_node) for left in rems]

    def cell(table: int, b: int) -> int:
        return int(node_table[table, j, cols[b]])

    credit = sum(cell(int(node_tab_idx[b, 0]), b) for b in range(m) if node_tab_idx[b, 0] >= 0)
    if m and int(node_tab_idx[0, 2]) >= 0:
        lagrangian = int(agg_tables[5, j, 0]) + sum(
            cell(int(node_tab_idx[b, 2]), b) for b in range(m)
        )
        credit = min(credit, lagrangian)
    ca = -(-sum(rems) // g_agg)
    pooled_lex = tuple(int(agg_tables[comp, j, ca]) for comp in range(3))
    widest = [pooled_lex[0], int(agg_tables[3, j, ca]), int(agg_tables[4, j, ca])]
    candidates = [pooled_lex]
    if m and all(int(node_tab_idx[b, 1]) >= 0 for b in range(m)):
        per = [sum(cell(int(node_tab_idx[b, 1]) + x, b) for b in range(m)) for x in range(5)]
        candidates.append((per[0], per[1], per[2]))
        widest = [min(widest[0], per[0]), min(widest[1], per[3]), min(widest[2], per[4])]
    candidates.append((widest[0], widest[1], widest[2]))
    x = min(candidates)
    best: Value = (credit, x[0], x[1], x[2])
    credit_nodes = [b for b in range(m) if int(node_tab_idx[b, 3]) >= 0]
    if credit_nodes:
        other = sum(rems[b] for b in range(m) if b not in credit_nodes)
        co = -(-other // g_agg)
        mixed = [0, *(int(agg_tables[6 + comp, j, co]) for comp in range(3))]
        for b in credit_nodes:
            for comp in range(4):
                mixed[comp] += cell(int(node_tab_idx[b, 3]) + comp, b)
        best = min(best, (mixed[0], mixed[1], mixed[2], mixed[3]))
    return best


def optimistic(used: Array, vals: Array, cap: Array, j: int, tables: BoundTables) -> list[Value]:
    """Per state: its value plus :func:`bound_of` at its remaining capacity."""
    out: list[Value] = []
    for s in range(used.shape[0]):
        rem = np.array([int(c) - int(u) for c, u in zip(cap, used[s], strict=True)])
        value: Value = (int(vals[s, 0]), int(vals[s, 1]), int(vals[s, 2]), int(vals[s, 3]))
        out.append(_add(value, bound_of(rem, j, tables)))
    return out


def canonical(vec: Sequence[int], group_start: Sequence[int]) -> State:
    """``vec`` with each group of interchangeable nodes sorted in descending order."""
    out = list(vec)
    b = 0
    while b < len(out):
        end = b + 1
        while end < len(out) and group_start[end] == group_start[b]:
            end += 1
        out[b:end] = sorted(out[b:end], reverse=True)
        b = end
    return tuple(out)


class Move(NamedTuple):
    """One child of one parent: placing on node ``node`` (``-1`` = skip)."""

    parent: int
    node: int
    state: State
    value: Value


def _moves(
    used: Array, vals: Array, cap: Array, group_start: Array, cand: Candidate
) -> Iterator[Move]:
    """Every (parent, skip-or-node) child in the kernel's order: parents in order, skip first,
    then every eligible node with room (no symmetry shortcut), each child made canonical."""
    wi, elig_row, k_row, ri, ti = cand
    caps, starts, ks = _ints(cap), _ints(group_start), _ints(k_row)
    oks = [bool(x) for x in np.asarray(elig_row).reshape(-1)]
    for s in range(used.shape[0]):
        row = [int(x) for x in used[s]]
        value: Value = (int(vals[s, 0]), int(vals[s, 1]), int(vals[s, 2]), int(vals[s, 3]))
        yield Move(s, -1, canonical(row, starts), value)
        for b in range(len(row)):
            if oks[b] and row[b] + wi <= caps[b]:
                child = row.copy()
                child[b] += wi
                yield Move(s, b, canonical(child, starts), _add(value, (ks[b], ri, ti, 1)))


def layer_children(
    used: Array, vals: Array, cap: Array, group_start: Array, cand: Candidate
) -> dict[State, Value]:
    """Every canonical child state of the layer with its best value (no bound, no pruning)."""
    best: dict[State, Value] = {}
    for mv in _moves(used, vals, cap, group_start, cand):
        if mv.state not in best or mv.value > best[mv.state]:
            best[mv.state] = mv.value
    return best


class Child(NamedTuple):
    value: Value
    parent: int
    move: int


class Layer(NamedTuple):
    """What :func:`expand_layer` keeps: children by canonical state, the raised incumbent, the
    state of the child that last raised it (or None), and whether ``max_out`` was exceeded."""

    children: dict[State, Child]
    lb: Value
    last_raise: State | None
    overflow: bool


def expand_layer(
    used: Array,
    vals: Array,
    cap: Array,
    group_start: Array,
    cand: Candidate,
    j_next: int,
    tables: BoundTables,
    lb: Sequence[int],
    max_out: int,
) -> Layer:
    """Children in order; a child survives when value + bound(rest) > the incumbent, which is
    raised to each surviving child that beats it. Equal states keep the strictly larger value
    (the first on ties). ``move`` is the first node of the child's level within its group."""
    caps, starts = _ints(cap), _ints(group_start)
    incumbent: Value = (int(lb[0]), int(lb[1]), int(lb[2]), int(lb[3]))
    children: dict[State, Child] = {}
    last: State | None = None
    for mv in _moves(used, vals, cap, group_start, cand):
        rem = [c - u for c, u in zip(caps, mv.state, strict=True)]
        bound = bound_of(np.array(rem), j_next, tables)
        if _add(mv.value, bound) <= incumbent:
            continue
        node = mv.node
        if node >= 0:  # the canonical position: the first node of that level in the group
            row = [int(x) for x in used[mv.parent]]
            while node > starts[node] and row[node - 1] == row[node]:
                node -= 1
        old = children.get(mv.state)
        if old is None or mv.value > old.value:
            children[mv.state] = Child(mv.value, mv.parent, node)
        if mv.value > incumbent:
            incumbent = mv.value
            last = mv.state
    return Layer(children, incumbent, last, len(children) > max_out)


def choice_value(choice: Sequence[int], k: Array, r: Array, t: Array) -> Value:
    """Σ over placed sessions of ``(k[i, b], r[i], t[i], 1)``."""
    total: Value = (0, 0, 0, 0)
    for i, b in enumerate(choice):
        if b >= 0:
            total = _add(total, (int(k[i, b]), int(r[i]), int(t[i]), 1))
    return total


def _room(choice: Sequence[int], w: Array, cap: Array, b: int) -> int:
    return int(cap[b]) - sum(int(w[i]) for i, x in enumerate(choice) if x == b)


def _neighbours(
    choice: list[int], u: int, w: Array, cap: Array, elig: Array
) -> Iterator[list[int]]:
    """The moves that bring ``u`` in, in the kernel's order. Per eligible node ``b``: insert when
    ``b`` has room; otherwise, for each ``a`` placed on ``b`` whose removal makes room, swap
    ``a`` out, then shift ``a`` to each other eligible node with room."""
    n, m = len(choice), len(cap)
    for b in range(m):
        if not bool(elig[u, b]):
            continue
        if _room(choice, w, cap, b) >= int(w[u]):
            yield [b if i == u else x for i, x in enumerate(choice)]
            continue
        for a in range(n):
            if choice[a] != b or _room(choice, w, cap, b) + int(w[a]) < int(w[u]):
                continue
            swapped = list(choice)
            swapped[a], swapped[u] = -1, b
            yield swapped
            for b2 in range(m):
                if b2 != b and bool(elig[a, b2]) and _room(choice, w, cap, b2) >= int(w[a]):
                    shifted = list(choice)
                    shifted[a], shifted[u] = b2, b
                    yield shifted


def improve(
    choice: Sequence[int],
    w: Array,
    cap: Array,
    k: Array,
    r: Array,
    t: Array,
    elig: Array,
    max_moves: int,
) -> tuple[list[int], int]:
    """Passes over the unplaced sessions in index order; each takes the first neighbour with the
    largest strictly positive gain in full objective, until a pass changes nothing or
    ``max_moves`` moves are made. Returns the new choice and the number of moves."""
    current = [int(x) for x in choice]
    moves = 0
    improved = True
    while improved and moves < max_moves:
        improved = False
        for u in range(len(current)):
            if current[u] >= 0:
                continue
            here = choice_value(current, k, r, t)
            best_gain: Value = (0, 0, 0, 0)
            best: list[int] | None = None
            for nb in _neighbours(current, u, w, cap, elig):
                gain = _sub(choice_value(nb, k, r, t), here)
                if gain > best_gain:
                    best_gain, best = gain, nb
            if best is None:
                continue
            current = best
            moves += 1
            improved = True
            if moves >= max_moves:
                break
    return current, moves
