"""The TAO planner: exact lexicographic placement where it can be proven, bounded otherwise.

Problem (DESIGN 3.2): choose for each pooled session at most one eligible node so that on every
node Σ w̄ ≤ C̄ and the sum of pair values ``(k, r, t, 1)`` is lexicographically largest.

How it is solved, in order:

1. **Portfolio.** Cheap heuristics (:data:`shared.core.heuristics.PORTFOLIO`: k-first, value
   density, best-fit-decreasing, short-first, value greedy) run on the same snapshot. The best is
   the incumbent, so the answer is never lexicographically worse than BFD or short-first.
2. **Root bound.** A componentwise (hence lexicographic) upper bound: per-node credit knapsacks
   summed over nodes for Σk (exact when each session's credit sits on one node), and a knapsack
   over pooled capacity for Σr, Σt and the count. If the incumbent meets it, it is optimal.
3. **Exact DP over capacity vectors.** One layer per candidate; a state is the vector of capacity
   used per node. Interchangeable nodes (equal free capacity, equal credit column, equal
   eligibility column) are merged *by symmetry*: their coordinates are kept sorted, so states
   that differ only by a permutation of such nodes are one state. Capacities are never summed.
   A state is dropped when its value plus the bound of what remains cannot beat the incumbent,
   and the incumbent rises with every better state found. If the search finishes within the
   state budget, the best value found is proven optimal (``exact: true``).
4. **Beam.** When the budget (or the injected deadline) runs out, the search continues from the
   layer it reached, keeping only the states with the best optimistic value (value + bound). The
   answer is the best of the beam and the portfolio, reported with ``exact: false`` and a reason.

The kernels live in :mod:`shared.core.kernels`; their slow twins in :mod:`shared.core.reference`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from shared.core.heuristics import PORTFOLIO, Choice
from shared.core.kernels import (
    bound_of,
    expand_layer,
    improve,
    optimistic,
    suffix_knapsack_into,
)
from shared.core.problem import Dense, Objective, objective_of

NODE_TABLE_MAX = 1024
"""Largest per-node bound-table width; coarser granularity beyond it (still a valid bound)."""
AGG_TABLE_MAX = 8192
"""Largest pooled bound-table width."""
BEAM_SHARE = 4
"""The exact phase may use ``budget - budget // BEAM_SHARE`` states; the beams get the rest."""
POLISH_MOVES = 4
"""Local-search moves allowed per candidate when polishing an incumbent."""
PROBE_WIDTH = 1024
"""Width of the first, narrow beam that seeds the incumbent before the exact search."""


@dataclass(slots=True)
class Solution:
    choice: Choice
    objective: Objective
    exact: bool
    method: str
    states: int
    reason: str | None = None
    diagnostics: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Prepared:
    """The snapshot as the DP sees it: active candidates in DP order, nodes grouped."""

    items: np.ndarray  # original candidate index per DP layer
    node_perm: np.ndarray  # permuted position -> original node index
    group_start: np.ndarray
    groups: int
    w: np.ndarray
    cap: np.ndarray
    k: np.ndarray
    r: np.ndarray
    t: np.ndarray
    elig: np.ndarray


def _order_pack(d: Dense, i: int) -> tuple[int, ...]:
    """Sessions with credit first, then largest weight first (packs tightly; the exact DP's
    order)."""
    kmax = int(d.k[i].max()) if d.m else 0
    return (-int(kmax > 0), -int(d.w[i]), i)


def _order_value(d: Dense, i: int) -> tuple[int, ...]:
    """Sessions with credit first, then ready ones, then largest weight (a second beam order)."""
    kmax = int(d.k[i].max()) if d.m else 0
    return (-int(kmax > 0), -int(d.r[i]), -int(d.w[i]), i)


def _prepare(d: Dense, order: Callable[[Dense, int], tuple[int, ...]]) -> _Prepared:
    active = [i for i in range(d.n) if bool(d.elig[i].any())]
    # Nodes: group the interchangeable ones, groups contiguous, in first-appearance order.
    keys: dict[tuple[object, ...], list[int]] = {}
    for b in range(d.m):
        key = (int(d.cap[b]), d.k[:, b].tobytes(), d.elig[:, b].tobytes())
        keys.setdefault(key, []).append(b)
    node_perm: list[int] = []
    group_start: list[int] = []
    for members in keys.values():
        start = len(node_perm)
        node_perm.extend(members)
        group_start.extend([start] * len(members))

    items = np.array(sorted(active, key=lambda i: order(d, i)), dtype=np.int64)
    perm = np.array(node_perm, dtype=np.int64)
    ix = np.ix_(items, perm)
    return _Prepared(
        items=items,
        node_perm=perm,
        group_start=np.array(group_start, dtype=np.int64),
        groups=len(keys),
        w=d.w[items].astype(np.int64),
        cap=d.cap[perm].astype(np.int64),
        k=np.ascontiguousarray(d.k[ix]).astype(np.int64),
        r=d.r[items].astype(np.int64),
        t=d.t[items].astype(np.int64),
        elig=np.ascontiguousarray(d.elig[ix]),
    )


@dataclass(frozen=True, slots=True)
class _Bounds:
    node_table: np.ndarray
    node_tab_idx: np.ndarray
    g_node: int
    agg: np.ndarray
    g_agg: int


def _bounds(p: _Prepared) -> _Bounds:
    n, m = p.k.shape
    max_cap = int(p.cap.max()) if m else 0
    g_node = max(1, -(-max_cap // NODE_TABLE_MAX))
    width = -(-max_cap // g_node)
    credit_nodes = [b for b in range(m) if bool(p.k[:, b].any())]
    node_tab_idx = np.full(m, -1, dtype=np.int64)
    node_table = np.zeros((max(len(credit_nodes), 1), n + 1, width + 1), dtype=np.int64)
    wg = p.w // g_node
    seen: dict[bytes, int] = {}
    for b in credit_nodes:
        col = p.k[:, b]
        key = col.tobytes() + p.elig[:, b].tobytes()
        if key in seen:  # interchangeable nodes share their table
            node_tab_idx[b] = seen[key]
            continue
        idx = len(seen)
        seen[key] = idx
        node_tab_idx[b] = idx
        suffix_knapsack_into(wg, col, p.elig[:, b], node_table[idx])
    total = int(p.cap.sum())
    g_agg = max(1, -(-total // AGG_TABLE_MAX))
    agg_w = -(-total // g_agg)
    wa = p.w // g_agg
    ok: np.ndarray = np.asarray(p.elig.any(axis=1), dtype=np.bool_)
    agg = np.zeros((3, n + 1, agg_w + 1), dtype=np.int64)
    suffix_knapsack_into(wa, p.r, ok, agg[0])
    suffix_knapsack_into(wa, p.t, ok, agg[1])
    suffix_knapsack_into(wa, np.ones(n, dtype=np.int64), ok, agg[2])
    return _Bounds(node_table, node_tab_idx, g_node, agg, g_agg)


def _root_bound(p: _Prepared, bd: _Bounds) -> Objective:
    u = bound_of(p.cap.copy(), 0, bd.node_table, bd.node_tab_idx, bd.g_node, bd.agg, bd.g_agg)
    return Objective(int(u[0]), int(u[1]), int(u[2]), int(u[3]))


def _replay(p: _Prepared, moves: list[int], n_orig: int) -> Choice:
    """Turn canonical-position moves back into physical nodes (undoing the symmetry sort)."""
    m = p.cap.shape[0]
    used = [0] * m
    phys = list(range(m))
    choice = [-1] * n_orig
    for layer, pos in enumerate(moves):
        if pos < 0:
            continue
        choice[int(p.items[layer])] = int(p.node_perm[phys[pos]])
        used[pos] += int(p.w[layer])
        q, g0 = pos, int(p.group_start[pos])
        while q > g0 and used[q - 1] < used[q]:
            used[q - 1], used[q] = used[q], used[q - 1]
            phys[q - 1], phys[q] = phys[q], phys[q - 1]
            q -= 1
    return choice


def _trace(parents: list[np.ndarray], moves: list[np.ndarray], layer: int, slot: int) -> list[int]:
    path = [-1] * (layer + 1)
    s = slot
    for j in range(layer, -1, -1):
        path[j] = int(moves[j][s])
        s = int(parents[j][s])
    return path


def _rank(p: _Prepared, bd: _Bounds, used: np.ndarray, vals: np.ndarray, j: int) -> np.ndarray:
    """Order states by optimistic value (value + bound), best first; ties by value, then index."""
    opt = optimistic(
        used, vals, p.cap, j, bd.node_table, bd.node_tab_idx, bd.g_node, bd.agg, bd.g_agg
    )
    keys = (
        np.arange(used.shape[0]),
        *(-vals[:, c] for c in (3, 2, 1, 0)),
        *(-opt[:, c] for c in (3, 2, 1, 0)),
    )
    return np.lexsort(keys)


def _polish(d: Dense, choice: Choice) -> Choice | None:
    """Local search (insert / swap / shift) from ``choice``; None when it made no move."""
    arr = np.array(choice, dtype=np.int64).reshape(d.n)
    moved = improve(arr, d.w, d.cap, d.k, d.r, d.t, d.elig, POLISH_MOVES * max(d.n, 1))
    return [int(x) for x in arr] if moved else None


def _beam_width(budget: int, states: int, layers: int, m: int) -> int:
    return max(1, (budget - states) // (max(layers, 1) * (m + 1)))


@dataclass(slots=True)
class _Search:
    """Outcome of one layered search: best path found (if it beat the incumbent)."""

    states: int
    complete: bool
    path: list[int] | None
    layer_reached: int


def _search(
    p: _Prepared,
    bd: _Bounds,
    lb: np.ndarray,
    *,
    width: int,
    budget: int,
    expired: Callable[[], bool] | None,
) -> _Search:
    """Layered DP from the root. ``width == 0``: exact (stops incomplete past ``budget``
    states or when ``expired()``); otherwise a beam keeping ``width`` states per layer.
    ``lb`` is the incumbent's value and is raised in place; ``path`` is the canonical-move path
    of the last improvement (None when nothing beat the incumbent)."""
    n, m = p.k.shape
    # int32 halves the state memory; capacities past 2**31 quanta need int64
    wide = m > 0 and int(p.cap.max()) > np.iinfo(np.int32).max
    used = np.zeros((1, m), dtype=np.int64 if wide else np.int32)
    vals = np.zeros((1, 4), dtype=np.int64)
    parents: list[np.ndarray] = []
    moves: list[np.ndarray] = []
    states = 0
    path: list[int] | None = None
    for j in range(n):
        if width == 0 and expired is not None and expired():
            return _Search(states, False, path, j)
        if width and used.shape[0] > width:
            keep = np.sort(_rank(p, bd, used, vals, j)[:width])
            used, vals = used[keep], vals[keep]
            parents[-1], moves[-1] = parents[-1][keep], moves[-1][keep]
        max_out = used.shape[0] * (m + 1)
        if width == 0:
            max_out = max(0, min(max_out, budget - states))
        lb_before = lb.copy()
        n_used, n_vals, n_parent, n_move, count, lb_slot = expand_layer(
            used,
            vals,
            p.cap,
            p.group_start,
            int(p.w[j]),
            p.elig[j],
            p.k[j],
            int(p.r[j]),
            int(p.t[j]),
            j + 1,
            bd.node_table,
            bd.node_tab_idx,
            bd.g_node,
            bd.agg,
            bd.g_agg,
            lb,
            max_out,
        )
        if count < 0:
            lb[:] = lb_before
            return _Search(states, False, path, j)
        states += count
        used, vals = n_used[:count], n_vals[:count]
        parents.append(n_parent[:count])
        moves.append(n_move[:count])
        if lb_slot >= 0:
            path = _trace(parents, moves, j, lb_slot)
        if count == 0:
            break
    return _Search(states, True, path, n)


def solve(d: Dense, *, budget: int, expired: Callable[[], bool] | None = None) -> Solution:
    """Best placement for ``d`` (see the module docstring). Deterministic when ``expired`` is
    ``None``. States explored stay within ``budget`` (plus at most one width-1 pass)."""
    best_choice: Choice = [-1] * d.n
    best_obj = objective_of(d, best_choice)
    best_method = "empty"
    heur: dict[str, list[int]] = {}
    diag: dict[str, object] = {"heuristics": heur}
    # Everyone admitted on their best node: a bound that needs no tables.
    active = d.elig.any(axis=1) if d.m else np.zeros(d.n, dtype=np.bool_)
    everyone = Objective(
        int(d.kmax[active].sum()),
        int(d.r[active].sum()),
        int(d.t[active].sum()),
        int(active.sum()),
    )
    for name, fn in PORTFOLIO:
        ch = fn(d)
        obj = objective_of(d, ch)
        heur[name] = list(obj)
        if obj > best_obj:
            best_choice, best_obj, best_method = ch, obj, name
        if best_obj == everyone:  # nothing can beat admitting everyone at their best
            diag["proof"] = "bound"
            return Solution(best_choice, best_obj, True, best_method, 0, None, diag)
    polished = _polish(d, best_choice)
    if polished is not None and objective_of(d, polished) > best_obj:
        best_choice, best_obj = polished, objective_of(d, polished)
        best_method += "+ls"
    p = _prepare(d, _order_pack)
    n, m = p.k.shape
    diag["groups"] = p.groups
    if n == 0 or m == 0:
        diag["proof"] = "trivial"
        return Solution(best_choice, best_obj, True, best_method, 0, None, diag)
    bd = _bounds(p)
    root = _root_bound(p, bd)
    diag["root_bound"] = list(root)
    if best_obj == root:
        diag["proof"] = "bound"
        return Solution(best_choice, best_obj, True, best_method, 0, None, diag)

    lb = np.array(best_obj, dtype=np.int64)
    states = 0

    def adopt(res: _Search, method: str, prep: _Prepared) -> None:
        nonlocal best_choice, best_obj, best_method
        if res.path is not None:
            best_choice = _replay(prep, res.path, d.n)
            best_obj = objective_of(d, best_choice)
            best_method = method
        polished = _polish(d, best_choice)
        if polished is not None:
            best_choice, best_obj = polished, objective_of(d, polished)
            best_method += "+ls"
            lb[:] = np.array(best_obj, dtype=np.int64)

    # A narrow beam first: a strong incumbent makes the exact search prune far more.
    probe_width = max(1, min(PROBE_WIDTH, budget // (2 * BEAM_SHARE * n * (m + 1))))
    for prep, bnd in ((p, bd), (p2 := _prepare(d, _order_value), _bounds(p2))):
        probe = _search(prep, bnd, lb, width=probe_width, budget=budget, expired=None)
        states += probe.states
        adopt(probe, "dp-beam", prep)
        if best_obj == root:
            break
    if best_obj == root:
        diag["proof"] = "bound"
        return Solution(best_choice, best_obj, True, best_method, states, None, diag)
    exact_budget = budget - budget // BEAM_SHARE - states
    exact = _search(p, bd, lb, width=0, budget=exact_budget, expired=expired)
    states += exact.states
    adopt(exact, "dp", p)
    if exact.complete:
        diag["proof"] = "dp"
        return Solution(best_choice, best_obj, True, best_method, states, None, diag)
    timed_out = expired is not None and expired()
    reason = (
        f"time limit reached at layer {exact.layer_reached} of {n}"
        if timed_out
        else f"state budget {budget} exhausted at layer {exact.layer_reached} of {n}"
    )
    width = _beam_width(budget, states, n, m)
    if width > probe_width and not timed_out:
        beam = _search(p, bd, lb, width=width, budget=budget, expired=None)
        states += beam.states
        adopt(beam, "dp-beam", p)
        diag["beam_width"] = width
    return Solution(best_choice, best_obj, False, best_method, states, reason, diag)


def warm_up() -> None:
    """Load every kernel once (from numba's on-disk cache, or compile it) on a tiny snapshot,
    so that the first real solve is not charged for it. Services call this at start-up."""
    from shared.core.problem import Candidate, Node, Problem, densify

    nodes = (Node("a", 4096), Node("b", 4096), Node("c", 2048))
    cands = tuple(
        Candidate(f"s{i}", 1024 + 512 * i, 900 + 400 * i, i % 2, {"a": 512} if i % 3 else {})
        for i in range(8)
    )
    d = densify(Problem(512, nodes, cands))
    solve(d, budget=10_000)
    p = _prepare(d, _order_pack)
    bd = _bounds(p)
    for width in (0, 1):  # the exact search and the beam, whatever solve() needed above
        _search(p, bd, np.zeros(4, dtype=np.int64), width=width, budget=10_000, expired=None)
