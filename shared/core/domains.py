"""The upper-level choice between scheduling domains: which domain a new session goes to.

A fleet is split into domains (node pools per model, region or GPU type, docs/scale-out.md),
each with its own elected planner over its own nodes. A session is placed in one domain for
its life (its KV prefix, reservation and signature live there); inside it the domain's planner
does the exact, lexicographic placement as before. The choice between domains is deliberately
cheap and local, made once per session when its first request arrives:

1. **eligible** domains serve the session's model and have usable capacity;
2. among them, the one whose **load after admitting it**, ``(demand + weight) / capacity``, is
   lowest (demand: the tokens its sessions hold or wait for; capacity: its nodes' usable KV
   tokens), ties broken by name.

The ratio is compared exactly (cross-multiplied integers), so the choice is deterministic.
It is least-loaded routing by demand over capacity: it keeps every domain's planner facing a
similar contention level, which is where TAO's placement gains (a domain that is idle while
another queues wastes capacity no in-domain planner can reach). It does not look at cache
credit: a new session has none anywhere, and later turns stay in their domain.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shared.core.session import Session
from shared.core.tick import usable_capacity
from shared.core.valuation import NodeView, session_weight

__all__ = ["DomainLoad", "choose_domain", "domain_load", "session_demand"]


@dataclass(frozen=True, slots=True)
class DomainLoad:
    """One domain as the upper level sees it."""

    name: str
    capacity: int
    """Usable KV tokens of its healthy nodes."""
    demand: int
    """Tokens its sessions hold (admitted weights) or wait for (pooled sessions' weights)."""
    models: frozenset[str] | None = None
    """The models its nodes serve; None: any."""


def session_demand(sessions: Iterable[Session], reserve: int) -> int:
    """The demand of ``sessions``: each admitted one's weight, each other live one's weight if
    it were admitted now (``tokens + reserve``)."""
    total = 0
    for s in sessions:
        if s.ended:
            continue
        total += s.weight if s.node is not None else session_weight(s.tokens, 0, reserve)
    return total


def domain_load(
    name: str, nodes: Sequence[NodeView], pool: Iterable[Session], reserve: int
) -> DomainLoad:
    """A live domain's load from one tick's reads: capacity from its healthy nodes, demand the
    nodes' reserved totals (every admitted session's weight) plus the pooled sessions' demand.
    (The simulator counts every live session; live, an idle session that is neither admitted
    nor pooled holds and waits for nothing, so it is not counted.)"""
    listed = [nv.models for nv in nodes]
    models = None if None in listed else frozenset().union(*(m for m in listed if m is not None))
    return DomainLoad(
        name=name,
        capacity=sum(usable_capacity(nv) for nv in nodes if nv.healthy),
        demand=sum(nv.reserved for nv in nodes) + session_demand(pool, reserve),
        models=models,
    )


def choose_domain(loads: Sequence[DomainLoad], weight: int, model: str | None = None) -> str | None:
    """The domain for a new session of ``weight`` tokens asking for ``model`` (module
    docstring); None when no domain serves it."""
    best: DomainLoad | None = None
    for d in loads:
        if d.capacity <= 0 or (d.models is not None and (model is None or model not in d.models)):
            continue
        if best is None:
            best = d
            continue
        # (d.demand + w) / d.capacity < (best.demand + w) / best.capacity, exactly
        lhs = (d.demand + weight) * best.capacity
        rhs = (best.demand + weight) * d.capacity
        if lhs < rhs or (lhs == rhs and d.name < best.name):
            best = d
    return None if best is None else best.name
