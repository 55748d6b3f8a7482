"""ThunderAgent's periodic pause rule in the live planner (``TAO_POLICY=thunderagent``).

With ``thunderagent`` the placement is the policy (:class:`ThunderAgentPolicy`), and TAO's
interrupt rule (DESIGN 3.3) is replaced by ThunderAgent's ``_pause_until_safe``
(:func:`shared.core.policies.thunderagent.thunderagent_pause`), run every
``SCHEDULER_INTERVAL_S`` (5 s) of snapshot time: on a node whose remaining capacity
``capacity − Σ (tokens + 100)`` is negative, ACTING programs (the snapshot's admitted-in-tool
sessions) are paused smallest first until it is not.

What the snapshot cannot give, and how it is handled here (the offline simulator, which sees
every record, runs the full rule):

* REASONING programs (admitted, a call in flight) are not in the snapshot; their tokens are
  estimated as the node's reserved load minus the ACTING programs' weights and enter as one
  aggregate program. The rule may ask to *mark* it (pause when its call ends); marking is not
  done live: only ACTING programs are paused.
* Force-resume after 1800 s of waiting is not done live.
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.core.policies.thunderagent import (
    TABackend,
    TAProgram,
    thunderagent_due,
    thunderagent_pause,
)
from shared.core.tick import Move, TickSnapshot

__all__ = ["PauseClock", "pause_moves"]

_REASONING = "\x00reasoning"  # the aggregate program's id: never a session id on the wire


def pause_moves(snapshot: TickSnapshot, capacity: Mapping[str, int]) -> tuple[Move, ...]:
    """The interrupt moves of ThunderAgent's pause rule on ``snapshot``; ``capacity`` is each
    node's KV capacity in tokens (``NodeView.capacity`` on the wire)."""
    by_node: dict[str, list[TAProgram]] = {}
    acting_weight: dict[str, int] = {}
    for ic in snapshot.interrupts:
        by_node.setdefault(ic.node, []).append(TAProgram(ic.id, "acting", ic.tokens))
        acting_weight[ic.node] = acting_weight.get(ic.node, 0) + ic.weight
    backends = []
    for nd in snapshot.nodes:
        programs = list(by_node.get(nd.id, ()))
        rest = nd.load - acting_weight.get(nd.id, 0)
        if rest > 0:
            programs.append(TAProgram(_REASONING, "reasoning", rest))
        backends.append(TABackend(capacity.get(nd.id, 0), programs))
    paused = set(thunderagent_pause(backends, snapshot.now))
    return tuple(
        Move(ic.id, ic.node, ic.weight, snapshot.versions[ic.id])
        for ic in snapshot.interrupts
        if ic.id in paused
    )


class PauseClock:
    """When the periodic check is due (every ``SCHEDULER_INTERVAL_S`` of snapshot time)."""

    def __init__(self) -> None:
        self.last: float | None = None

    def due(self, now: float) -> bool:
        if thunderagent_due(self.last, now):
            self.last = now
            return True
        return False
