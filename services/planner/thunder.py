"""ThunderAgent in the live planner (``TAO_POLICY=thunderagent`` / ``thunderagent-ideal``).

The full account: docs/internals.md, section ``services/planner/thunder.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from shared.core.session import Session
from shared.core.thunder import (
    BUFFER_PER_PROGRAM,
    FAITHFUL,
    SCHEDULER_INTERVAL_S,
    VARIANTS,
    WAIT_TIMEOUT_S,
    Program,
    ThunderAgent,
    Variant,
    variant_for,
)
from shared.core.tick import Move, TickCandidate, TickSnapshot

__all__ = [
    "THUNDERAGENT_POLICIES",
    "Held",
    "TAStep",
    "ThunderState",
    "held_sessions",
    "is_thunderagent",
]

THUNDERAGENT_POLICIES: Final[frozenset[str]] = frozenset(VARIANTS)
"""Policies the live planner runs with the ThunderAgent state machine (the valuation then
publishes every tick and lists the admitted sessions outside a tool)."""


def is_thunderagent(policy: str) -> bool:
    """Whether ``policy`` is run by :class:`ThunderState` (one of ``THUNDERAGENT_POLICIES``)."""
    return policy in THUNDERAGENT_POLICIES


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
    paused by the check, marked programs whose call ended), ``admits`` (resumes and direct
    admissions, in the machine's order), ``forced`` (overdue programs to admit regardless of
    capacity), ``marked`` (REASONING programs newly marked), ``checked`` (the periodic check
    ran)."""

    pauses: tuple[Move, ...] = ()
    admits: tuple[Move, ...] = ()
    forced: tuple[Move, ...] = ()
    marked: tuple[str, ...] = ()
    checked: bool = False


class _Seen(NamedTuple):
    """One session as the snapshot shows it."""

    node: str | None
    busy: bool
    tokens: int
    weight: int
    version: int
    new: bool = False
    candidate: TickCandidate | None = None


def _observe(snap: TickSnapshot, held: Sequence[Held]) -> dict[str, _Seen]:
    seen: dict[str, _Seen] = {}
    for c in snap.candidates:
        busy = c.phase != "acting"
        seen[c.id] = _Seen(None, busy, c.tokens, c.weight, c.version, c.phase == "new", c)
    for ic in snap.interrupts:
        seen[ic.id] = _Seen(ic.node, False, ic.tokens, ic.weight, snap.versions.get(ic.id, 0))
    for h in held:
        busy = h.activity in ("running", "waiting")
        seen[h.id] = _Seen(h.node, busy, h.tokens, h.weight, h.version)
    return seen


@dataclass(slots=True)
class ThunderState:
    """The planner's ThunderAgent: the core machine (``ta``, made on the first snapshot) and
    what syncing it needs across snapshots — the last check, each session's last seen busy
    flag, the waiting clocks of blocked requests (id → first seen blocked), and the versions
    the planner's own applied moves left (id → version)."""

    variant: Variant = FAITHFUL
    ta: ThunderAgent | None = None
    last_check: float | None = None
    last_seen: float | None = None
    """The previous snapshot's time: the gap to it is the snapshot period (:meth:`due`)."""
    busy: dict[str, bool] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)

    @classmethod
    def for_policy(cls, policy: str, interval_s: float = SCHEDULER_INTERVAL_S) -> ThunderState:
        """The state for a ThunderAgent policy (``ValueError`` for another name)."""
        return cls(variant_for(policy, interval_s))

    def due(self, now: float) -> bool:
        """Whether the periodic check runs on the snapshot at ``now``: the first one, then the
        snapshot nearest to ``interval_s`` after the last check. ThunderAgent sleeps the
        interval between checks (router.py:660–665); checks only land on snapshots, so
        waiting for the first snapshot *at or after* the interval made the period the interval
        plus up to one snapshot gap (1 s checks ran every 2 s on 1 s snapshots). Half the
        last gap early keeps the mean period at the interval."""
        if self.last_check is None:
            return True
        gap = 0.0 if self.last_seen is None else max(0.0, now - self.last_seen)
        return now - self.last_check + gap / 2 >= self.variant.interval_s

    @property
    def marked(self) -> set[str]:
        """The programs marked to pause when their call ends."""
        return set() if self.ta is None else {p.id for p in self.ta.programs.values() if p.marked}

    def step(
        self,
        snap: TickSnapshot,
        capacity: Mapping[str, int],
        held: Sequence[Held] | None,
        healthy: Mapping[str, bool] | None = None,
        used: Mapping[str, int | None] | None = None,
    ) -> TAStep:
        """Sync the machine from ``snap``, run the check when due, collect the moves.

        ``held`` ``None`` (a valuation not running a ThunderAgent policy) counts as no admitted
        session outside a tool. ``used``: each node's KV in use (telemetry's
        ``kv_cache_usage_perc`` × capacity; None: not measurable now), the check's fresh
        metrics for ``thunderagent-ideal``'s shared tokens, over the programs whose requests
        the engine runs (the held sessions ``running`` there)."""
        now = snap.now
        if self.ta is None:
            self.ta = ThunderAgent(capacity=dict(capacity), variant=self.variant)
        ta = self.ta
        ta.capacity = {n: int(c) for n, c in capacity.items()}
        ta.healthy = dict(healthy or {})
        seen = _observe(snap, held or ())
        pauses: list[Move] = []
        admits: list[Move] = []
        event = self._sync(seen, pauses, admits, now)
        forced = self._forced(seen, snap, now)
        marked: list[str] = []
        checked = self.due(now)
        self.last_seen = now
        if checked:
            self.last_check = now
            holding: dict[str, set[str]] = {}
            for h in held or ():
                if h.activity == "running":
                    holding.setdefault(h.node, set()).add(h.id)
            check = ta.check(now, used, holding)
            self._moves(check.resumed, seen, admits)
            self._pauses(check.paused, seen, pauses)
            marked = list(check.marked)
            event = event or bool(check.paused)
        if self.variant.resume_on_event and event and ta.queue:
            self._moves(ta.resume(now).resumed, seen, admits)
        paused = {m.session for m in pauses}
        admits = [m for m in admits if m.session not in paused]
        return TAStep(tuple(pauses), tuple(admits), forced, tuple(marked), checked)

    # -- sync ----------------------------------------------------------------------------

    def _sync(
        self, seen: Mapping[str, _Seen], pauses: list[Move], admits: list[Move], now: float
    ) -> bool:
        """Feed the snapshot's changes to the machine; True when a program newly waits, is
        paused or left (what makes ``IDEAL`` resume)."""
        ta = self.ta
        assert ta is not None
        event = False
        for pid in [pid for pid in ta.programs if pid not in seen]:
            ta.release(pid)
            event = True
        for sid in [sid for sid in self.busy if sid not in seen]:
            del self.busy[sid]
        for sid in [sid for sid in self.written if sid not in seen]:
            del self.written[sid]
        # admitted sessions first: a new program's direct admission sees their tokens
        for sid, o in sorted(seen.items(), key=lambda kv: kv[1].node is None):
            if o.version < self.written.get(sid, -1):
                continue  # older than the planner's own write: the machine knows better
            self.written.pop(sid, None)
            p = ta.programs.get(sid)
            was = self.busy.get(sid, False)
            self.busy[sid] = o.busy
            if p is None and not (o.new and o.node is None):
                self._adopt(sid, o, now)
                event = event or o.node is None
                continue
            if o.busy and (p is None or not was):
                node = ta.on_request(sid, o.tokens)
                if node is None:
                    event = True
                elif o.node is None:
                    self._moves(((sid, node),), seen, admits)
                    continue
            elif not o.busy and was and p is not None and ta.on_response(sid, o.tokens, now):
                self._pauses((sid,), seen, pauses)  # a marked program: paused as its call ended
                event = True
                continue
            event = self._reconcile(ta.programs[sid], o) or event
        return event

    def _adopt(self, sid: str, o: _Seen, now: float) -> None:
        """A live session the machine does not know (a restarted planner, a session queued
        again after a pause while idle): entered as the snapshot shows it."""
        ta = self.ta
        assert ta is not None
        p = ta.programs[sid] = Program(
            sid,
            backend=o.node,
            status="reasoning" if o.busy else "acting",
            tokens=o.tokens,
            steps=1 if o.new else 2,
            acting_since=None if o.busy else now,
        )
        if o.node is None:
            self._queue(p, o.busy)

    def _queue(self, p: Program, blocked: bool) -> None:
        ta = self.ta
        assert ta is not None
        if p.backend is not None:
            p.origin = p.backend
        p.backend = None
        p.paused = True
        p.marked = False
        p.blocked = blocked
        p.paused_tokens = p.tokens
        ta.queue[p.id] = None

    def _reconcile(self, p: Program, o: _Seen) -> bool:
        """Make ``p`` agree with the store on admission; True when it was queued again."""
        ta = self.ta
        assert ta is not None
        if o.node is not None:
            if p.paused or p.backend != o.node:
                ta.queue.pop(p.id, None)
                p.backend, p.origin, p.paused, p.blocked = o.node, None, False, False
            return False
        if not p.paused:
            self._queue(p, o.busy)
            return True
        if p.id not in ta.queue:
            ta.queue[p.id] = None
        p.blocked = o.busy
        return False

    # -- moves ---------------------------------------------------------------------------

    def _moves(
        self, placed: Iterable[tuple[str, str]], seen: Mapping[str, _Seen], out: list[Move]
    ) -> None:
        """Admit moves for the machine's placements of pooled sessions on eligible nodes;
        others are dropped (the next snapshot queues the program again)."""
        ta = self.ta
        assert ta is not None
        for sid, node in placed:
            o = seen.get(sid)
            if o is None or o.candidate is None or node not in o.candidate.eligible:
                continue
            weight = ta.programs[sid].tokens + BUFFER_PER_PROGRAM
            out.append(Move(sid, node, weight, o.version))

    def _pauses(self, sids: Iterable[str], seen: Mapping[str, _Seen], out: list[Move]) -> None:
        for sid in sids:
            o = seen.get(sid)
            if o is not None and o.node is not None:
                out.append(Move(sid, o.node, o.weight, o.version))

    def _forced(
        self, seen: Mapping[str, _Seen], snap: TickSnapshot, now: float
    ) -> tuple[Move, ...]:
        """Clocks of blocked requests; the overdue ones resumed with ``force()``."""
        ta = self.ta
        assert ta is not None
        blocked = {pid for pid, p in ta.programs.items() if p.paused and p.blocked}
        for sid in [sid for sid in self.waiting if sid not in blocked]:
            del self.waiting[sid]
        room = {nd.id: nd.free for nd in snap.nodes}
        out: list[Move] = []
        for sid in sorted(blocked):
            since = self.waiting.setdefault(sid, now)
            o = seen.get(sid)
            if now - since < WAIT_TIMEOUT_S or o is None or o.candidate is None:
                continue
            c = o.candidate
            if not c.eligible:
                continue  # no healthy node serves its model: nowhere to resume it
            origin = ta.programs[sid].origin
            node = ta.force(sid)
            if node is None:
                continue
            if node not in c.eligible:
                node = origin if origin in c.eligible else None
                if node is None:
                    node = min(c.eligible, key=lambda b: (-room.get(b, 0), b))
                ta.programs[sid].backend = node
            weight = ta.programs[sid].tokens + BUFFER_PER_PROGRAM
            room[node] = room.get(node, 0) - weight
            out.append(Move(sid, node, weight, o.version))
        return tuple(out)

    # -- after the apply -----------------------------------------------------------------

    def applied(self, records: Mapping[str, Session]) -> None:
        """The planner wrote these records: snapshots with older versions are ignored for
        them, and admitted ones stop their waiting clocks."""
        for sid, rec in records.items():
            self.written[sid] = rec.version
            if rec.node is not None:
                self.waiting.pop(sid, None)
