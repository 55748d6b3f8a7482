"""Every numba kernel agrees with its slow twin in ``shared.core.reference`` on small inputs."""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace
from typing import Any

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from shared.core import kernels, planner, reference
from shared.core.problem import Dense, is_feasible, objective_of

NO_JIT = os.environ.get("NUMBA_DISABLE_JIT") == "1"
FEW = 60 if NO_JIT else 120
MANY = 150 if NO_JIT else 300

small = st.integers(-(10**12), 10**12)
tiny = st.integers(-2, 2)


def i64(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


class TestLexCmp:
    @given(
        a=st.tuples(tiny, tiny, tiny, tiny) | st.tuples(small, small, small, small),
        b=st.tuples(tiny, tiny, tiny, tiny) | st.tuples(small, small, small, small),
    )
    @settings(max_examples=MANY, deadline=None)
    def test_matches_tuple_comparison(self, a: tuple[int, ...], b: tuple[int, ...]) -> None:
        """lex_cmp is the sign of Python's tuple comparison."""
        assert kernels.lex_cmp(*a, *b) == reference.lex_cmp(*a, *b)
        assert kernels.lex_cmp(*a, *a) == 0


@st.composite
def items(draw: st.DrawFn, max_n: int = 7, value: st.SearchStrategy[int] | None = None) -> Any:
    n = draw(st.integers(0, max_n))
    w = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    v = draw(st.lists(value or st.integers(-3, 20), min_size=n, max_size=n))
    ok = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    cap = draw(st.integers(0, 15))
    return i64(w).reshape(n), i64(v).reshape(n), np.array(ok, dtype=np.bool_).reshape(n), cap


class TestSuffixKnapsack:
    @given(items())
    @settings(max_examples=MANY, deadline=None)
    def test_table_matches_enumeration(self, case: Any) -> None:
        """Every cell is the best subset value of the allowed suffix items within the capacity."""
        w, v, ok, cap = case
        table = kernels.suffix_knapsack(w, v, ok, cap)
        assert table.tolist() == reference.suffix_knapsack(w, v, ok, cap)

    @given(items())
    @settings(max_examples=FEW, deadline=None)
    def test_into_fills_the_same_table(self, case: Any) -> None:
        """suffix_knapsack_into writes the same table into a zeroed array (rows or columns of a
        larger array included, as the planner passes them)."""
        w, v, ok, cap = case
        table = np.zeros((2, w.shape[0] + 1, cap + 1), dtype=np.int64)
        kernels.suffix_knapsack_into(w, v, ok, table[1])
        want = np.zeros_like(table[1])
        reference.suffix_knapsack_into(w, v, ok, want)
        assert table[1].tolist() == want.tolist()
        assert not table[0].any()
        wide = np.zeros((w.shape[0], 2), dtype=np.bool_)
        wide[:, 1] = ok
        column = np.zeros((w.shape[0] + 1, cap + 1), dtype=np.int64)
        kernels.suffix_knapsack_into(w, v, wide[:, 1], column)
        assert column.tolist() == want.tolist()


class TestSuffixKnapsackLex:
    @given(items(), st.integers(1, 4), st.data())
    @settings(max_examples=MANY, deadline=None)
    def test_planes_match_enumeration(self, case: Any, q: int, data: st.DataObject) -> None:
        """Every cell holds the lexicographically best sum of value rows over the allowed suffix
        items within the capacity (rows may be zero or negative in leading components)."""
        w, _, ok, cap = case
        n = w.shape[0]
        flat = data.draw(st.lists(st.integers(-2, 4), min_size=n * q, max_size=n * q))
        vals = i64(flat).reshape(n, q)
        got = np.zeros((q + 1, n + 1, cap + 1), dtype=np.int64)
        kernels.suffix_knapsack_lex_into(w, vals, ok, got[1:])
        want = np.zeros((q, n + 1, cap + 1), dtype=np.int64)
        reference.suffix_knapsack_lex_into(w, vals, ok, want)
        assert got[1:].tolist() == want.tolist()
        assert not got[0].any()


@st.composite
def lex_items(draw: st.DrawFn) -> Any:
    n = draw(st.integers(0, 8))
    w = draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
    row = st.tuples(st.integers(-2, 6), st.integers(-1, 2), st.integers(-2, 9), st.integers(0, 1))
    vals = draw(st.lists(row, min_size=n, max_size=n))
    cap = draw(st.integers(0, 20))
    return i64(w).reshape(n), i64(vals).reshape(n, 4), cap


class TestKnapsackLex:
    @given(lex_items())
    @settings(max_examples=MANY, deadline=None)
    def test_mask_is_feasible_and_lexicographically_best(self, case: Any) -> None:
        """The mask fits the capacity and its value equals the best over all subsets."""
        w, vals, cap = case
        mask = kernels.knapsack_lex(w, vals, cap)
        assert int(w[mask].sum()) <= cap
        got = tuple(int(x) for x in vals[mask].sum(axis=0)) if mask.any() else (0, 0, 0, 0)
        _, best = reference.lex_knapsack_best(w, vals, cap)
        assert got == best
        ref_mask = np.array(reference.knapsack_lex(w, vals, cap), dtype=np.bool_)
        assert int(w[ref_mask].sum()) <= cap


@dataclass(frozen=True)
class LayerCase:
    """One call's worth of expand_layer arguments, nodes grouped consistently."""

    used: np.ndarray
    vals: np.ndarray
    cap: np.ndarray
    group_start: np.ndarray
    wi: int
    elig_row: np.ndarray
    k_row: np.ndarray
    ri: int
    ti: int
    j_next: int
    node_table: np.ndarray
    node_tab_idx: np.ndarray
    g_node: int
    agg: np.ndarray
    g_agg: int
    lb: np.ndarray
    max_out: int

    @property
    def cand(self) -> kernels.Candidate:
        return (self.wi, self.elig_row, self.k_row, self.ri, self.ti)

    @property
    def tables(self) -> kernels.BoundTables:
        return (self.node_table, self.node_tab_idx, self.g_node, self.agg, self.g_agg)

    def args(self, lb: np.ndarray | None = None) -> tuple[Any, ...]:
        return (
            self.used,
            self.vals,
            self.cap,
            self.group_start,
            self.cand,
            self.j_next,
            self.tables,
            self.lb.copy() if lb is None else lb,
            self.max_out,
        )


@st.composite
def layers(draw: st.DrawFn, *, huge_bound: bool = False, low_lb: bool = False) -> LayerCase:
    """Parents in canonical form (int32 or int64, as the planner passes them) over 1–4 nodes
    in contiguous interchangeable groups (equal capacity, eligibility, credit and bound table
    within a group), random bound tables."""
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).filter(lambda s: sum(s) <= 4))
    group_start: list[int] = []
    cap: list[int] = []
    elig: list[bool] = []
    k_row: list[int] = []
    tab_idx: list[list[int]] = []
    n_tables = draw(st.integers(5, 7))
    lagrangian = draw(st.booleans())
    mixed = draw(st.booleans())
    for size in sizes:
        start = len(group_start)
        c, e, k = draw(st.integers(0, 8)), draw(st.booleans()), draw(st.integers(0, 5))
        ti = draw(st.integers(0 if huge_bound else -1, n_tables - 1))
        ci = draw(st.integers(0 if huge_bound else -1, n_tables - 5))
        li = draw(st.integers(0, n_tables - 1)) if lagrangian else -1
        xi = draw(st.integers(-1, n_tables - 4)) if mixed else -1
        group_start += [start] * size
        cap += [c] * size
        elig += [e] * size
        k_row += [k] * size
        tab_idx += [[ti, ci, li, xi]] * size
    m = len(cap)
    s_count = draw(st.integers(1, 6))
    used = []
    for _ in range(s_count):
        row = [draw(st.integers(0, c)) for c in cap]
        used.append(list(reference.canonical(row, group_start)))
    vals = [draw(st.tuples(*[st.integers(0, 6)] * 4)) for _ in range(s_count)]
    j_next = draw(st.integers(0, 3))
    g_node = draw(st.integers(1, 3))
    g_agg = draw(st.integers(1, 4))
    width = -(-max(cap) // g_node)
    agg_width = -(-sum(cap) // g_agg)
    table_values = st.integers(10**9, 10**9 + 5) if huge_bound else st.integers(0, 6)
    node_table = np.array(
        draw(
            st.lists(
                table_values,
                min_size=n_tables * 4 * (width + 1),
                max_size=n_tables * 4 * (width + 1),
            )
        ),
        dtype=np.int64,
    ).reshape(n_tables, 4, width + 1)
    planes = 9 if mixed else (6 if lagrangian else 5)
    agg = np.array(
        draw(
            st.lists(
                table_values,
                min_size=planes * 4 * (agg_width + 1),
                max_size=planes * 4 * (agg_width + 1),
            )
        ),
        dtype=np.int64,
    ).reshape(planes, 4, agg_width + 1)
    lb = [-(10**15)] * 4 if low_lb else list(draw(st.tuples(*[st.integers(0, 14)] * 4)))
    max_out = draw(st.integers(0, s_count * (m + 1) + 1)) if not huge_bound else s_count * (m + 1)
    return LayerCase(
        used=np.array(used, dtype=draw(st.sampled_from([np.int32, np.int64]))).reshape(s_count, m),
        vals=i64(vals).reshape(s_count, 4),
        cap=i64(cap),
        group_start=i64(group_start),
        wi=draw(st.integers(0, 4)),
        elig_row=np.array(elig, dtype=np.bool_),
        k_row=i64(k_row),
        ri=draw(st.integers(0, 1)),
        ti=draw(st.integers(0, 5)),
        j_next=j_next,
        node_table=node_table,
        node_tab_idx=i64(tab_idx).reshape(m, 4),
        g_node=g_node,
        agg=agg,
        g_agg=g_agg,
        lb=i64(lb),
        max_out=max_out,
    )


def kernel_children(out: tuple[Any, ...]) -> dict[tuple[int, ...], reference.Child]:
    n_used, n_vals, n_parent, n_move, count, _ = out
    children = {}
    for s in range(count):
        key = tuple(int(x) for x in n_used[s])
        assert key not in children, "duplicate canonical state"
        children[key] = reference.Child(
            tuple(int(x) for x in n_vals[s]), int(n_parent[s]), int(n_move[s])
        )
    return children


def bound(case: LayerCase, state: tuple[int, ...]) -> reference.Value:
    rem = case.cap - i64(state)
    return reference.bound_of(rem, case.j_next, case.tables)


def plus(a: reference.Value, b: reference.Value) -> reference.Value:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3])


class TestBoundOf:
    @given(layers())
    @settings(max_examples=MANY, deadline=None)
    def test_matches_formula(self, case: LayerCase) -> None:
        """The kernel's bound equals the written-out formula for every parent state."""
        for s in range(case.used.shape[0]):
            rem = case.cap - case.used[s].astype(np.int64)
            for j in range(case.node_table.shape[1]):
                got = kernels.bound_of(rem, j, case.tables)
                want = reference.bound_of(rem, j, case.tables)
                assert tuple(int(x) for x in got) == want


class TestOptimistic:
    @given(layers())
    @settings(max_examples=FEW, deadline=None)
    def test_is_value_plus_bound_per_state(self, case: LayerCase) -> None:
        """Each row is the state's value plus the bound at its remaining capacity."""
        for j in range(case.node_table.shape[1]):
            got = kernels.optimistic(case.used, case.vals, case.cap, j, case.tables)
            want = reference.optimistic(case.used, case.vals, case.cap, j, case.tables)
            assert [tuple(int(x) for x in row) for row in got] == want


class TestExpandLayer:
    @given(layers())
    @settings(max_examples=MANY, deadline=None)
    def test_matches_reference(self, case: LayerCase) -> None:
        """Same surviving states, values, parents, moves, raised incumbent and overflow."""
        lb = case.lb.copy()
        out = kernels.expand_layer(*case.args(lb))
        ref = reference.expand_layer(*case.args())
        assert (out[4] == -1) == ref.overflow
        if ref.overflow:
            return
        assert kernel_children(out) == ref.children
        assert tuple(int(x) for x in lb) == ref.lb
        slot = out[5]
        assert (None if slot < 0 else tuple(int(x) for x in out[0][slot])) == ref.last_raise

    @given(layers(huge_bound=True, low_lb=True))
    @settings(max_examples=FEW, deadline=None)
    def test_without_pruning_keeps_every_canonical_child(self, case: LayerCase) -> None:
        """With a bound no value can reach, the children are every canonical child, best value
        each (the symmetry shortcut loses nothing)."""
        out = kernels.expand_layer(*case.args())
        got = {key: c.value for key, c in kernel_children(out).items()}
        want = reference.layer_children(case.used, case.vals, case.cap, case.group_start, case.cand)
        assert got == want

    @given(layers())
    @settings(max_examples=MANY, deadline=None)
    def test_pruning_keeps_every_state_that_can_beat_the_incumbent(self, case: LayerCase) -> None:
        """A child whose best value plus bound beats the final incumbent is kept, with that
        value; nothing kept is outside the unpruned child set or above its best value."""
        lb = case.lb.copy()
        out = kernels.expand_layer(*case.args(lb))
        if out[4] == -1:
            return
        kept = kernel_children(out)
        final = tuple(int(x) for x in lb)
        every = reference.layer_children(
            case.used, case.vals, case.cap, case.group_start, case.cand
        )
        for key, value in every.items():
            if plus(value, bound(case, key)) > final:
                assert key in kept and kept[key].value == value
        for key, child in kept.items():
            assert key in every and child.value <= every[key]
        assert final >= tuple(int(x) for x in case.lb)


@st.composite
def dense_problems(draw: st.DrawFn, max_n: int = 6, max_m: int = 3) -> Dense:
    """A small dense snapshot (eligibility already includes fits-at-all, k zero elsewhere)."""
    n = draw(st.integers(0, max_n))
    m = draw(st.integers(1, max_m))
    cap = i64(draw(st.lists(st.integers(0, 8), min_size=m, max_size=m)))
    w = i64(draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))).reshape(n)
    allowed = np.array(
        draw(st.lists(st.booleans(), min_size=n * m, max_size=n * m)), dtype=np.bool_
    ).reshape(n, m)
    elig = allowed & (w[:, None] <= cap[None, :])
    k = i64(draw(st.lists(st.integers(0, 5), min_size=n * m, max_size=n * m))).reshape(n, m)
    k = np.where(elig, k, 0).astype(np.int64)
    r = i64(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))).reshape(n)
    t = i64(draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))).reshape(n)
    return Dense(
        w=w,
        cap=cap,
        k=k,
        r=r,
        t=t,
        elig=elig,
        load=np.zeros(m, dtype=np.int64),
        node_ids=tuple(f"n{b}" for b in range(m)),
        cand_ids=tuple(f"s{i}" for i in range(n)),
    )


@st.composite
def started(draw: st.DrawFn) -> tuple[Dense, list[int]]:
    """A dense snapshot and a feasible starting choice, built greedily in a drawn order."""
    d = draw(dense_problems())
    rem = [int(c) for c in d.cap]
    choice = [-1] * d.n
    for i in draw(st.permutations(range(d.n))):
        options = [b for b in range(d.m) if d.elig[i, b] and rem[b] >= d.w[i]]
        b = draw(st.sampled_from([-1, *options]))
        if b >= 0:
            choice[i] = b
            rem[b] -= int(d.w[i])
    return d, choice


class TestImprove:
    @given(started(), st.integers(0, 12))
    @settings(max_examples=MANY, deadline=None)
    def test_matches_reference_and_never_worsens(self, case: Any, max_moves: int) -> None:
        """Same moves as the twin; the result is feasible and no worse (strictly better when
        it moved)."""
        d, choice = case
        arr = i64(choice).reshape(d.n)
        moved = kernels.improve(arr, d.w, d.cap, d.k, d.r, d.t, d.elig, max_moves)
        after = [int(x) for x in arr]
        ref_choice, ref_moves = reference.improve(
            choice, d.w, d.cap, d.k, d.r, d.t, d.elig, max_moves
        )
        assert (after, moved) == (ref_choice, ref_moves)
        assert moved <= max_moves
        assert is_feasible(d, after)
        before, now = objective_of(d, choice), objective_of(d, after)
        assert now >= before
        assert (now > before) == (moved > 0)


def completion_values(d: Dense, j: int, rem: list[int]) -> list[tuple[int, int, int, int]]:
    """The value of every choice of items ``j..`` that fits in ``rem``."""
    values = []
    options = [[-1, *(b for b in range(d.m) if d.elig[i, b])] for i in range(j, d.n)]
    for tail in itertools.product(*options):
        used = [0] * d.m
        total = [0, 0, 0, 0]
        for i, b in enumerate(tail, start=j):
            if b >= 0:
                used[b] += int(d.w[i])
                for x, v in enumerate((int(d.k[i, b]), int(d.r[i]), int(d.t[i]), 1)):
                    total[x] += v
        if all(u <= c for u, c in zip(used, rem, strict=True)):
            values.append((total[0], total[1], total[2], total[3]))
    return values


def planner_bounds(d: Dense, node_cells: int, agg_cells: int) -> tuple[Dense, Any]:
    """The planner's own bound tables (credit, Lagrangian, per-node and pooled r/t/count, mixed)
    for ``d``, with the cell limits lowered so coarse granularities are exercised too. Returns
    ``d`` re-laid in the planner's candidate order, and the tables."""
    names = ("NODE_CELLS_MAX", "AGG_CELLS_MAX", "MIN_COLUMNS")
    saved = tuple(getattr(planner, x) for x in names)
    for x, v in zip(names, (node_cells, agg_cells, 1), strict=True):
        setattr(planner, x, v)
    try:
        prep = planner._prepare(d)
        bounds = planner._bounds(prep)
    finally:
        for x, v in zip(names, saved, strict=True):
            setattr(planner, x, v)
    ordered = replace(
        d,
        w=prep.w,
        cap=prep.cap,
        k=prep.k,
        r=prep.r,
        t=prep.t,
        elig=prep.elig,
        cand_ids=tuple(d.cand_ids[int(i)] for i in prep.items),
        node_ids=tuple(d.node_ids[int(b)] for b in prep.node_perm),
    )
    return ordered, bounds


class TestBoundIsABound:
    @given(dense_problems(max_n=6), st.integers(1, 400), st.integers(1, 400), st.data())
    @settings(max_examples=FEW, deadline=None)
    def test_bound_dominates_every_component(
        self, d: Dense, node_cells: int, agg_cells: int, data: st.DataObject
    ) -> None:
        """bound_of over the planner's tables is lexicographically at least every value items
        ``j..`` can add within the remaining capacities (so it never prunes an optimum), and its
        credit component is at least the largest Σk alone."""
        od, bd = planner_bounds(d, node_cells, agg_cells)
        j = data.draw(st.integers(0, od.n))
        rem = [data.draw(st.integers(0, int(c))) for c in od.cap]
        got = kernels.bound_of(i64(rem), j, bd.tables)
        assert tuple(int(x) for x in got) == reference.bound_of(i64(rem), j, bd.tables)
        values = completion_values(od, j, rem)
        bound = tuple(int(x) for x in got)
        assert bound >= max(values)
        assert bound[0] >= max(v[0] for v in values)


class TestEveryKernelHasATwin:
    def test_public_kernels_have_reference_twins(self) -> None:
        """Every public function in ``kernels`` has a same-named twin in ``reference``."""
        public = [
            name
            for name, obj in vars(kernels).items()
            if not name.startswith("_") and getattr(obj, "__module__", "") == kernels.__name__
        ]
        assert public
        assert [name for name in public if not hasattr(reference, name)] == []
