"""Valuation ticks: store → :func:`shared.core.tick.value_snapshot` → probe marks → snapshot.

A tick reads the pool (the store's ``pool`` index set) with its residency, the nodes and the
tool history, and values the pool. The admitted sessions in a tool (the interrupt candidates,
``admitted_tool``) and their residency are read and valued only when they can matter
(:func:`interrupts_matter`): when the pool's demand exceeds the nodes' total free capacity,
some healthy node is over-committed (reservations above capacity × target), or some node is
unhealthy — then the idle sessions admitted there are read too (from every admitted session),
and decide's evacuation releases them all with the ones in a tool. Otherwise
:func:`shared.core.tick.decide` interrupts nobody whatever the candidates (DESIGN 3.3: its
node-overflow step runs only on over-committed nodes and ``select_interrupts`` frees nothing
without a deficit), so the snapshot simply lists none. Consequence: the readiness probe marks
of in-tool admitted sessions advance only on ticks where they are read (shortfall ticks); a
probe mark matters only to the interrupt rule, which runs only on those ticks. The
``payback_context`` rule's pressure comes from the nodes' context totals read with the nodes
(:func:`shared.core.tick.node_pressure`; the store keeps ``contexts`` and ``held`` beside
``reserved``), on every tick. Under
``thunderagent`` / ``thunderagent-ideal`` the candidates are always read (its pause rule counts
acting programs).

A wake-up tick (the tool end → placement path) reads only the sessions that can have changed
since the last read: those its wake-ups named (the tools service names the sessions it wrote,
the planner's replan the ones that moved), those of the plans heard on ``tao.v1.plan`` since
(:meth:`Valuator.on_plan`: admitted, interrupted, or discarded), those listed by the snapshots
the planner has not answered yet (it may have applied them before its plan arrives), and those
the idle sweep ended; plus every node. The rest of the pool is what the last whole read saw. A
periodic tick, a wake-up that names nobody, and a wake-up tick ``pool_every_s`` (1 s) after the
last whole read read the pool whole, so a record changed without a wake-up (a tool start of a
pooled session in a batch with no tool end) or a residency moved by the telemetry is seen
within a second; a plan that selects such a record is discarded by the apply's version check
and its replan names it. ThunderAgent's policies always read whole.

Each node's shared prefix (:attr:`NodeView.shared`, taken off its free room once) is the
largest ``shared`` among the sessions admitted there that the valuation has seen, kept across
ticks (:mod:`services.valuation.nodeshared`): the first tick reads every admitted session once,
the tools service's ``shared`` wake-ups name the sessions whose ``shared`` changed (read at the
next tick, admitted or not; they are not woken for), and plans' admits carry their candidates'.

Residency credit decays from the latest time the evidence confirms it: a node whose KV-event
stream has been complete since a pair's observation confirms it up to the stream's last batch
(:func:`shared.core.decay.with_evidence`, the nodes' ``kv_since`` / ``kv_until`` written by the
telemetry service and read with the nodes); otherwise from its ``t_obs``.

Reads go through :class:`shared.infra.store_reads.SessionReader`: on Redis one script call per
1,000 sessions that returns full fields only for sessions whose version changed since the
previous tick (decoded records are kept): a few round trips, and JSON decoding only for the
sessions that changed.

The snapshot is published on ``tao.v1.valuation.snapshot`` when the pool has candidates, plus
once when it becomes empty (so the planner sees the change), and whenever a node is
over-committed by reservations that grew after admission (the planner releases tool-running
sessions there); an empty, unchanged pool publishes nothing but the tick counter still
advances.

With ``TAO_POLICY`` one of :data:`services.planner.thunder.THUNDERAGENT_POLICIES`
(``thunderagent=True``) every tick publishes, empty pool or not (ThunderAgent's periodic check
runs whatever the pool), and the snapshot lists the admitted sessions outside a tool
(``admitted``: a model call in flight, or idle), which its state machine counts. The store has
no index of them, so that costs one read of the ``sessions`` id set and one pipelined record
read per stored session outside the two index sets (ended ones not yet deleted included):
O(stored sessions) per tick, under these policies only.

The idle sweep ends admitted sessions idle longer than ``TAO_IDLE_TIMEOUT_S``: it reads four
fields of every session (:func:`shared.infra.store_reads.idle_candidates`), then ``on_end``
through the store's consistent batch update (which releases the reservations, re-checking each
record), then ``SessionEnd`` (``reason="idle_timeout"``) on the session stream, published
concurrently, for the gateway and the tools service. It runs as its own task on a slower
period (:mod:`services.valuation.app`), never inside a tick.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import anyio
import msgspec
from structlog.typing import FilteringBoundLogger

from services.planner.mapping import to_wire
from services.planner.thunder import Held, held_sessions
from services.valuation.nodeshared import NodeShared
from shared.contracts import subjects
from shared.contracts.codec import encode
from shared.contracts.domain import DomainLoadReport
from shared.contracts.plan import Plan
from shared.contracts.session import END_IDLE_TIMEOUT, SessionEnd
from shared.contracts.valuation import ValuationSnapshot
from shared.core.decay import with_evidence
from shared.core.domains import domain_load
from shared.core.predictor import History
from shared.core.rules import PAPER, RuleSet
from shared.core.session import Session, on_end
from shared.core.tick import (
    HostResidency,
    Residency,
    TickSnapshot,
    node_pressure,
    value_snapshot,
)
from shared.core.valuation import NodeView, ValuationParams
from shared.infra.busapi import Delivery, MessageBus
from shared.infra.settings import Settings
from shared.infra.store_reads import SessionReader, idle_candidates, is_idle
from shared.infra.store_types import SessionFnWith, StateStore

__all__ = [
    "OUTSTANDING_S",
    "PAYLOAD_MARGIN",
    "SHARED_NAMES_MAX",
    "SWEEP_BATCH",
    "SWEEP_PUBLISHES",
    "Valuator",
    "fit_payload",
    "interrupts_matter",
    "params_from",
    "with_interrupts",
]

SWEEP_BATCH = 256
"""Sessions per idle-sweep batch update (one transaction each; a conflict retries one batch)."""
SWEEP_PUBLISHES = 64
"""``SessionEnd`` publishes the idle sweep keeps in flight at once."""
SHARED_NAMES_MAX = 4096
"""Sessions named by ``shared`` wake-ups kept for the next tick; past it, it reads every
admitted session instead."""
OUTSTANDING_S = 5.0
"""How long a published snapshot waits for the planner's answer before it counts as
superseded (or as published while no planner led): far above a solve's time limit."""


def params_from(settings: Settings) -> ValuationParams:
    """The valuation knobs from settings (DESIGN 3.1–3.2)."""
    return ValuationParams(
        half_life_s=settings.half_life_s,
        credit_unit=settings.credit_unit,
        quantum=settings.quantum,
        reserve=settings.reserve_tokens,
        horizon_s=settings.horizon_s,
        freshness_s=settings.freshness_s,
    )


def interrupts_matter(snap: TickSnapshot) -> bool:
    """Whether :func:`shared.core.tick.decide` may interrupt anyone on ``snap`` (valued from
    the pool alone): some node is unhealthy (its sessions are evacuated) or over-committed,
    or the pool's demand exceeds the total free capacity (exactly ``select_interrupts``'
    deficit test, ``demand > max(0, free)``)."""
    if snap.unhealthy or snap.overflow or snap.pressure:
        return True
    if not snap.candidates:
        return False
    demand = sum(c.weight for c in snap.candidates)
    return demand > max(0, sum(nd.free for nd in snap.nodes))


def with_interrupts(pool: TickSnapshot, tool: TickSnapshot) -> TickSnapshot:
    """``pool`` merged with ``tool`` (valued at the same tick, nodes and now from disjoint
    session lists): what :func:`value_snapshot` gives on both lists together, sorted by id.
    Each record is classified by its own state, so one that moved between the two id reads
    still lands where the old single read would have put it."""
    return replace(
        pool,
        candidates=tuple(sorted((*pool.candidates, *tool.candidates), key=lambda c: c.id)),
        interrupts=tuple(sorted((*pool.interrupts, *tool.interrupts), key=lambda c: c.id)),
        versions={**pool.versions, **tool.versions},
        probe_marks={**pool.probe_marks, **tool.probe_marks},
    )


PAYLOAD_MARGIN = 4096
"""Bytes kept free under the server's ``max_payload`` for the message's headers."""


def fit_payload(msg: ValuationSnapshot, max_payload: int) -> tuple[bytes, int]:
    """``msg`` encoded, and how many of its sessions had to be left for a later tick so that it
    fits the bus's ``max_payload``: a pool of thousands (10,000 arrivals at once in the soak)
    encodes past nats-server's default 1 MiB, and a snapshot that cannot be published stops
    every admission. Kept: the same share of each list (candidates, interrupt candidates and
    ThunderAgent's admitted sessions), the ready candidates first, each list otherwise in its
    order; the planner sees a smaller pool this tick and the rest at the next."""
    data = encode(msg)
    limit = max_payload - PAYLOAD_MARGIN
    if len(data) <= limit:
        return data, 0
    cands = sorted(msg.candidates, key=lambda c: not c.ready)  # stable: ready ones first
    total = len(msg.candidates) + len(msg.interrupt_candidates) + len(msg.admitted or ())

    def share(keep: float) -> ValuationSnapshot:
        def cut(xs: list[Any]) -> list[Any]:
            return xs[: int(len(xs) * keep)]

        admitted = None if msg.admitted is None else cut(msg.admitted)
        return msgspec.structs.replace(
            msg,
            candidates=cut(cands),
            interrupt_candidates=cut(msg.interrupt_candidates),
            admitted=admitted,
        )

    lo, hi = 0.0, 1.0  # the largest share that fits, to 1/1024
    for _ in range(10):
        mid = (lo + hi) / 2
        if len(encode(share(mid))) <= limit:
            lo = mid
        else:
            hi = mid
    fitted = share(lo)
    kept = len(fitted.candidates) + len(fitted.interrupt_candidates) + len(fitted.admitted or ())
    return encode(fitted), total - kept


def _idle_too_long(s: Session | None, now: float, timeout_s: float) -> bool:
    return s is not None and is_idle(s.node, s.activity, s.ended, s.updated_at, now, timeout_s)


def _idle_end(now: float, timeout_s: float) -> SessionFnWith[bool]:
    """``on_end`` for a session still idle too long (flag True), else no write (False)."""

    def step(s: Session | None) -> tuple[Session | None, bool]:
        if s is not None and _idle_too_long(s, now, timeout_s):
            return on_end(s, now), True
        return None, False

    return step


def with_host_links(views: list[NodeView], load: Mapping[str, float]) -> list[NodeView]:
    """``views`` with each node's host-tier load seconds per token from ``load`` (absent: no
    host tier, 0)."""
    if not load:
        return views
    return [
        v if load.get(v.id, 0.0) == v.host_load_s_per_token
        else replace(v, host_load_s_per_token=load.get(v.id, 0.0))
        for v in views
    ]  # fmt: skip


@dataclass(slots=True)
class Valuator:
    """The valuation service's state across ticks."""

    store: StateStore
    bus: MessageBus
    log: FilteringBoundLogger
    params: ValuationParams
    idle_timeout_s: float
    clock: Callable[[], float]
    tick: int = 0
    published: int = 0
    last_nonempty: bool = False
    thunderagent: bool = False
    rules: RuleSet = PAPER
    """The policy's rules (``TAO_POLICY``): the growth rule sets the candidates' reserve."""
    reader: SessionReader | None = field(default=None)
    history_every_s: float = 1.0
    """How long a wake-up tick may reuse the tool-duration history (:attr:`history`)."""
    history: History | None = None
    """The tool-duration history of the last tick that read it: a wake-up tick reuses one
    younger than :attr:`history_every_s` (a second's new samples barely move the readiness
    estimates; a periodic tick always reads it)."""
    history_at: float | None = None
    pool_every_s: float = 1.0
    """How long a wake-up tick may reuse the pool of the last whole read: it reads only the
    sessions named by its wake-ups, by the planner's plans since the last read and by the
    snapshots the planner has not answered yet, and every node (``named``); a periodic tick, a
    wake-up that names no session, and a wake-up tick later than this after the last whole
    read read the pool whole."""
    pool_at: float | None = None
    """When the last whole read of the pool began."""
    moved: set[str] = field(default_factory=set)
    """Sessions whose records changed outside any wake-up since the last read began: those of
    the plans received (admitted, interrupted, or discarded) and of the idle sweep."""
    outstanding: dict[int, tuple[float, frozenset[str]]] = field(default_factory=dict)
    """Published snapshots the planner has not answered with a plan yet: tick → (published at,
    the sessions its plan may move: the candidates eligible somewhere, the interrupt
    candidates). Its apply may move them before its plan arrives."""
    answered: int = 0
    """The newest tick of this valuation a plan answered."""
    named_ticks: int = 0
    """Ticks that read only named sessions."""
    node_shared: NodeShared = field(default_factory=NodeShared)
    """Each node's shared prefix as far as the records read tell (module docstring)."""
    shared_names: set[str] | None = field(default_factory=set)
    """Sessions whose ``shared`` changed (``shared`` wake-ups) to read at the next tick;
    ``None``: a wake-up named none, read every admitted session."""
    shared_cold: bool = True
    """No tick has read every admitted session yet (the next one does)."""
    host_load: Mapping[str, float] = field(default_factory=dict)
    """Per node with a host KV tier, seconds to load one token from it (the nodes file's
    ``kv_bytes_per_gpu_token`` / ``h2d_gbs``, :attr:`NodeSpec.host_load_s_per_token`): set on
    the node views each tick, with each session's host residency (:meth:`SessionReader.host`)
    passed to :func:`value_snapshot`."""

    def __post_init__(self) -> None:
        if self.reader is None:
            self.reader = SessionReader(self.store)

    async def on_plan(self, msg: Plan, d: Delivery) -> None:
        """A plan the planner applied (or discarded): its sessions are read again at the next
        tick, and the snapshots up to its tick are answered (the planner plans the newest
        snapshot it has, so an older one left unanswered was superseded)."""
        self.moved.update(a.session for a in msg.assignments)
        self.moved.update(a.session for a in msg.interrupts)
        at = self.clock()
        for a in msg.assignments:
            self.node_shared.admitted(a.session, a.node, at)
        if msg.tick <= self.tick:  # a tick of this valuation (another one's counts apart)
            self.answered = max(self.answered, msg.tick)
            for t in [t for t in self.outstanding if t <= self.answered]:
                del self.outstanding[t]

    def note_shared(self, names: Collection[str] | None) -> None:
        """A ``shared`` wake-up: these sessions' ``shared`` changed (``None``: some did).
        The next tick reads them, and a named read of the pool includes them."""
        if names is None:
            self.shared_names = None
        else:
            if self.shared_names is not None:
                self.shared_names.update(names)
                if len(self.shared_names) > SHARED_NAMES_MAX:  # (a standby never ticks)
                    self.shared_names = None
            self.moved.update(names)

    def _names(self, named: Collection[str] | None, reason: str, now: float) -> set[str] | None:
        """The sessions a tick reads, or ``None`` to read the whole pool (module docstring)."""
        whole = (
            named is None
            or reason != "wake"
            or self.thunderagent
            or self.pool_at is None
            or now - self.pool_at >= self.pool_every_s
        )
        for t in [t for t, (at, _) in self.outstanding.items() if now - at > OUTSTANDING_S]:
            del self.outstanding[t]  # superseded, or no planner leads: nothing will answer
        moved, self.moved = self.moved, set()
        if whole:
            return None
        names = set(named or ()) | moved
        for _, listed in self.outstanding.values():
            names |= listed
        return names

    async def _report_load(self, views: list[NodeView], pool: list[Session], now: float) -> None:
        """Publish the domain's load for the gateways' upper-level choice (a lost one is
        superseded next tick)."""
        load = domain_load(self.store.domain, views, pool, self.params.reserve)
        report = DomainLoadReport(
            domain=load.name,
            ts=now,
            tick=self.tick,
            capacity=load.capacity,
            demand=load.demand,
            models=None if load.models is None else sorted(load.models),
        )
        try:
            await self.bus.publish_msg(report)
        except Exception as exc:
            self.log.warning("domain_load_unpublished", error=f"{type(exc).__name__}: {exc}")

    async def run_tick(
        self, reason: str = "period", named: Collection[str] | None = None
    ) -> TickSnapshot:
        """Value the pool now (and the interrupt candidates when they can matter); persist
        changed probe marks; publish the snapshot if useful. ``named``: the sessions the
        wake-ups named (``None``: one named none), read alone when the rest of the pool may be
        reused (:attr:`pool_every_s`)."""
        reader = self.reader
        assert reader is not None
        self.tick += 1
        now = self.clock()
        names = self._names(named, reason, now)
        if names is None:
            self.pool_at = now
        else:
            self.named_ticks += 1
        shared_names, self.shared_names = self.shared_names, set()
        try:
            pool, residency, views = await reader.tick_read("pool", names)
        except BaseException:
            self.pool_at = None  # the names taken are lost with this tick: read whole next
            self.shared_cold = True  # and every admitted session
            raise
        evidence = reader.evidence
        admitted: list[Session] | None = None

        async def read_admitted() -> list[Session]:
            in_pool = {s.id for s in pool}
            others = sorted((await self.store.session_ids()) - in_pool)
            # decoded only when changed; their residency is not needed (stranded)
            got, _ = await reader.read(others, "admitted", residency=False)
            self.node_shared.learn(got, now)
            return got

        self.node_shared.pooled(pool)
        cold, self.shared_cold = self.shared_cold or shared_names is None, True
        if cold:
            admitted = await read_admitted()
        elif shared_names:
            in_pool = {s.id for s in pool}
            ids = sorted(sid for sid in shared_names if sid not in in_pool)
            if ids:
                got, _ = await reader.read(ids, "shared", residency=False)
                self.node_shared.learn(got, now)
        self.shared_cold = False  # (a failed read above leaves it set: the names are lost)
        views = with_host_links(self.node_shared.views(views, now), self.host_load)
        history = self.history
        stale = self.history_at is None or now - self.history_at >= self.history_every_s
        if history is None or reason != "wake" or stale:
            history = self.history = await self.store.history()
            self.history_at = now

        def value(sessions: list[Session], res: Residency, host: HostResidency) -> TickSnapshot:
            res = with_evidence(res, evidence)  # credit ages from its latest confirmation
            return value_snapshot(
                sessions, views, res, history, now, tick=self.tick, params=self.params,
                rules=self.rules, host=host,
            )  # fmt: skip

        snap = value(pool, residency, reader.host("pool"))
        sessions = pool
        down = {v.id for v in views if not v.healthy}

        if "payback" in self.rules:  # each node's context total, read with the node
            pressure = node_pressure(views, self.rules.payback_headroom, full=True)
            snap = replace(snap, pressure=pressure)
        stranded: list[Session] = []
        if down:  # idle sessions admitted on a dead node, to be released (decide's step 0)
            if admitted is None:
                admitted = await read_admitted()
            stranded = [s for s in admitted if s.node in down and s.activity == "idle"]
        read_tool = self.thunderagent or interrupts_matter(snap)
        if read_tool:
            tool, tool_res = await reader.index("admitted_tool")
            in_pool = {s.id for s in pool}
            tool = [s for s in tool if s.id not in in_pool]  # moved between the two reads
            self.node_shared.learn(tool, now)
            in_tool = {s.id for s in tool}
            tool += [s for s in stranded if s.id not in in_pool and s.id not in in_tool]
            snap = with_interrupts(snap, value(tool, tool_res, reader.host("admitted_tool")))
            sessions = pool + tool
        stored = {s.id: s.probe_mark for s in sessions}
        marks = {sid: m for sid, m in snap.probe_marks.items() if stored.get(sid) != m}
        written = await self.store.put_probe_marks(marks, snap.versions) if marks else 0
        reader.note_probe_marks("pool", marks)
        held: list[Held] | None = None
        if self.thunderagent:
            rest = (await self.store.session_ids()) - set(stored)
            held = held_sessions(await self.store.sessions(sorted(rest))) if rest else []
        publish = (
            bool(snap.candidates)
            or bool(snap.overflow)
            or bool(snap.pressure)
            or bool(snap.stranded)
            or self.last_nonempty
            or self.thunderagent
        )
        deferred = 0
        if publish:
            data, deferred = fit_payload(to_wire(snap, views, held), self.bus.max_payload)
            await self.bus.publish(subjects.valuation_snapshot(), data)
            self.published += 1
            # what the plan may move: a candidate eligible on no node cannot be admitted
            listed = frozenset(c.id for c in snap.candidates if c.eligible)
            listed |= {c.id for c in snap.interrupts}
            if listed:
                self.outstanding[self.tick] = (now, listed)
        self.last_nonempty = bool(
            snap.candidates or snap.overflow or snap.pressure or snap.stranded
        )
        await self._report_load(views, pool, now)
        self.log.info(
            "valuation_tick",
            tick=self.tick,
            reason=reason,
            candidates=len(snap.candidates),
            interrupts=len(snap.interrupts) if read_tool else None,
            admitted_other=len(held) if held is not None else None,
            ready=sum(c.ready for c in snap.candidates),
            nodes=len(views),
            free=sum(nd.free for nd in snap.nodes),
            marks_written=written,
            published=publish,
            deferred=deferred or None,
            named=None if names is None else len(names),
            **skipped_fields(snap.skipped),
        )
        return snap

    async def sweep_idle(self) -> list[str]:
        """End admitted sessions idle longer than the timeout; return their ids (sorted)."""
        now = self.clock()
        ids = await idle_candidates(self.store, now, self.idle_timeout_s)
        step = _idle_end(now, self.idle_timeout_s)
        ended: list[tuple[str, Session]] = []
        for lo in range(0, len(ids), SWEEP_BATCH):
            part = ids[lo : lo + SWEEP_BATCH]
            out = await self.store.update_sessions_with([(sid, step) for sid in part])
            # False: the record moved meanwhile (a new request, an end): not ended here
            ended += [
                (sid, rec) for sid, (rec, mine) in zip(part, out, strict=True) if mine and rec
            ]
        limiter = anyio.CapacityLimiter(SWEEP_PUBLISHES)

        async def publish(sid: str, gateway_id: str | None) -> None:
            async with limiter:
                await self.bus.publish_msg(
                    SessionEnd(
                        session_id=sid, ended_at=now, reason=END_IDLE_TIMEOUT, gateway_id=gateway_id
                    )
                )

        async with anyio.create_task_group() as tg:
            for sid, rec in ended:
                tg.start_soon(publish, sid, rec.gateway_id)
        names = [sid for sid, _ in ended]
        self.moved.update(names)  # left the pool: the next named read must see it
        self.log.info("idle_sweep", ended=len(names), sessions=names or None)
        return names


SKIPPED_LOGGED = 16
"""Most skipped sessions a ``valuation_tick`` line names (it counts every one by reason)."""


def skipped_fields(skipped: Mapping[str, str]) -> dict[str, object]:
    """The ``valuation_tick`` fields of the candidates eligible on no node: ``skipped_by``
    (count per reason) and ``skipped`` (the first :data:`SKIPPED_LOGGED`, id → reason)."""
    if not skipped:
        return {}
    shown = dict(sorted(skipped.items())[:SKIPPED_LOGGED])
    return {"skipped_by": dict(Counter(skipped.values())), "skipped": shown}
