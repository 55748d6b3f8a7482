"""The frozen input of one round: the pool valued, the tool-running sessions, the nodes.

:func:`shared.core.tick.value_snapshot` builds it; :func:`shared.core.round.decide` reads it;
``services/planner/mapping.py`` maps it to and from the wire. Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.core.interrupt import InterruptCandidate
from shared.core.nodecost import NodeCost
from shared.core.problem import Node, Phase

__all__ = ["TickCandidate", "TickSnapshot"]


@dataclass(frozen=True, slots=True)
class TickCandidate:
    """A pooled session valued for this tick; ``eligible`` = healthy nodes serving its model
    whose usable capacity could hold its weight."""

    id: str
    version: int
    weight: int
    tokens: int
    ready: int
    credit: Mapping[str, int]
    eligible: frozenset[str]
    digest: str
    phase: Phase
    rule: str = ""
    waiting_since: float | None = None
    home: str | None = None


@dataclass(frozen=True, slots=True)
class TickSnapshot:
    """Everything the planner needs for one round (the core form of ``ValuationSnapshot``).

    ``nodes`` carry ``free`` (capacity × target − reserved; 0 when unhealthy) and ``load``;
    ``overflow`` maps a healthy node to the tokens its reservations exceed capacity × target
    by (admitted sessions' reservations grow with their context after admission, so a node
    can end up over-committed without any admission doing it); ``interrupts`` are admitted
    sessions in a tool with their value on their node.
    ``probe_marks`` are the readiness probe marks the caller persists (DESIGN 3.1 rule 2).
    ``capacity`` (KV tokens) and ``running`` (requests on the engine) per node are what the
    ``evict`` rule reads of a node's eviction pressure (absent: no unclaimed cache, no batch).
    ``pressure`` maps a healthy node to the tokens its admitted sessions' *contexts* (each plus
    the ``payback_headroom``) exceed capacity × target by: what the ``payback_context`` rule
    pays back (filled only under that rule). ``unhealthy`` are the nodes nothing may be placed
    on; the admitted sessions there that are not in a model call (in a tool, or idle) are
    listed in ``interrupts`` too, and :func:`decide` releases them all (:attr:`stranded`).
    """

    tick: int
    now: float
    quantum: int
    nodes: tuple[Node, ...]
    candidates: tuple[TickCandidate, ...]
    interrupts: tuple[InterruptCandidate, ...] = ()
    versions: Mapping[str, int] = field(default_factory=dict)
    probe_marks: Mapping[str, float | None] = field(default_factory=dict)
    overflow: Mapping[str, int] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)
    running: Mapping[str, int] = field(default_factory=dict)
    pressure: Mapping[str, int] = field(default_factory=dict)
    unhealthy: frozenset[str] = frozenset()
    costs: Mapping[str, NodeCost] = field(default_factory=dict)
    """Each node's prices (:class:`~shared.core.nodecost.NodeCost`; absent: the default)."""
    rules: str = ""
    """The rule set the snapshot was valued under (every service values the same way)."""
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Why each candidate eligible on no node is so (the planner skips it): ``no nodes``, or
    the nodes' :func:`~shared.core.valuation.ineligibility` reasons joined by ``+`` (e.g.
    ``model+too-large``). For the valuation's log line; nothing plans by it."""

    @property
    def stranded(self) -> tuple[InterruptCandidate, ...]:
        """Interrupt candidates on a node that is unhealthy or no longer listed."""
        listed = {nd.id for nd in self.nodes}
        return tuple(c for c in self.interrupts if c.node in self.unhealthy or c.node not in listed)
