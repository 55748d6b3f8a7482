"""One priced round: rules propose, one arbiter decides, a record says why (DESIGN §8).

Each rule of the rule set (:mod:`shared.core.rules`) is a pure function from a frozen
:class:`View` of the round so far to :class:`Proposal` s: ``(kind, session, node, tokens,
gain_s, cost_s, rule)``, priced in seconds by the node's :class:`~shared.core.nodecost.NodeCost`.
The arbiter (:func:`decide`) asks them in a fixed order — evacuate, pay-back, the tail, home,
demand — each seeing the room the ones before it freed or took; within a rule, releases go by
net seconds (``gain − cost``) where the rule set prices (``cost``), by the paper's ``(k, r, t)``
otherwise. An admit a rule proposes (the tail's) holds its room: the arbiter admits it before
the search. Room a release frees *for* a session (``home``) names that session in the record and
goes to the search with it in the pool. Then the planner search places the pool on the room
left. Every admit, release and hold lands in the :class:`RoundRecord` with its
rule and price, so "why was this session released" is read from the record, not replayed.

The account: docs/internals.md, "The priced round". Pure: the snapshot carries ``now``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

from shared.core.interrupt import (
    InterruptCandidate,
    interrupt_key,
    select_interrupts,
    select_releases,
)
from shared.core.nodecost import DEFAULT_COST, NodeCost
from shared.core.policies.base import PlanOptions, Policy
from shared.core.problem import Candidate, PlanResult, Problem
from shared.core.rules import RuleSet
from shared.core.snapshot import TickCandidate, TickSnapshot

__all__ = [
    "Decision",
    "Entry",
    "Move",
    "Proposal",
    "RoundRecord",
    "View",
    "decide",
    "needs_gpu",
    "pool_wait",
]

Kind = Literal["admit", "release", "hold", "wait"]


@dataclass(frozen=True, slots=True)
class Move:
    """One decision about one session: admit it on (or release it from) ``node``.

    ``digest`` (admits only) is the candidate's eligibility digest from the snapshot, which
    the apply step compares with the live one; empty means no eligibility check."""

    session: str
    node: str
    weight: int
    version: int
    digest: str = ""


@dataclass(frozen=True, slots=True)
class Proposal:
    """What a rule proposes: ``kind`` on ``session`` at ``node`` for ``tokens`` of room, the
    seconds it gains and costs, and (``for_session``) whom a release makes room for."""

    kind: Kind
    session: str
    node: str
    tokens: int
    gain_s: float
    cost_s: float
    rule: str
    for_session: str = ""
    note: str = ""

    @property
    def net_s(self) -> float:
        return self.gain_s - self.cost_s


Entry = Proposal
"""A record entry is an accepted (or, for ``hold`` / ``wait``, a declined) proposal."""


@dataclass(frozen=True, slots=True)
class RoundRecord:
    """The typed record of one round: every admit, release, hold and wait with its rule and
    price, in the order decided."""

    tick: int
    now: float
    rules: str
    entries: tuple[Entry, ...] = ()
    prices: Mapping[str, float] = field(default_factory=dict)
    """Each node's prefill seconds per token that priced the round (its ``NodeCost``)."""

    def about(self, session: str) -> tuple[Entry, ...]:
        """The entries that name ``session`` (as subject or as the one room was made for)."""
        return tuple(e for e in self.entries if session in (e.session, e.for_session))

    def to_dict(self) -> dict[str, object]:
        """The record as plain values (log lines, JSONL)."""
        return {
            "tick": self.tick,
            "now": self.now,
            "rules": self.rules,
            "prices": dict(self.prices),
            "entries": [_entry_dict(e) for e in self.entries],
        }


def _entry_dict(e: Entry) -> dict[str, object]:
    out: dict[str, object] = {
        "kind": e.kind,
        "session": e.session,
        "node": e.node,
        "tokens": e.tokens,
        "rule": e.rule,
        "gain_s": _num(e.gain_s),
        "cost_s": _num(e.cost_s),
    }
    if e.for_session:
        out["for"] = e.for_session
    if e.note:
        out["note"] = e.note
    return out


def _num(x: float) -> float | str:
    return round(x, 6) if math.isfinite(x) else ("inf" if x > 0 else "-inf")


@dataclass(frozen=True, slots=True)
class Decision:
    """The round's output: releases first, then admits in plan order, and its record."""

    tick: int
    interrupts: tuple[Move, ...]
    admits: tuple[Move, ...]
    result: PlanResult
    demand: int = 0
    free: int = 0
    released_by: tuple[tuple[str, int], ...] = ()
    """How many of ``interrupts`` each rule released."""
    record: RoundRecord | None = None


@dataclass(frozen=True, slots=True)
class View:
    """A frozen view of the round so far, what a rule reads: the snapshot, the rule set, the
    room per node, and the sessions already released or admitted."""

    snapshot: TickSnapshot
    rules: RuleSet
    free: Mapping[str, int]
    taken: frozenset[str]
    debt: Mapping[str, int] = field(default_factory=dict)
    """Per node, the over-commit a release there pays back before its room is free."""
    wait_s: float = 0.0
    """(``wait``) What a release costs its session on return, in seconds: the wait its next
    request is expected to have in the pool (:func:`pool_wait`); 0 without the rule."""

    def cost(self, node: str) -> NodeCost:
        return self.snapshot.costs.get(node, DEFAULT_COST)

    def release_price(self, ic: InterruptCandidate) -> tuple[float, float]:
        """(gain, cost) in seconds of releasing ``ic``: the room's expected idle time, and
        the recompute and re-queue its release causes on its node, plus (``wait``) the wait
        its next request is expected to have in the pool."""
        cost = self.cost(ic.node).release_s(
            ic.tokens,
            self.snapshot.running.get(ic.node, 0),
            ic.host_tokens,
            "tier" in self.rules,
        )
        return ic.remaining_s, cost + self.wait_s

    def releasable(self, ic: InterruptCandidate) -> bool:
        """Whether a release for the pool is worth it: with ``cost``, when it nets seconds
        (always, when the remaining time is unknown); else always (the paper)."""
        if "cost" not in self.rules:
            return True
        gain, cost = self.release_price(ic)
        return math.isinf(gain) or gain - cost > 0

    def release_key(self) -> Callable[[InterruptCandidate], tuple[object, ...]]:
        """The release order: most net seconds first (``cost``), then ``(k, r, t)``."""
        if "cost" not in self.rules:
            return interrupt_key

        def key(ic: InterruptCandidate) -> tuple[object, ...]:
            gain, cost = self.release_price(ic)
            return (-(math.inf if math.isinf(gain) else gain - cost), *interrupt_key(ic))

        return key

    def release(
        self, ic: InterruptCandidate, rule: str, for_session: str = "", note: str = ""
    ) -> Proposal:
        """The proposal to release ``ic`` under ``rule``, priced (its note names the pool's
        wait where the cost counts it)."""
        gain, cost = self.release_price(ic)
        if self.wait_s > 0:
            waited = f"cost counts the pool's wait {self.wait_s:.1f} s"
            note = f"{note}; {waited}" if note else waited
        return Proposal("release", ic.id, ic.node, ic.weight, gain, cost, rule, for_session, note)

    def admit_price(self, c: TickCandidate, node: str) -> tuple[float, float]:
        """(gain, cost) in seconds of admitting ``c`` on ``node``: the prefill its credit
        there saves, and the prefill of the rest."""
        cost = self.cost(node)
        k = min(c.credit.get(node, 0), c.tokens)
        return cost.recompute_s(k, 0), cost.recompute_s(c.tokens - k, k)


Proposer = Callable[[View], list[Proposal]]


def pool_wait(snapshot: TickSnapshot) -> float:
    """The wait a request joining the pool now is expected to have, in seconds: the mean wait
    so far of the pooled sessions with a pending request (0 when none waits). A queue's
    mean age is its waiters' mean residual wait where arrivals are steady; it reads the
    snapshot only, so the simulator and the live planner price it alike."""
    now = snapshot.now
    ages = [now - c.waiting_since for c in snapshot.candidates if c.waiting_since is not None]
    return max(0.0, sum(ages) / len(ages)) if ages else 0.0


def needs_gpu(c: TickCandidate) -> bool:
    """A pooled session that will use the GPU now: a request is pending, or ``r = 1``."""
    return c.phase != "acting" or c.ready == 1


# ---- the rules: each a pure function of a View ------------------------------------------


def evacuate(view: View) -> list[Proposal]:
    """Sessions admitted on a dead node and not in a model call are released, so their next
    request is placed on a healthy node (gain: the node serves nobody)."""
    return [replace(view.release(ic, "evacuate"), gain_s=math.inf) for ic in view.snapshot.stranded]


def payback(view: View) -> list[Proposal]:
    """A node whose admitted contexts (each plus the headroom) exceed its KV, or (the
    paper's ``payback-reserved``) whose reservations exceed capacity × target, releases
    tool-running sessions until they fit: most net seconds first whatever their readiness
    (``payback``), or ``(k, r, t)`` order with ``r = 1`` protected (``payback-reserved``)."""
    snap, rules = view.snapshot, view.rules
    context = "payback" in rules
    owed = snap.pressure if context else snap.overflow
    out: list[Proposal] = []
    for node, need in sorted(owed.items()):
        on_node = [c for c in snap.interrupts if c.node == node]
        if need <= 0 or not on_node:
            continue
        if context:  # what a release frees of the contexts: tokens + headroom
            counted = [replace(c, weight=c.tokens + rules.payback_headroom) for c in on_node]
            pick = select_releases(counted, need, view.release_key())
        else:
            pick = select_interrupts(on_node, need, 0, key=interrupt_key)
        by_id = {c.id: c for c in on_node}
        note = f"node over by {need} tokens"
        out += [view.release(by_id[sid], "payback", note=note) for sid in pick.interrupt]
    return out


def tail(view: View, pool: Sequence[TickCandidate]) -> list[Proposal]:
    """A request waiting ``starve_s`` is placed first, oldest first, on the eligible node
    with the room and the most credit; one that fits nowhere has the node with the most free
    plus releasable room cleared for it (its tool-running sessions that are not ``r = 1``,
    lowest value first), and is placed there if it then fits."""
    snap, rules = view.snapshot, view.rules
    free = dict(view.free)
    debt = dict(view.debt)
    taken = set(view.taken)
    starving = sorted(
        (
            c
            for c in pool
            if c.waiting_since is not None and snap.now - c.waiting_since >= rules.starve_s
        ),
        key=lambda c: (c.waiting_since, c.id),
    )
    out: list[Proposal] = []
    for c in starving:
        room = [b for b in sorted(c.eligible) if c.weight <= free.get(b, 0)]
        waited = f"waited {snap.now - (c.waiting_since or snap.now):.1f} s"
        if not room:
            target = _clear_for(c, snap.interrupts, taken, free)
            if target is None:
                continue
            node, cleared = target
            for ic in cleared:
                taken.add(ic.id)
                paid = min(ic.weight, debt.get(node, 0))
                debt[node] = debt.get(node, 0) - paid
                free[node] = free.get(node, 0) + ic.weight - paid
                out.append(view.release(ic, "tail", c.id, waited))
            if c.weight > free[node]:
                continue
            room = [node]
        node = max(room, key=lambda b: (c.credit.get(b, 0), b == c.home, free[b], b))
        free[node] -= c.weight
        gain, cost = view.admit_price(c, node)
        out.append(Proposal("admit", c.id, node, c.weight, gain, cost, "tail", note=waited))
    return out


def _clear_for(
    c: TickCandidate,
    running: Sequence[InterruptCandidate],
    taken: set[str],
    free: Mapping[str, int],
) -> tuple[str, list[InterruptCandidate]] | None:
    """The node to clear for a starving candidate and whom to release there: the eligible
    node with the most free plus releasable room, and its releasable sessions in ascending
    value order until the candidate fits."""
    per_node: dict[str, list[InterruptCandidate]] = {}
    for ic in running:
        if ic.id not in taken and not ic.ready:
            per_node.setdefault(ic.node, []).append(ic)
    best: tuple[int, str] | None = None
    for b in sorted(c.eligible):
        room = free.get(b, 0) + sum(ic.weight for ic in per_node.get(b, ()))
        if best is None or room > best[0]:
            best = (room, b)
    if best is None:
        return None
    node = best[1]
    need = c.weight - free.get(node, 0)
    out: list[InterruptCandidate] = []
    for ic in sorted(per_node.get(node, ()), key=interrupt_key):
        if need <= 0:
            break
        out.append(ic)
        need -= ic.weight
    return node, out


def home(view: View, pool: Sequence[TickCandidate]) -> list[Proposal]:
    """Each pooled session whose home (last node) holds more of its prefix than any other
    node and lacks the room there, most home credit first: the releasable tool-running
    sessions on its home, in the demand step's order, are released for it where together
    they cover its shortfall; where they do not cover it, none is released for it. The room
    goes to the search with the session in the pool, not to the session by force: holding it
    for the session was measured 3.6 % slower (docs/internals.md, "The priced round")."""
    snap = view.snapshot
    room = dict(view.free)
    homed = sorted(
        (c for c in pool if _home_edge(c) > 0),
        key=lambda c: (-c.credit.get(c.home or "", 0), c.id),
    )
    if not homed:
        return []
    releasable_on: dict[str, list[InterruptCandidate]] = {}
    for ic in snap.interrupts:
        if ic.id not in view.taken and view.releasable(ic):
            releasable_on.setdefault(ic.node, []).append(ic)
    key = view.release_key()
    taken: set[str] = set()
    out: list[Proposal] = []
    for c in homed:
        node = c.home or ""
        if c.weight <= room.get(node, 0):
            room[node] = room.get(node, 0) - c.weight  # it fits at home: the search places it
            continue
        there = [ic for ic in releasable_on.get(node, ()) if ic.id not in taken]
        pick = select_interrupts(there, c.weight, room.get(node, 0), key=key)
        if not pick.satisfied:
            continue
        by_id = {ic.id: ic for ic in there}
        for sid in pick.interrupt:
            taken.add(sid)
            room[node] = room.get(node, 0) + by_id[sid].weight
            out.append(view.release(by_id[sid], "home", c.id))
        room[node] -= c.weight
    return out


def demand(view: View, pool: Sequence[TickCandidate]) -> list[Proposal]:
    """While the pool's demand exceeds the free room, tool-running sessions are released,
    ``r = 1`` protected, only where the release is worth it (:meth:`View.releasable`), most
    net seconds first; the ones considered and kept are returned as ``hold`` s."""
    snap = view.snapshot
    want = sum(c.weight for c in pool if c.id not in view.taken)
    have = sum(view.free.values())
    if want <= have:
        return []
    open_ = [ic for ic in snap.interrupts if ic.id not in view.taken]
    rest = [ic for ic in open_ if view.releasable(ic)]
    pick = select_interrupts(rest, want, have, key=view.release_key())
    chosen = set(pick.interrupt)
    by_id = {ic.id: ic for ic in rest}
    out = [view.release(by_id[sid], "demand") for sid in pick.interrupt]
    for ic in open_:
        if ic.id in chosen:
            continue
        why = "ready" if ic.ready else "not needed" if ic.id in by_id else "not worth it"
        p = view.release(ic, "demand", note=why)
        out.append(replace(p, kind="hold"))
    return out


def _home_edge(c: TickCandidate) -> int:
    """How much more credit ``c``'s home (its last node, eligible) holds for it than any
    other node: 0 when it has no home or another node holds as much."""
    node = c.home
    if node is None or node not in c.eligible:
        return 0
    best_else = max((k for b, k in c.credit.items() if b != node), default=0)
    return max(0, c.credit.get(node, 0) - best_else)


# ---- the arbiter --------------------------------------------------------------------------


@dataclass(slots=True)
class _Arbiter:
    """The room, the releases and the record of one round."""

    snapshot: TickSnapshot
    rules: RuleSet
    free: dict[str, int]
    debt: dict[str, int]
    wait_s: float = 0.0
    taken: set[str] = field(default_factory=set)
    releases: list[Move] = field(default_factory=list)
    admits: list[Move] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    released: dict[str, int] = field(default_factory=dict)

    def view(self) -> View:
        return View(
            self.snapshot,
            self.rules,
            MappingProxyType(dict(self.free)),
            frozenset(self.taken),
            MappingProxyType(dict(self.debt)),
            self.wait_s,
        )

    def accept(self, proposals: Iterable[Proposal]) -> None:
        snap = self.snapshot
        cands = {c.id: c for c in snap.candidates}
        for p in proposals:
            if p.kind in ("hold", "wait"):
                self.entries.append(p)
                continue
            if p.session in self.taken:
                continue
            self.taken.add(p.session)
            self.entries.append(p)
            if p.kind == "release":
                self.releases.append(Move(p.session, p.node, p.tokens, snap.versions[p.session]))
                self.released[p.rule] = self.released.get(p.rule, 0) + 1
                if p.rule == "evacuate":
                    continue  # a dead node's room is no room
                paid = min(p.tokens, self.debt.get(p.node, 0))
                if paid:
                    self.debt[p.node] -= paid
                if p.node in self.free:
                    self.free[p.node] += p.tokens - paid
            else:  # admit: its room is held for it now
                c = cands[p.session]
                self.free[p.node] -= p.tokens
                self.admits.append(Move(c.id, p.node, c.weight, snap.versions[c.id], c.digest))

    def moves_allowed(self, c: TickCandidate, fits: frozenset[str]) -> frozenset[str]:
        """(``home``) The nodes of ``fits`` that ``c`` may go to: all of them, unless its home
        holds more of its prefix than any other node and is not among them; then only those
        where its wait so far covers what the move costs (:meth:`NodeCost.move_s`), the
        ski-rental rule. A session kept from a move is recorded as a ``wait``."""
        node = c.home
        if "home" not in self.rules or node is None or node in fits or _home_edge(c) <= 0:
            return fits
        snap = self.snapshot
        waited = 0.0 if c.waiting_since is None else snap.now - c.waiting_since
        at_home = c.credit.get(node, 0)
        ok: set[str] = set()
        cheapest = math.inf
        for b in fits:
            price = snap.costs.get(b, DEFAULT_COST).move_s(
                at_home, c.credit.get(b, 0), snap.running.get(b, 0)
            )
            if waited >= price:
                ok.add(b)
            cheapest = min(cheapest, price)
        if fits and not ok:
            self.entries.append(
                Proposal(
                    "wait",
                    c.id,
                    node,
                    c.weight,
                    cheapest,
                    waited,
                    "home",
                    note="a move costs more than the wait so far",
                )
            )
        return frozenset(ok)

    def problem(self, pool: Sequence[TickCandidate]) -> Problem:
        """The placement problem of ``pool`` on the room left."""
        free = self.free
        nodes = tuple(replace(nd, free=free[nd.id]) for nd in self.snapshot.nodes)
        planned: list[Candidate] = []
        for c in pool:
            fits = self.moves_allowed(
                c, frozenset(b for b in c.eligible if c.weight <= free.get(b, 0))
            )
            planned.append(
                Candidate(
                    id=c.id,
                    weight=c.weight,
                    tokens=c.tokens,
                    ready=c.ready,
                    credit={b: k for b, k in c.credit.items() if b in fits},
                    eligible=fits,
                    phase=c.phase,
                )
            )
        return Problem(quantum=self.snapshot.quantum, nodes=nodes, candidates=tuple(planned))


def _stay_home(
    admits: list[Move], cands: Mapping[str, TickCandidate], free: Mapping[str, int]
) -> list[Move]:
    """Move each admit to its session's last node when that node is of equal value (same
    credit) and its room left after the plan allows; the plan's value is unchanged."""
    room = dict(free)
    for m in admits:
        room[m.node] = room.get(m.node, 0) - m.weight
    out: list[Move] = []
    for m in admits:
        c = cands.get(m.session)
        node = None if c is None else c.home
        if (
            c is not None
            and node is not None
            and node != m.node
            and node in c.eligible
            and c.credit.get(node, 0) == c.credit.get(m.node, 0)
            and room.get(node, 0) >= m.weight
        ):
            room[node] -= m.weight
            room[m.node] += m.weight
            m = replace(m, node=node)
        out.append(m)
    return out


def _ablated(snapshot: TickSnapshot, rules: RuleSet) -> TickSnapshot:
    """The snapshot with the credit or readiness signal switched off everywhere it acts."""
    cache, ready = "cache" in rules, "ready" in rules
    if cache and ready:
        return snapshot
    cands = tuple(
        replace(c, credit=c.credit if cache else {}, ready=c.ready if ready else 0)
        for c in snapshot.candidates
    )
    inter = tuple(
        replace(
            ic,
            credit=ic.credit if cache else 0,
            ready=ic.ready if ready else 0,
            remaining_s=ic.remaining_s if ready else 0.0,  # tool-blind: none known
        )
        for ic in snapshot.interrupts
    )
    return replace(snapshot, candidates=cands, interrupts=inter)


def decide(
    snapshot: TickSnapshot,
    policy: Policy,
    options: PlanOptions,
    rules: RuleSet,
) -> Decision:
    """One round (module docstring): evacuate, pay back, the tail, home, demand, then the
    policy's search on the room left, each admit moved home where that is of equal value
    (``stay``); the record holds every decision with its rule and price."""
    snapshot = _ablated(snapshot, rules)
    arb = _Arbiter(
        snapshot,
        rules,
        free={nd.id: nd.free for nd in snapshot.nodes},
        debt={b: over for b, over in snapshot.overflow.items() if over > 0},
        wait_s=pool_wait(snapshot) if "wait" in rules else 0.0,
    )
    arb.accept(evacuate(arb.view()))
    if "payback" in rules or "payback-reserved" in rules:
        arb.accept(payback(arb.view()))
    pool = (
        [c for c in snapshot.candidates if needs_gpu(c)]
        if "need" in rules
        else list(snapshot.candidates)
    )
    if "tail" in rules:
        arb.accept(tail(arb.view(), pool))
    pool = [c for c in pool if c.id not in arb.taken]
    want = sum(c.weight for c in pool)
    total_free = sum(arb.free.values())
    if pool and "home" in rules:
        arb.accept(home(arb.view(), pool))
    if pool and "demand" in rules:
        arb.accept(demand(arb.view(), pool))
    pool = [c for c in pool if c.id not in arb.taken]
    result = policy.plan(arb.problem(pool), options)
    by_id = {c.id: c for c in snapshot.candidates}
    placed = [
        Move(
            a.session,
            a.node,
            by_id[a.session].weight,
            snapshot.versions[a.session],
            by_id[a.session].digest,
        )
        for a in result.assignments
    ]
    if "stay" in rules:
        placed = _stay_home(placed, {c.id: c for c in pool}, arb.free)
    view = arb.view()
    for m in placed:
        gain, cost = view.admit_price(by_id[m.session], m.node)
        c = by_id[m.session]
        note = "moved from " + c.home if c.home is not None and c.home != m.node else ""
        arb.entries.append(
            Proposal("admit", m.session, m.node, m.weight, gain, cost, "search", note=note)
        )
    seen = {m.session for m in placed} | {e.session for e in arb.entries if e.kind == "wait"}
    for c in pool:  # one eligible nowhere is not waiting for room (snapshot.skipped says why)
        if c.id not in seen and c.eligible:
            arb.entries.append(
                Proposal("wait", c.id, "", c.weight, 0.0, 0.0, "search", note="no room")
            )
    return Decision(
        tick=snapshot.tick,
        interrupts=tuple(arb.releases),
        admits=(*arb.admits, *placed),
        result=result,
        demand=want,
        free=total_free,
        released_by=tuple(sorted(arb.released.items())),
        record=RoundRecord(
            snapshot.tick,
            snapshot.now,
            rules.name,
            tuple(arb.entries),
            {b: c.prefill_s for b, c in snapshot.costs.items()},
        ),
    )
