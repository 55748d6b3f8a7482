"""Exhaustive oracle for tiny dense problems (tests only).

Enumerates every feasible assignment (each candidate skipped or put on one eligible node)
by depth-first search with capacity pruning and keeps the lexicographically best objective.
At most ``(m + 1) ** n`` leaves, so it is limited to ``n <= 7`` and ``m <= 3``.
"""

from __future__ import annotations

from shared.core.problem import ZERO, Dense, Objective

MAX_N = 7
MAX_M = 3


def brute_force(d: Dense) -> tuple[tuple[int, ...], Objective]:
    """The best choice vector (``-1`` = not admitted) and its objective.

    Among equal objectives the first found wins; the search tries "skip" before nodes in
    index order, so the answer is deterministic.
    """
    n, m = d.n, d.m
    if n > MAX_N or m > MAX_M:
        raise ValueError(f"brute_force: n <= {MAX_N} and m <= {MAX_M} only, got n={n}, m={m}")
    w = [int(x) for x in d.w]
    r = [int(x) for x in d.r]
    t = [int(x) for x in d.t]
    k = [[int(d.k[i, b]) for b in range(m)] for i in range(n)]
    options = [[b for b in range(m) if bool(d.elig[i, b])] for i in range(n)]
    left = [int(x) for x in d.cap]
    choice = [-1] * n
    best: list[tuple[tuple[int, ...], Objective]] = [(tuple(choice), ZERO)]

    def visit(i: int, kk: int, rr: int, tt: int, cnt: int) -> None:
        if i == n:
            value = Objective(kk, rr, tt, cnt)
            if value > best[0][1]:
                best[0] = (tuple(choice), value)
            return
        visit(i + 1, kk, rr, tt, cnt)
        for b in options[i]:
            if w[i] <= left[b]:
                left[b] -= w[i]
                choice[i] = b
                visit(i + 1, kk + k[i][b], rr + r[i], tt + t[i], cnt + 1)
                choice[i] = -1
                left[b] += w[i]

    visit(0, 0, 0, 0, 0)
    return best[0]
