"""The one mapping between the core's :class:`TickSnapshot` and the wire's ``ValuationSnapshot``.

The valuation service values the pool with :func:`shared.core.tick.value_snapshot` and publishes
:func:`to_wire` of it; the planner decodes the message and turns it back with :func:`from_wire`
before calling :func:`shared.core.tick.decide`. Field by field:

    TickSnapshot.nodes (Node id, free, load), capacity[id], running[id]
                                               ↔ WireNodeView(id, free, load, capacity, healthy,
                                                  overflow, running, pressure, used,
                                                  waiting, cost)
    TickSnapshot.costs[id]                     ↔ WireNodeView.cost (WireNodeCost)
    TickSnapshot.rules                         ↔ ValuationSnapshot.rules
    TickCandidate(id, version, weight, tokens, ready, credit, eligible, digest, phase,
                  waiting_since, home)
                                               ↔ WireCandidate(..., signature=WireSignature(id,
                                                  version, eligibility_digest=digest))
    core InterruptCandidate + versions[id]     ↔ WireInterruptCandidate(...,
                                                  signature=WireSignature)
    thunder.Held(id, node, weight, tokens, activity, version)
                                               ↔ AdmittedSession(..., signature=WireSignature(id,
                                                  version)); the list only under thunderagent

What the wire does not carry comes back empty: ``probe_marks`` (the valuation service persists
them itself) and each candidate's readiness ``rule`` (a log field). ``healthy`` comes from the
core ``NodeView`` s the snapshot was valued on and is informational for the planner (an
unhealthy node already has ``free == 0`` and is in no candidate's eligible set); ``capacity``
and ``running`` are read by the ``evict`` release rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final, cast

from services.planner.thunder import Held
from shared.contracts.errors import DecodeError
from shared.contracts.valuation import (
    AdmittedSession,
    ValuationSnapshot,
    WireCandidate,
    WireInterruptCandidate,
    WireNodeCost,
    WireNodeView,
    WireSignature,
)
from shared.core import interrupt as core_interrupt
from shared.core.nodecost import CostSource, NodeCost
from shared.core.problem import Node, Phase
from shared.core.tick import TickCandidate, TickSnapshot
from shared.core.valuation import NodeView

__all__ = ["from_wire", "held_from_wire", "to_wire"]

_PHASES: Final[frozenset[str]] = frozenset(("reasoning", "new", "acting"))
_HELD_ACTIVITIES: Final[frozenset[str]] = frozenset(("running", "idle", "waiting"))


def to_wire(
    snapshot: TickSnapshot,
    views: Sequence[NodeView] = (),
    admitted: Sequence[Held] | None = None,
) -> ValuationSnapshot:
    """The message form of ``snapshot``; ``views`` (the nodes it was valued on) add capacity
    and health; ``admitted`` (thunderagent only) the admitted sessions outside a tool."""
    by_id: Mapping[str, NodeView] = {v.id: v for v in views}
    nodes = []
    for nd in snapshot.nodes:
        v = by_id.get(nd.id)
        nodes.append(
            WireNodeView(
                id=nd.id,
                free=nd.free,
                load=nd.load,
                capacity=v.capacity_tokens if v is not None else snapshot.capacity.get(nd.id, 0),
                healthy=v.healthy if v is not None else True,
                overflow=snapshot.overflow.get(nd.id, 0),
                running=snapshot.running.get(nd.id, 0),
                pressure=snapshot.pressure.get(nd.id, 0),
                used=v.used if v is not None else 0,
                waiting=v.waiting if v is not None else 0,
                cost=_cost_to_wire(snapshot.costs.get(nd.id)),
            )
        )
    cands = [
        WireCandidate(
            id=c.id,
            weight=c.weight,
            tokens=c.tokens,
            ready=c.ready,
            credit=dict(c.credit),
            eligible=sorted(c.eligible),
            phase=c.phase,
            signature=WireSignature(
                session_id=c.id, version=c.version, eligibility_digest=c.digest
            ),
            waiting_since=c.waiting_since,
            home=c.home,
        )
        for c in snapshot.candidates
    ]
    inter = [
        WireInterruptCandidate(
            id=ic.id,
            node=ic.node,
            weight=ic.weight,
            tokens=ic.tokens,
            ready=ic.ready,
            credit=ic.credit,
            signature=WireSignature(session_id=ic.id, version=snapshot.versions.get(ic.id, 0)),
            remaining_s=None if math.isinf(ic.remaining_s) else ic.remaining_s,
            host_tokens=ic.host_tokens,
            load_s_per_token=ic.load_s_per_token,
        )
        for ic in snapshot.interrupts
    ]
    return ValuationSnapshot(
        tick=snapshot.tick,
        now=snapshot.now,
        quantum=snapshot.quantum,
        nodes=nodes,
        candidates=cands,
        interrupt_candidates=inter,
        admitted=None if admitted is None else [_held_to_wire(h) for h in admitted],
        rules=snapshot.rules,
    )


def _cost_to_wire(c: NodeCost | None) -> WireNodeCost | None:
    if c is None:
        return None
    return WireNodeCost(
        prefill_s=c.prefill_s,
        attn_s=c.attn_s,
        requeue_s=c.requeue_s,
        load_s=c.load_s,
        source=c.source,
        observed_tokens=c.observed_tokens,
    )


_SOURCES: Final[frozenset[str]] = frozenset(("profile", "measured", "pinned"))


def _cost_from_wire(node: str, c: WireNodeCost) -> NodeCost:
    if c.source not in _SOURCES:
        raise DecodeError(
            "ValuationSnapshot",
            f"nodes[{node!r}].cost.source: must be one of {sorted(_SOURCES)}, got {c.source!r}",
        )
    try:
        return NodeCost(
            c.prefill_s,
            c.attn_s,
            c.requeue_s,
            c.load_s,
            cast(CostSource, c.source),
            max(0, c.observed_tokens),
        )
    except ValueError as e:
        raise DecodeError("ValuationSnapshot", f"nodes[{node!r}].cost: {e}") from None


def _held_to_wire(h: Held) -> AdmittedSession:
    return AdmittedSession(
        id=h.id,
        node=h.node,
        weight=h.weight,
        tokens=h.tokens,
        activity=h.activity,
        signature=WireSignature(session_id=h.id, version=h.version),
    )


def held_from_wire(msg: ValuationSnapshot) -> tuple[Held, ...] | None:
    """The snapshot's admitted sessions outside a tool (``None`` when not listed); raise
    :class:`DecodeError` for a signature of another session or an unknown activity."""
    if msg.admitted is None:
        return None
    out: list[Held] = []
    for i, a in enumerate(msg.admitted):
        if a.signature.session_id != a.id:
            raise DecodeError("ValuationSnapshot", f"admitted[{i}].signature: names another id")
        if a.activity not in _HELD_ACTIVITIES:
            raise DecodeError(
                "ValuationSnapshot",
                f"admitted[{i}].activity: must be one of {sorted(_HELD_ACTIVITIES)}, "
                f"got {a.activity!r}",
            )
        out.append(Held(a.id, a.node, a.weight, a.tokens, a.activity, a.signature.version))
    return tuple(out)


def _phase(c: WireCandidate, i: int) -> Phase:
    if c.phase is None:
        return "new"
    if c.phase not in _PHASES:
        raise DecodeError(
            "ValuationSnapshot",
            f"candidates[{i}].phase: must be one of {sorted(_PHASES)}, got {c.phase!r}",
        )
    return cast(Phase, c.phase)


def from_wire(msg: ValuationSnapshot) -> TickSnapshot:
    """The core form of a received snapshot; raise :class:`DecodeError` for one that names a
    phase the core does not know or a signature of another session."""
    all_nodes = frozenset(nd.id for nd in msg.nodes)
    versions: dict[str, int] = {}
    cands: list[TickCandidate] = []
    for i, c in enumerate(msg.candidates):
        if c.signature.session_id != c.id:
            raise DecodeError("ValuationSnapshot", f"candidates[{i}].signature: names another id")
        versions[c.id] = c.signature.version
        cands.append(
            TickCandidate(
                id=c.id,
                version=c.signature.version,
                weight=c.weight,
                tokens=c.tokens,
                ready=c.ready,
                credit=dict(c.credit),
                eligible=all_nodes if c.eligible is None else frozenset(c.eligible),
                digest=c.signature.eligibility_digest,
                phase=_phase(c, i),
                waiting_since=c.waiting_since,
                home=c.home,
            )
        )
    inter: list[core_interrupt.InterruptCandidate] = []
    for i, ic in enumerate(msg.interrupt_candidates):
        if ic.signature.session_id != ic.id:
            raise DecodeError(
                "ValuationSnapshot", f"interrupt_candidates[{i}].signature: names another id"
            )
        versions[ic.id] = ic.signature.version
        if ic.host_tokens < 0 or not (
            ic.load_s_per_token >= 0.0 and math.isfinite(ic.load_s_per_token)
        ):
            raise DecodeError(
                "ValuationSnapshot",
                f"interrupt_candidates[{i}]: host_tokens must be >= 0 and load_s_per_token "
                f"finite and >= 0, got {ic.host_tokens}, {ic.load_s_per_token}",
            )
        inter.append(
            core_interrupt.InterruptCandidate(
                id=ic.id,
                node=ic.node,
                weight=ic.weight,
                credit=ic.credit,
                ready=ic.ready,
                tokens=ic.tokens,
                remaining_s=math.inf if ic.remaining_s is None else ic.remaining_s,
                host_tokens=ic.host_tokens,
                load_s_per_token=ic.load_s_per_token,
            )
        )
    return TickSnapshot(
        tick=msg.tick,
        now=msg.now,
        quantum=msg.quantum,
        nodes=tuple(Node(id=nd.id, free=nd.free, load=nd.load) for nd in msg.nodes),
        candidates=tuple(cands),
        interrupts=tuple(inter),
        versions=versions,
        overflow={nd.id: nd.overflow for nd in msg.nodes if nd.overflow > 0},
        capacity={nd.id: nd.capacity for nd in msg.nodes if nd.capacity > 0},
        running={nd.id: nd.running for nd in msg.nodes if nd.running > 0},
        pressure={nd.id: nd.pressure for nd in msg.nodes if nd.pressure > 0},
        unhealthy=frozenset(nd.id for nd in msg.nodes if not nd.healthy),
        costs={nd.id: _cost_from_wire(nd.id, nd.cost) for nd in msg.nodes if nd.cost is not None},
        rules=msg.rules,
    )
