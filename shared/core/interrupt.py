"""Interrupt rule (DESIGN 3.3, paper §2.2): which tool-running sessions release their admission.

Tool-running admitted sessions are the interrupt candidates. The pool's demand *cannot be met*
when ``deficit = demand - free > 0``, where ``demand`` is Σ raw weights (tokens) of the pooled
sessions and ``free`` is Σ free capacity (tokens) over the nodes. Raw tokens, not quanta:
interrupting a session frees exactly its raw weight, and the planner re-checks the exact
per-node fit on the discretised snapshot afterwards.

Then candidates are interrupted in ascending value order until the freed weight covers the
deficit (``freed >= deficit``) or none are left:

- sort key ``(k, r, t, -weight, id)``: the credit on the node the session holds, readiness,
  tokens; among equal values the larger weight goes first (fewer interruptions free the same
  room), and the session id makes the order total and deterministic;
- a session with ``r = 1`` is never interrupted (it is about to need the GPU again).

The rule is deliberately pool-wide: freed room on one node may only help pooled sessions that
are eligible there, and the planner decides who actually uses it. ``freed_per_node`` lets the
caller add the freed room back to each node's free capacity before planning.

Pure: values in, values out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "InterruptCandidate",
    "InterruptDecision",
    "ReleaseKey",
    "interrupt_key",
    "pool_deficit",
    "select_interrupts",
    "select_releases",
]


@dataclass(frozen=True, slots=True)
class InterruptCandidate:
    """A tool-running admitted session: its node, weight and value ``(k, r, t)`` there."""

    id: str
    node: str
    weight: int
    credit: int
    ready: int
    tokens: int
    remaining_s: float = math.inf
    """Expected remaining seconds of its tool (0 once its end was observed; the hold rule of
    :mod:`shared.core.rules` reads it; ``inf`` when unknown)."""
    host_tokens: int = 0
    """Tokens of its context, from the start, that its node's host tier holds."""
    load_s_per_token: float = 0.0
    """Its node's host-tier load seconds per token (0: no host tier)."""


@dataclass(frozen=True, slots=True)
class InterruptDecision:
    """The sessions to interrupt (in order) and why.

    ``deficit`` is ``max(0, demand - free)``; ``freed`` the Σ weight of ``interrupt``;
    ``satisfied`` is ``freed >= deficit``; ``protected`` lists candidates skipped because
    ``r = 1``.
    """

    interrupt: tuple[str, ...]
    deficit: int
    freed: int
    satisfied: bool
    protected: tuple[str, ...] = ()
    freed_per_node: Mapping[str, int] = field(default_factory=dict)


def pool_deficit(pool_weights: Iterable[int], node_free: Iterable[int]) -> int:
    """``max(0, Σ pool weights - Σ node free)`` in tokens (free capacities clamped at 0)."""
    demand = sum(pool_weights)
    free = sum(max(0, f) for f in node_free)
    return max(0, demand - free)


def interrupt_key(c: InterruptCandidate) -> tuple[int, int, int, int, str]:
    """Ascending value order: lowest ``(k, r, t)`` first, then larger weight, then id."""
    return (c.credit, c.ready, c.tokens, -c.weight, c.id)


ReleaseKey = Callable[[InterruptCandidate], tuple[object, ...]]
"""An order of release, first released first (:func:`interrupt_key` by default)."""


def select_interrupts(
    running: Sequence[InterruptCandidate],
    demand: int,
    free: int,
    *,
    protect_ready: bool = True,
    key: ReleaseKey = interrupt_key,
) -> InterruptDecision:
    """Interrupt the least valuable non-ready sessions until ``demand - free`` is freed
    (``protect_ready=False``: whatever their readiness; ``key``: another order, e.g. the
    cost model's most seconds gained first)."""
    seen: set[str] = set()
    for c in running:
        if c.id in seen:
            raise ValueError(f"running: duplicate session id {c.id!r}")
        if c.weight < 0:
            raise ValueError(f"running[{c.id!r}].weight: must be >= 0, got {c.weight}")
        seen.add(c.id)
    deficit = max(0, demand - max(0, free))
    order = sorted(running, key=key)
    protected = tuple(c.id for c in order if c.ready) if protect_ready else ()
    chosen: list[str] = []
    per_node: dict[str, int] = {}
    freed = 0
    if deficit > 0:
        for c in order:
            if freed >= deficit:
                break
            if c.ready and protect_ready:
                continue
            chosen.append(c.id)
            freed += c.weight
            per_node[c.node] = per_node.get(c.node, 0) + c.weight
    return InterruptDecision(
        interrupt=tuple(chosen),
        deficit=deficit,
        freed=freed,
        satisfied=freed >= deficit,
        protected=protected,
        freed_per_node=per_node,
    )


def select_releases(
    running: Sequence[InterruptCandidate], need: int, key: ReleaseKey = interrupt_key
) -> InterruptDecision:
    """Release sessions in ascending value order (or ``key``'s), *whatever their readiness*,
    until ``need`` tokens are freed (the pay-back rule of :mod:`shared.core.rules`: an
    over-committed node must come back within capacity, or the engine preempts)."""
    return select_interrupts(running, need, 0, protect_ready=False, key=key)
