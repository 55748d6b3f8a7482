"""First-come-first-served request routing, the loop shared by the router baselines.

vLLM/SGLang's cache-aware router and Dynamo's KV router place one request at a time: each
candidate, in arrival order, goes to a node chosen by the router's rule among the nodes that
can take it now (eligible and with room); the node's load then grows by the candidate's tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.core.problem import Dense

Pick = Callable[[int, list[int], list[int]], int]
"""``pick(i, fits, load) -> node``: the router's rule for candidate ``i`` over the nodes that
fit, given each node's current load in tokens."""


def route_fcfs(d: Dense, pick: Pick) -> list[int]:
    """Choice vector of routing the pool FCFS with ``pick`` (candidates that fit nowhere stay
    unplaced)."""
    choice = [-1] * d.n
    rem = [int(c) for c in d.cap]
    load = [int(x) for x in d.load]
    for i in range(d.n):
        wi = int(d.w[i])
        fits = [b for b in range(d.m) if d.elig[i, b] and wi <= rem[b]]
        if not fits:
            continue
        b = pick(i, fits, load)
        choice[i] = b
        rem[b] -= wi
        load[b] += int(d.t[i])
    return choice
