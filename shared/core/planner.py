"""The TAO planner: exact lexicographic placement where it can be proven, bounded otherwise.

Problem (DESIGN 3.2): choose for each pooled session at most one eligible node so that on every
node Σ w̄ ≤ C̄ and the sum of pair values ``(k, r, t, 1)`` is lexicographically largest.

How it is solved, in order:

1. **Portfolio.** Cheap heuristics (:data:`shared.core.heuristics.PORTFOLIO`: k-first,
   k-first-ready, value density, best-fit-decreasing, short-first, value greedy) run on the
   same snapshot, and the best, polished by a local search (insert / swap / shift), is the
   incumbent. So the answer is never lexicographically worse than BFD or short-first. If it
   admits every session on its best node, nothing can beat it and it is returned as proven.
2. **Root bound.** A lexicographic upper bound on what the sessions can add
   (:func:`shared.core.kernels.bound_of`): for Σk the per-node credit knapsacks summed over
   nodes (exact when each session's credit sits on one node), tightened by a Lagrangian form when
   credit sits on several nodes; for (Σr, Σt, count) the lexicographically smallest of the
   componentwise maxima, a lexicographic knapsack over pooled capacity and the sum of per-node
   ones; and on small snapshots a mixed bound over credit nodes. If the incumbent meets it, it
   is optimal.
3. **Probe.** A narrow beam over the DP below, to raise the incumbent before the exact search.
4. **Exact DP over capacity vectors.** One layer per candidate (sessions with credit first, then
   largest first); a state is the vector of capacity used per node. Interchangeable nodes (equal
   free capacity, credit column and eligibility column) are merged *by symmetry*: their
   coordinates are kept sorted, so states that differ only by a permutation of such nodes are one
   state. Capacities are never summed. A state is dropped when its value plus the bound of what
   remains cannot beat the incumbent, and the incumbent rises with every better state found. If
   the search finishes within the budget, the best value found is proven optimal.
5. **Beam.** When the budget (or the injected deadline) runs out first, the rest of the budget
   goes to a wider beam that keeps the states with the best optimistic value (value + bound).
   The answer is the best found, reported with ``exact: false`` and the reason.

The budget counts child states examined (each state × its m + 1 moves), which tracks time for
any node count. The kernels live in :mod:`shared.core.kernels`; their slow twins in
:mod:`shared.core.reference`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from shared.core.heuristics import PORTFOLIO, Choice
from shared.core.kernels import (
    BoundTables,
    bound_of,
    expand_layer,
    improve,
    optimistic,
    suffix_knapsack_into,
    suffix_knapsack_lex_into,
)
from shared.core.problem import Dense, Objective, SolveDiagnostics, objective_of

NODE_CELLS_MAX = 3_000_000
"""Cells (int64, 8 bytes each) the per-node bound tables may take; past it their capacity
granularity coarsens (still a valid bound, looser). At full granularity the credit bound is
exact when each session's credit sits on one node."""
AGG_CELLS_MAX = 2_000_000
"""Cells the pooled bound tables may take."""
MIN_COLUMNS = 64
"""Fewest capacity columns a bound table gets, whatever the cell limits say."""
MIXED_CELLS_MAX = 1_000_000
"""Most table cells spent on per-credit-node lexicographic (k, r, t, count) tables."""
BEAM_SHARE = 4
"""The probe and the exact phase may use ``budget - budget // BEAM_SHARE`` states; the final
beam gets the rest."""
POLISH_MOVES = 4
"""Local-search moves allowed per candidate when polishing an incumbent."""
PROBE_WIDTH = 1024
"""Upper limit on the probe beam's width (it is otherwise sized from the budget)."""


@dataclass(slots=True)
class Solution:
    choice: Choice
    objective: Objective
    exact: bool
    method: str
    states: int
    reason: str | None = None
    diagnostics: SolveDiagnostics = field(default_factory=SolveDiagnostics)


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


def _prepare(d: Dense) -> _Prepared:
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

    items = np.array(sorted(active, key=lambda i: _order_pack(d, i)), dtype=np.int64)
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

    @property
    def tables(self) -> BoundTables:
        """The one argument the kernels take (:data:`shared.core.kernels.BoundTables`)."""
        return (self.node_table, self.node_tab_idx, self.g_node, self.agg, self.g_agg)


def _bounds(p: _Prepared) -> _Bounds:
    """Suffix-knapsack tables for :func:`shared.core.kernels.bound_of` (layout documented
    there). Identical columns share a table; the per-credit-node lexicographic tables are built
    only while they stay within :data:`MIXED_CELLS_MAX`."""
    n, m = p.k.shape
    max_cap = int(p.cap.max()) if m else 0
    several = m >= 2 and bool(((p.k > 0).sum(axis=1) >= 2).any())
    credit_cols = {
        p.k[:, b].tobytes() + p.elig[:, b].tobytes() for b in range(m) if p.k[:, b].any()
    }
    tables = len(credit_cols) + 5 + (m if several else 0)
    g_node = _granularity(max_cap, tables * (n + 1), NODE_CELLS_MAX)
    width = -(-max_cap // g_node)
    wg = p.w // g_node
    ok: np.ndarray = np.asarray(p.elig.any(axis=1), dtype=np.bool_)
    ones = np.ones(n, dtype=np.int64)
    rtc = np.ascontiguousarray(np.stack((p.r, p.t, ones), axis=1))
    node_tab_idx = np.full((m, 4), -1, dtype=np.int64)
    plan: list[tuple[int, np.ndarray]] = []  # (node or -1 for "anywhere", values) per table
    slots: dict[bytes, int] = {}
    size = 0  # tables planned so far (a 2-D ``values`` takes one table per column)

    def slot(kind: str, key: bytes, b: int, values: np.ndarray) -> int:
        nonlocal size
        full = kind.encode() + key
        if full not in slots:
            slots[full] = size
            plan.append((b, values))
            size += 1 if values.ndim == 1 else values.shape[1]
        return slots[full]

    credit_nodes = [b for b in range(m) if bool(p.k[:, b].any())]
    for b in credit_nodes:
        key = p.k[:, b].tobytes() + p.elig[:, b].tobytes()
        node_tab_idx[b, 0] = slot("k", key, b, p.k[:, b])
    # (r, t, count) per node: lexicographic planes plus max Σt and max count, shared by every
    # node, over the sessions eligible anywhere (a superset of each node's own, so still a
    # bound; 5 tables, not 5m)
    node_tab_idx[:, 1] = slot("rtc", b"", -1, rtc)
    slot("t", b"", -1, p.t)
    slot("c", b"", -1, ones)
    # Lagrangian credit tables when some session holds credit on several nodes: λ_i is its
    # second-largest credit, so only the margin over it is counted per node
    lam = np.sort(p.k, axis=1)[:, -2] if several else np.zeros(n, dtype=np.int64)
    if several:
        k_lam = np.maximum(p.k - lam[:, None], 0)
        for b in range(m):
            col = np.ascontiguousarray(k_lam[:, b])
            node_tab_idx[b, 2] = slot("lam", col.tobytes() + p.elig[:, b].tobytes(), b, col)
    mixed = bool(credit_nodes) and len(credit_nodes) * 4 * (n + 1) * (width + 1) <= MIXED_CELLS_MAX
    if mixed:
        for b in credit_nodes:
            kv = np.ascontiguousarray(np.stack((p.k[:, b], p.r, p.t, ones), axis=1))
            key = p.k[:, b].tobytes() + p.elig[:, b].tobytes()
            node_tab_idx[b, 3] = slot("mix", key, b, kv)
    node_table = np.zeros((max(size, 1), n + 1, width + 1), dtype=np.int64)
    at = 0
    for b, col in plan:
        okb = ok if b < 0 else np.ascontiguousarray(p.elig[:, b])
        if col.ndim == 1:
            suffix_knapsack_into(wg, col, okb, node_table[at])
            at += 1
        else:
            q = col.shape[1]
            suffix_knapsack_lex_into(wg, col, okb, node_table[at : at + q])
            at += q
    total = int(p.cap.sum())
    planes = 9 if mixed else (6 if several else 5)
    g_agg = _granularity(total, planes * (n + 1), AGG_CELLS_MAX)
    agg_w = -(-total // g_agg)
    wa = p.w // g_agg
    agg = np.zeros((planes, n + 1, agg_w + 1), dtype=np.int64)
    suffix_knapsack_lex_into(wa, rtc, ok, agg[0:3])
    suffix_knapsack_into(wa, p.t, ok, agg[3])
    suffix_knapsack_into(wa, ones, ok, agg[4])
    if several:  # plane 5: suffix sums of λ over sessions that can be placed at all
        lam_ok = np.where(ok, lam, 0)
        agg[5] = np.concatenate((np.cumsum(lam_ok[::-1])[::-1], [0]))[:, None]
    if mixed:  # planes 6-8: (r, t, count) over the nodes without credit
        others = [b for b in range(m) if b not in credit_nodes]
        ok_o = np.asarray(p.elig[:, others].any(axis=1), dtype=np.bool_) if others else ok & False
        suffix_knapsack_lex_into(wa, rtc, ok_o, agg[6:9])
    return _Bounds(node_table, node_tab_idx, g_node, agg, g_agg)


def _granularity(cap: int, rows: int, cells: int) -> int:
    """Smallest capacity granularity g ≥ 1 with ``rows × (ceil(cap / g) + 1) ≤ cells`` (at
    least :data:`MIN_COLUMNS` columns): coarser tables are still bounds, just looser."""
    columns = max(cells // max(rows, 1) - 1, MIN_COLUMNS)
    return max(1, -(-cap // columns))


def _root_bound(p: _Prepared, bd: _Bounds) -> Objective:
    u = bound_of(p.cap.copy(), 0, bd.tables)
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
    opt = optimistic(used, vals, p.cap, j, bd.tables)
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
    """Layered DP from the root. ``width == 0``: exact (stops incomplete before a layer would
    take the states examined past ``budget``, or when ``expired()``); otherwise a beam keeping
    ``width`` states per layer. A layer examines ``S × (m + 1)`` child states (skip, or each
    node), which is what ``states`` counts and what tracks the time spent.
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
    tables = bd.tables
    for j in range(n):
        if expired is not None and expired():
            return _Search(states, False, path, j)
        if width and used.shape[0] > width:
            keep = np.sort(_rank(p, bd, used, vals, j)[:width])
            used, vals = used[keep], vals[keep]
            parents[-1], moves[-1] = parents[-1][keep], moves[-1][keep]
        examined = used.shape[0] * (m + 1)  # every state tries skip and each node
        if width == 0 and states + examined > budget:
            return _Search(states, False, path, j)
        cand = (int(p.w[j]), p.elig[j], p.k[j], int(p.r[j]), int(p.t[j]))
        n_used, n_vals, n_parent, n_move, count, lb_slot = expand_layer(
            used, vals, p.cap, p.group_start, cand, j + 1, tables, lb, examined
        )
        if count < 0:  # cannot happen: max_out is every child this layer can make
            raise AssertionError("expand_layer overflowed its own bound")
        states += examined
        used, vals = n_used[:count], n_vals[:count]
        parents.append(n_parent[:count])
        moves.append(n_move[:count])
        if lb_slot >= 0:
            path = _trace(parents, moves, j, lb_slot)
        if count == 0:
            break
    return _Search(states, True, path, n)


def _portfolio(d: Dense) -> tuple[Choice, Objective, str, tuple[tuple[str, Objective], ...], bool]:
    """The best of the portfolio heuristics: its choice, objective and name, each heuristic's
    objective in order, and whether it admits everyone on their best node (a bound that needs
    no tables; the portfolio stops at the first heuristic that meets it)."""
    active = d.elig.any(axis=1) if d.m else np.zeros(d.n, dtype=np.bool_)
    everyone = Objective(
        int(d.kmax[active].sum()),
        int(d.r[active].sum()),
        int(d.t[active].sum()),
        int(active.sum()),
    )
    best_choice: Choice = [-1] * d.n
    best_obj = objective_of(d, best_choice)
    best_method = "empty"
    heur: list[tuple[str, Objective]] = []
    for name, fn in PORTFOLIO:
        ch = fn(d)
        obj = objective_of(d, ch)
        heur.append((name, obj))
        if obj > best_obj:
            best_choice, best_obj, best_method = ch, obj, name
        if best_obj == everyone:
            return best_choice, best_obj, best_method, tuple(heur), True
    return best_choice, best_obj, best_method, tuple(heur), False


def solve(d: Dense, *, budget: int, expired: Callable[[], bool] | None = None) -> Solution:
    """Best placement for ``d`` (see the module docstring). Deterministic when ``expired`` is
    ``None``. States examined stay within ``budget``, except that the probe beam is at least
    one state wide, which can pass a tiny budget by up to n × (m + 1). ``expired`` is checked
    between DP and beam layers only: the portfolio and the bound tables always run."""
    best_choice, best_obj, best_method, heur, met = _portfolio(d)
    groups: int | None = None
    root: Objective | None = None

    def diag(
        proof: Literal["bound", "dp"] | None = None, beam: int | None = None
    ) -> SolveDiagnostics:
        return SolveDiagnostics(
            heuristics=heur, proof=proof, groups=groups, root_bound=root, beam_width=beam
        )

    if met:  # nothing can beat admitting everyone at their best
        return Solution(best_choice, best_obj, True, best_method, 0, None, diag("bound"))
    polished = _polish(d, best_choice)
    if polished is not None and objective_of(d, polished) > best_obj:
        best_choice, best_obj = polished, objective_of(d, polished)
        best_method += "+ls"
    p = _prepare(d)
    n, m = p.k.shape
    groups = p.groups
    if n == 0 or m == 0:  # (the "everyone" test above has already returned then)
        return Solution(best_choice, best_obj, True, best_method, 0, None, diag("bound"))
    bd = _bounds(p)
    root = _root_bound(p, bd)
    if best_obj == root:
        return Solution(best_choice, best_obj, True, best_method, 0, None, diag("bound"))

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
            best_method += "" if best_method.endswith("+ls") else "+ls"
            lb[:] = np.array(best_obj, dtype=np.int64)

    # A narrow beam first: a strong incumbent makes the exact search prune far more.
    probe_width = max(1, min(PROBE_WIDTH, budget // (2 * BEAM_SHARE * n * (m + 1))))
    probe = _search(p, bd, lb, width=probe_width, budget=budget, expired=expired)
    states += probe.states
    adopt(probe, "dp-beam", p)
    if best_obj == root:
        return Solution(best_choice, best_obj, True, best_method, states, None, diag("bound"))
    exact_budget = budget - budget // BEAM_SHARE - states
    exact = _search(p, bd, lb, width=0, budget=exact_budget, expired=expired)
    states += exact.states
    adopt(exact, "dp", p)
    if exact.complete:
        return Solution(best_choice, best_obj, True, best_method, states, None, diag("dp"))
    timed_out = expired is not None and expired()
    reason = (
        f"time limit reached at layer {exact.layer_reached} of {n}"
        if timed_out
        else f"state budget {budget} exhausted at layer {exact.layer_reached} of {n}"
    )
    beam_width: int | None = None
    if not timed_out:
        # Not proven: spend the rest on a wider beam.
        width = _beam_width(budget, states, n, m)
        if width > probe_width:
            beam = _search(p, bd, lb, width=width, budget=budget, expired=expired)
            states += beam.states
            adopt(beam, "dp-beam", p)
            beam_width = width
    return Solution(
        best_choice, best_obj, False, best_method, states, reason, diag(beam=beam_width)
    )


def warm_up() -> None:
    """Load every kernel once (from numba's on-disk cache, or compile it) on a tiny snapshot,
    so that the first real solve is not charged for it. Services call this at start-up."""
    from shared.core.problem import Candidate, Node, Problem, densify

    nodes = (Node("a", 4096), Node("b", 4096), Node("c", 2048), Node("d", 2048))
    credits: tuple[dict[str, int], ...] = ({"a": 512}, {"a": 512, "b": 1024}, {})
    cands = tuple(
        Candidate(f"s{i}", 1024 + 512 * i, 900 + 400 * i, i % 2, credits[i % 3]) for i in range(10)
    )
    d = densify(Problem(512, nodes, cands))
    for budget in (10_000, 50):  # the exact search, then the beam fallback
        solve(d, budget=budget)
    p = _prepare(d)
    bd = _bounds(p)
    for width in (0, 1):  # the exact search and the beam, whatever solve() needed above
        _search(p, bd, np.zeros(4, dtype=np.int64), width=width, budget=10_000, expired=None)
