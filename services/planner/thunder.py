"""ThunderAgent's periodic rules in the live planner (``TAO_POLICY=thunderagent``, DESIGN 3.5).

With ``thunderagent`` the placement is the policy (:class:`ThunderAgentPolicy`: the greedy
resume), and TAO's interrupt rule (DESIGN 3.3) is replaced by ThunderAgent's own rules, shared
with the offline simulator through :mod:`shared.core.policies.thunderagent`:

* **pause** (``_pause_until_safe``, :func:`thunderagent_pause`), every ``SCHEDULER_INTERVAL_S``
  (5 s) of snapshot time: on a node whose remaining capacity ``capacity − Σ (tokens + 100)`` is
  negative, ACTING programs are paused smallest first; REASONING programs are then *marked*.
  ACTING = admitted and no model call in flight (in a tool: the snapshot's interrupt
  candidates; or idle between turns), REASONING = admitted with a call in flight. Both of the
  latter come from the snapshot's ``admitted`` list, which the valuation fills only under
  ``thunderagent``.
* **marked programs** are paused (released) on the first snapshot that shows their call ended
  (the record left ``running``) — ThunderAgent pauses them in the response handler, here the
  next valuation tick (≤ 1 s). A marked session that already started its next call before a
  snapshot saw it between calls stays marked until that call ends: a running session is never
  released (its request is on the node). Marks live in planner memory; a restarted planner
  forgets them, and its next check (≤ 5 s) re-decides from the live state.
* **forced resume** (``_wait_for_resume(timeout=1800)``, :func:`thunderagent_overdue`): a pooled
  session with a pending request (phase ``new`` or ``reasoning``) that has waited 1800 s is
  admitted regardless of capacity, on the node it was paused from when it is still eligible,
  else on its eligible node with the most free room. Waiting starts at the first snapshot
  that shows the session waiting (≤ 1 s late); a restarted planner starts the clocks again,
  so a forced resume is never early, at worst late by the planner's downtime.

Pure: the state object is updated from snapshots only; ``now`` is the snapshot's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from shared.core.policies.thunderagent import (
    WAIT_TIMEOUT_S,
    TABackend,
    TAProgram,
    thunderagent_due,
    thunderagent_overdue,
    thunderagent_pause,
)
from shared.core.session import Session
from shared.core.tick import Move, TickCandidate, TickSnapshot

__all__ = ["Held", "TAStep", "ThunderState", "held_sessions", "pause_moves"]

_REASONING = "\x00reasoning"  # the aggregate program's id: never a session id on the wire
_ORIGIN_KEEP_S = 2 * WAIT_TIMEOUT_S  # forget where a paused session came from after this long


@dataclass(frozen=True, slots=True)
class Held:
    """An admitted session outside a tool: ``running`` (REASONING) or ``idle`` (ACTING)."""

    id: str
    node: str
    weight: int
    tokens: int
    activity: str
    version: int


def held_sessions(sessions: Iterable[Session]) -> list[Held]:
    """The admitted, not ended sessions of ``sessions`` that are not in a tool, in input
    order (tool sessions travel as interrupt candidates)."""
    return [
        Held(s.id, s.node, s.weight, s.tokens, s.activity, s.version)
        for s in sessions
        if s.node is not None and not s.ended and s.activity != "tool"
    ]


@dataclass(frozen=True, slots=True)
class TAStep:
    """What ThunderAgent does on one snapshot: ``pauses`` (interrupt moves: ACTING programs
    paused by the check and marked programs whose call ended), ``forced`` (overdue waiting
    sessions to admit regardless of capacity), ``marked`` (REASONING programs newly marked),
    ``checked`` (the periodic check ran)."""

    pauses: tuple[Move, ...] = ()
    forced: tuple[Move, ...] = ()
    marked: tuple[str, ...] = ()
    checked: bool = False


def pause_moves(snapshot: TickSnapshot, capacity: Mapping[str, int]) -> tuple[Move, ...]:
    """The pause rule when the snapshot lists no admitted sessions (a valuation not running
    under ``thunderagent``): REASONING tokens are estimated per node as its reserved load minus
    the ACTING programs' weights, entered as one aggregate program that is never paused."""
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


def _forced_node(c: TickCandidate, origin: str | None, room: Mapping[str, int]) -> str | None:
    if origin is not None and origin in c.eligible:
        return origin
    if not c.eligible:
        return None
    return min(c.eligible, key=lambda b: (-room.get(b, 0), b))


@dataclass(slots=True)
class ThunderState:
    """ThunderAgent's memory across snapshots: the last check, marks (id → node), waiting
    clocks (id → first seen waiting) and the node each paused session came from (with the
    time; forgotten once it is admitted again, or after ``2 × WAIT_TIMEOUT_S`` not waiting)."""

    last_check: float | None = None
    marked: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)
    origin: dict[str, tuple[str, float]] = field(default_factory=dict)
    releasing: dict[str, str] = field(default_factory=dict)

    def step(
        self,
        snap: TickSnapshot,
        capacity: Mapping[str, int],
        held: Sequence[Held] | None,
    ) -> TAStep:
        """Marks whose call ended, the periodic check when due, overdue waiting sessions."""
        now = snap.now
        self._track_waiting(snap)
        pauses = self._release_marked(snap, held)
        marked: list[str] = []
        checked = thunderagent_due(self.last_check, now)
        if checked:
            self.last_check = now
            if held is None:
                pauses += pause_moves(snap, capacity)
            else:
                gone = {m.session for m in pauses}
                acting, newly = self._check(snap, capacity, held, gone)
                pauses += acting
                marked = newly
        for m in pauses:
            self.origin[m.session] = (m.node, now)
        return TAStep(pauses, self._forced(snap), tuple(marked), checked)

    def discarded(self) -> None:
        """The last step's plan was discarded: its marked programs stay marked (their release
        is asked again on the next snapshot that shows them between calls)."""
        self.marked.update(self.releasing)
        self.releasing = {}

    def admitted(self, sids: Iterable[str]) -> None:
        """Forget the waiting clocks (and origins) of sessions the planner just admitted."""
        for sid in sids:
            self.waiting.pop(sid, None)
            self.origin.pop(sid, None)

    def _track_waiting(self, snap: TickSnapshot) -> None:
        waiting = {c.id for c in snap.candidates if c.phase != "acting"}
        for sid in list(self.waiting):
            if sid not in waiting:
                del self.waiting[sid]
        for sid in sorted(waiting):
            self.waiting.setdefault(sid, snap.now)
        admitted = {ic.id for ic in snap.interrupts}
        for sid, (_, since) in list(self.origin.items()):
            if sid in admitted or (sid not in waiting and snap.now - since > _ORIGIN_KEEP_S):
                del self.origin[sid]

    def _release_marked(self, snap: TickSnapshot, held: Sequence[Held] | None) -> tuple[Move, ...]:
        self.releasing = {}
        if held is None:
            return ()
        out: list[Move] = []
        live: set[str] = set()
        for h in held:
            live.add(h.id)
            if h.id in self.marked and h.activity != "running":
                out.append(Move(h.id, h.node, h.weight, h.version))
        for ic in snap.interrupts:
            live.add(ic.id)
            if ic.id in self.marked:
                out.append(Move(ic.id, ic.node, ic.weight, snap.versions[ic.id]))
        released = {m.session for m in out}
        self.releasing = {sid: self.marked[sid] for sid in released}
        for sid in list(self.marked):
            if sid in released or sid not in live:  # paused now, or released / ended already
                del self.marked[sid]
        return tuple(out)

    def _check(
        self,
        snap: TickSnapshot,
        capacity: Mapping[str, int],
        held: Sequence[Held],
        gone: set[str],
    ) -> tuple[tuple[Move, ...], list[str]]:
        programs: dict[str, list[TAProgram]] = {nd.id: [] for nd in snap.nodes}
        moves: dict[str, Move] = {}
        for ic in snap.interrupts:
            if ic.id not in gone:
                programs.setdefault(ic.node, []).append(TAProgram(ic.id, "acting", ic.tokens))
                moves[ic.id] = Move(ic.id, ic.node, ic.weight, snap.versions[ic.id])
        nodes: dict[str, str] = {}
        for h in held:
            if h.id in gone:
                continue
            if h.activity == "running":
                prog = TAProgram(h.id, "reasoning", h.tokens, marked=h.id in self.marked)
                nodes[h.id] = h.node
            else:
                prog = TAProgram(h.id, "acting", h.tokens)
                moves[h.id] = Move(h.id, h.node, h.weight, h.version)
            programs.setdefault(h.node, []).append(prog)
        backends = [TABackend(capacity.get(n, 0), progs) for n, progs in programs.items()]
        acting: list[Move] = []
        newly: list[str] = []
        for sid in thunderagent_pause(backends, snap.now):
            if sid in moves:
                acting.append(moves[sid])
            else:
                self.marked[sid] = nodes[sid]
                newly.append(sid)
        return tuple(acting), newly

    def _forced(self, snap: TickSnapshot) -> tuple[Move, ...]:
        overdue = thunderagent_overdue(sorted(self.waiting.items()), snap.now)
        if not overdue:
            return ()
        by_id = {c.id: c for c in snap.candidates}
        room = {nd.id: nd.free for nd in snap.nodes}
        out: list[Move] = []
        for sid in overdue:
            c = by_id[sid]
            node = _forced_node(c, self.origin.get(sid, (None, 0.0))[0], room)
            if node is None:  # no healthy node serves its model: nowhere to resume it
                continue
            room[node] = room.get(node, 0) - c.weight
            out.append(Move(sid, node, c.weight, c.version))
        return tuple(out)
