"""Cheap placement heuristics on the dense snapshot.

They serve three roles: the planner's portfolio (its incumbent, and its answer when the exact
search runs out of budget), the ``short-first`` baseline, and the ``tao-bfd`` ablation. Each
returns a feasible choice vector (``choice[i]`` = node index or -1). All are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cmp_to_key

import numpy as np

from shared.core.kernels import knapsack_lex
from shared.core.problem import Dense

Choice = list[int]


def _remaining(d: Dense) -> list[int]:
    return [int(x) for x in d.cap]


def _pick_node(d: Dense, i: int, rem: Sequence[int], *, affinity: bool) -> int:
    """The node for ``i``: most credit first when ``affinity``, then the tightest fit, then the
    lowest index. -1 when it fits nowhere."""
    wi = int(d.w[i])
    best = -1
    best_key: tuple[int, int, int] | None = None
    for b in range(d.m):
        if not d.elig[i, b] or rem[b] < wi:
            continue
        key = (int(d.k[i, b]) if affinity else 0, -(rem[b] - wi), -b)
        if best_key is None or key > best_key:
            best, best_key = b, key
    return best


def _greedy(
    d: Dense,
    order: Sequence[int],
    *,
    affinity: bool = True,
    start: Choice | None = None,
    rem: list[int] | None = None,
) -> Choice:
    choice = list(start) if start is not None else [-1] * d.n
    rem = rem if rem is not None else _remaining(d)
    for i in order:
        if choice[i] >= 0:
            continue
        b = _pick_node(d, i, rem, affinity=affinity)
        if b >= 0:
            choice[i] = b
            rem[b] -= int(d.w[i])
    return choice


def _value_keys(d: Dense) -> list[tuple[int, int, int]]:
    """(best credit, readiness, tokens) per session: its value on its best node."""
    return list(zip(d.kmax.tolist(), d.r.tolist(), d.t.tolist(), strict=True))


def bfd(d: Dense, *, affinity: bool = True) -> Choice:
    """Best-fit-decreasing: largest weight first (ties: higher value, then input order), each on
    the node with the most credit for it (``affinity``), then the tightest fit."""
    vk = _value_keys(d)
    order = sorted(range(d.n), key=lambda i: (-int(d.w[i]), tuple(-x for x in vk[i]), i))
    return _greedy(d, order, affinity=affinity)


def short_first(d: Dense) -> Choice:
    """Short-first affinity greedy (the paper's Figures 10-11 baseline): smallest weight first,
    each on its affinity node (most credit) if it fits there, else the tightest fit."""
    vk = _value_keys(d)
    order = sorted(range(d.n), key=lambda i: (int(d.w[i]), tuple(-x for x in vk[i]), i))
    return _greedy(d, order, affinity=True)


def _density_order(d: Dense) -> list[int]:
    """Sessions by lexicographic value per quantum, densest first, compared exactly by integer
    cross-multiplication (no floats); ties by input order."""
    keys = [(v, max(int(w), 1)) for v, w in zip(_value_keys(d), d.w.tolist(), strict=True)]

    def cmp(a: int, b: int) -> int:
        (va, wa), (vb, wb) = keys[a], keys[b]
        for x, y in zip(va, vb, strict=True):
            lhs, rhs = x * wb, y * wa
            if lhs != rhs:
                return -1 if lhs > rhs else 1
        return -1 if a < b else (1 if a > b else 0)

    return sorted(range(d.n), key=cmp_to_key(cmp))


def value_density(d: Dense) -> Choice:
    """Greedy by lexicographic value per quantum, affinity then tightest fit."""
    return _greedy(d, _density_order(d), affinity=True)


def _credit_knapsacks(d: Dense) -> tuple[Choice, list[int]]:
    """Credit holders placed by exact per-node knapsacks with deferred acceptance.

    Each session with credit proposes to its highest-credit node; every node keeps the exact
    lexicographically best (k, r, t, 1) subset of its proposers within its capacity and rejects
    the rest, who propose to their next node with credit. Rounds repeat until no proposal is
    left (each session proposes to each credit node at most once, so it ends). With credit on
    one node per session this is one round of independent knapsacks, so Σk is optimal.
    Returns the choice and the capacity left per node.
    """
    prefs: list[list[int]] = []
    for i in range(d.n):
        nodes = [b for b in range(d.m) if int(d.k[i, b]) > 0]
        prefs.append(sorted(nodes, key=lambda b: (-int(d.k[i, b]), b)))
    nxt = [0] * d.n
    held: list[list[int]] = [[] for _ in range(d.m)]
    proposing = [i for i in range(d.n) if prefs[i]]
    while proposing:
        touched: dict[int, list[int]] = {}
        for i in proposing:
            b = prefs[i][nxt[i]]
            nxt[i] += 1
            touched.setdefault(b, []).append(i)
        proposing = []
        for b in sorted(touched):
            items = held[b] + touched[b]
            w = np.array([int(d.w[i]) for i in items], dtype=np.int64)
            vals = np.array(
                [[int(d.k[i, b]), int(d.r[i]), int(d.t[i]), 1] for i in items], dtype=np.int64
            ).reshape(len(items), 4)
            mask = knapsack_lex(w, vals, int(d.cap[b]))
            held[b] = [i for pos, i in enumerate(items) if mask[pos]]
            proposing += [
                i for pos, i in enumerate(items) if not mask[pos] and nxt[i] < len(prefs[i])
            ]
        proposing.sort()
    choice = [-1] * d.n
    rem = _remaining(d)
    for b in range(d.m):
        for i in held[b]:
            choice[i] = b
            rem[b] -= int(d.w[i])
    return choice, rem


def k_first_ready(d: Dense) -> Choice:
    """The credit knapsacks of :func:`k_first`, then ready sessions smallest first (the most
    ready sessions fit), then the rest by value density; tightest fit throughout."""
    choice, rem = _credit_knapsacks(d)
    dens = _density_order(d)
    rank = {i: pos for pos, i in enumerate(dens)}
    order = sorted(range(d.n), key=lambda i: (-int(d.r[i]), int(d.w[i]) if d.r[i] else 0, rank[i]))
    return _greedy(d, order, affinity=True, start=choice, rem=rem)


def k_first(d: Dense) -> Choice:
    """Exact per-node credit knapsacks, then a fill.

    Sessions with credit are placed by exact per-node knapsacks with lexicographic values
    (k, r, t, 1) and deferred acceptance (see :func:`_credit_knapsacks`; Σk is optimal when
    each session's credit sits on one node). The rest is filled by value density, tightest fit.
    """
    choice, rem = _credit_knapsacks(d)
    return _greedy(d, _density_order(d), affinity=True, start=choice, rem=rem)


def ready_tokens_fill(d: Dense) -> Choice:
    """Credit holders first at home, then by (readiness, tokens) descending, tightest fit."""
    vk = _value_keys(d)
    order = sorted(range(d.n), key=lambda i: (tuple(-x for x in vk[i]), i))
    return _greedy(d, order, affinity=True)


PORTFOLIO: tuple[tuple[str, Callable[[Dense], Choice]], ...] = (
    ("k-first", k_first),
    ("k-first-ready", k_first_ready),
    ("density", value_density),
    ("bfd", bfd),
    ("short-first", short_first),
    ("value-greedy", ready_tokens_fill),
)
"""Heuristics the planner always runs on the same snapshot; the best one is its incumbent."""


def balance(d: Dense, choice: Sequence[int]) -> Choice:
    """Spread a plan over equally valued nodes without changing its value or feasibility.

    The lexicographic value of a pair differs across nodes only by its credit ``k[i, b]``
    (``r`` and ``t`` belong to the session), so moving session ``i`` from node ``b`` to a node
    ``b2`` where it is eligible with the same credit leaves the objective unchanged. Among such
    equal-valued plans the DP's pick is arbitrary (ties go to the lower node index), which would
    pile sessions without credit onto the first node. This pass moves sessions, largest first,
    to the equal-valued node with the most remaining capacity whenever that node stays freer
    than the source was (``rem[b2] - w > rem[b]``); each move strictly lowers the sum of
    squared remaining capacities, so it terminates, and it never breaks a capacity.
    """
    out = [int(b) for b in choice]
    rem = _remaining(d)
    for i, b in enumerate(out):
        if b >= 0:
            rem[b] -= int(d.w[i])
    order = sorted((i for i, b in enumerate(out) if b >= 0), key=lambda i: (-int(d.w[i]), i))
    moved = True
    while moved:
        moved = False
        for i in order:
            b, wi = out[i], int(d.w[i])
            best = -1
            for b2 in range(d.m):
                if b2 == b or not d.elig[i, b2] or d.k[i, b2] != d.k[i, b]:
                    continue
                if rem[b2] - wi > rem[b] and (best < 0 or rem[b2] > rem[best]):
                    best = b2
            if best >= 0:
                rem[b] += wi
                rem[best] -= wi
                out[i] = best
                moved = True
    return out
