"""The planner's handler: snapshot → decide (small: on the loop) → verify-and-apply → publish.

Only the latest snapshot matters: :meth:`Planner.on_snapshot` keeps one pending snapshot and a
newer one supersedes it while a solve runs. :meth:`Planner.plan_once` solves with
:func:`shared.core.tick.decide` off the event loop (``anyio.to_thread.run_sync`` with a capacity
limiter of 1; the kernels release the GIL), or on it when the problem is small (at most
:data:`INLINE_PAIRS` candidate-node pairs: the thread's hand-off, ~0.2 ms, costs more than
such a solve, and the tool-end -> placement path waits for it), applies the decision with the
store's atomic ``apply`` (which discards the plan if a selected session's version moved and
applies the longest prefix live capacity admits), then publishes one ``Placement`` per applied
move on JetStream and the ``Plan`` on core NATS, and logs one line.

With ``thunderagent`` or ``thunderagent-ideal`` (:data:`THUNDERAGENT_POLICIES`) the snapshot
drives ThunderAgent's state machine instead (:mod:`services.planner.thunder` over
:mod:`shared.core.thunder`, the one the simulator runs): no solve; its pauses are the
interrupts of one decision (the same atomic apply and version checks), and its resumes and
forced resumes (1800 s of waiting) are admitted by its own accounting, outside the
capacity-checked apply (:mod:`services.planner.thunder_apply`), as ThunderAgent's are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, NamedTuple

import anyio
import anyio.to_thread
from structlog.typing import FilteringBoundLogger

from services.planner.mapping import from_wire, held_from_wire
from services.planner.thunder import Held, TAStep, ThunderState, is_thunderagent
from services.planner.thunder_apply import admit_unchecked
from shared.contracts import subjects
from shared.contracts.codec import decode, encode
from shared.contracts.plan import Placement, PlacementKind, Plan, WireAssignment, WireObjective
from shared.contracts.valuation import ValuationSnapshot
from shared.contracts.wake import WAKE_REPLAN, wake_for
from shared.core.explain import round_fields
from shared.core.policies.base import PlanOptions, Policy
from shared.core.problem import ZERO, PlanDiagnostics, PlanResult
from shared.core.thunder import SCHEDULER_INTERVAL_S
from shared.core.tick import Applied, Decision, Move, TickSnapshot, decide
from shared.infra import tracing
from shared.infra.busapi import Delivery, MessageBus
from shared.infra.lease import Leadership
from shared.infra.signing import PlacementSigner
from shared.infra.store_types import StateStore

__all__ = ["Planner", "Snapshot", "decode_snapshot", "measured_used", "plan_msg"]

_tracer = tracing.tracer("services.planner")


class Snapshot(NamedTuple):
    """A received snapshot in core form, with each node's KV capacity and health from the wire
    and, under a ThunderAgent policy, the admitted sessions outside a tool (``None`` when not
    listed)."""

    core: TickSnapshot
    capacity: Mapping[str, int]
    held: tuple[Held, ...] | None = None
    healthy: Mapping[str, bool] | None = None
    used: Mapping[str, int | None] | None = None
    """Each node's KV in use where it measures shared tokens (:func:`measured_used`)."""


def decode_snapshot(data: bytes) -> Snapshot:
    """Decode and map a ``ValuationSnapshot`` (a ContractError dead-letters it)."""
    msg = decode(data, ValuationSnapshot)
    return Snapshot(
        from_wire(msg),
        {nd.id: nd.capacity for nd in msg.nodes},
        held_from_wire(msg),
        {nd.id: nd.healthy for nd in msg.nodes},
        {nd.id: measured_used(nd.used, nd.running, nd.waiting) for nd in msg.nodes},
    )


def measured_used(used: int, running: int, waiting: int) -> int | None:
    """A node's KV in use as ``thunderagent-ideal``'s shared-token measure, or None (no
    measure: shared 0, vllm_metrics.py:305–306) while the engine queues requests (then some
    forwarded requests hold no KV, and the planner cannot tell which) or reports 0 while it
    runs requests (no usage metric)."""
    if waiting > 0 or (used == 0 and running > 0):
        return None
    return used


def plan_msg(d: Decision, policy: str, elapsed_ms: float) -> Plan:
    """The ``Plan`` published on ``tao.v1.plan`` for ``d``."""
    r = d.result
    return Plan(
        tick=d.tick,
        policy=policy,
        assignments=[WireAssignment(m.session, m.node) for m in d.admits],
        interrupts=[WireAssignment(m.session, m.node) for m in d.interrupts],
        objective=WireObjective(**r.objective._asdict()),
        exact=r.exact,
        method=r.method,
        states=r.states,
        elapsed_ms=elapsed_ms,
        reason=r.reason,
    )


def _thunder_decision(tick: int, ta: TAStep, policy: str) -> Decision:
    """ThunderAgent's pauses and resumes as one decision (forced resumes are applied apart)."""
    forced = {m.session for m in ta.forced}
    admits = tuple(m for m in ta.admits if m.session not in forced)
    result = PlanResult(
        (), ZERO, False, policy, diagnostics=PlanDiagnostics(marked=ta.marked, checked=ta.checked)
    )
    return Decision(tick, ta.pauses, admits, result)


PUBLISH_WINDOW: Final = 256
"""Placements awaiting their JetStream acks at once (:meth:`Planner._publish_all`)."""

INLINE_PAIRS: Final = 512
"""Candidates × nodes up to which the planner solves on its event loop: 50 candidates on 4
nodes solve in ~0.3 ms on the 2-core machine (docs/benchmarks.md), against ~0.5 ms through
the worker thread; a larger problem, which may run to the time limit, goes to the thread."""


def solves_inline(core: TickSnapshot) -> bool:
    """Whether the planner solves ``core`` on its event loop (:data:`INLINE_PAIRS`)."""
    return len(core.candidates) * max(1, len(core.nodes)) <= INLINE_PAIRS


@dataclass(slots=True)
class Planner:
    """The planner service's state across ticks (one policy object: ``rr`` keeps state; under
    a ThunderAgent policy, ``thunder``, made from the policy name and ``ta_interval_s``)."""

    store: StateStore
    bus: MessageBus
    log: FilteringBoundLogger
    policy: Policy
    budget: int
    time_limit_ms: float
    clock: Callable[[], float] = time.time
    limiter: anyio.CapacityLimiter = field(default_factory=lambda: anyio.CapacityLimiter(1))
    pending: Snapshot | None = None
    ready: anyio.Event = field(default_factory=anyio.Event)
    superseded: int = 0
    ta_interval_s: float = SCHEDULER_INTERVAL_S
    thunder: ThunderState | None = None
    signer: PlacementSigner | None = None
    """Signs every placement published (``TAO_PLACEMENT_KEY``, :mod:`shared.infra.signing`)."""
    leader: Leadership | None = None
    """This replica's side of the domain's planner lease; None: the only planner (no election,
    plans unfenced). While it does not lead, or has not yet fenced the domain at its epoch,
    snapshots are dropped (:attr:`standby_skips`)."""
    standby_skips: int = 0
    rounds: int = 0
    """Plan rounds this replica ran (its readiness record shows them, :mod:`.app`)."""
    last_tick: int = 0
    fenced: int = 0
    """The epoch this replica has fenced the domain at (:meth:`on_leadership`): it plans only
    under that epoch, so no plan of its own lands before a deposed leader's are refused."""

    def __post_init__(self) -> None:
        if self.thunder is None and is_thunderagent(self.policy.name):
            self.thunder = ThunderState.for_policy(self.policy.name, self.ta_interval_s)

    async def on_snapshot(self, snap: Snapshot, d: Delivery) -> None:
        """Keep only the newest snapshot; the loop in :meth:`run` picks it up."""
        if self.pending is not None:
            self.superseded += 1
        if self.pending is None or snap.core.tick >= self.pending.core.tick:
            self.pending = snap
        self.ready.set()

    async def run(self) -> None:
        """Plan the newest pending snapshot, forever (until cancelled)."""
        while True:
            await self.ready.wait()
            self.ready = anyio.Event()
            snap, self.pending = self.pending, None
            if snap is None:
                continue
            try:
                await self.plan_once(snap)
            except Exception:  # a bad tick must not stop the planner: log it, plan the next
                self.log.exception("plan_failed", tick=snap.core.tick)

    def _solve(self, snap: TickSnapshot) -> Decision:
        deadline = time.monotonic() + self.time_limit_ms / 1000.0
        options = PlanOptions(budget=self.budget, expired=lambda: time.monotonic() > deadline)
        return decide(snap, self.policy, options)

    @property
    def can_plan(self) -> bool:
        """Whether this replica plans now: the only planner, or the leader once it fenced the
        domain at its epoch."""
        leader = self.leader
        return leader is None or (leader.leading and self.fenced == leader.epoch)

    async def on_leadership(self, epoch: int) -> None:
        """The lease was taken (``epoch`` > 0) or lost (0). On taking it: fence the domain at
        the new epoch (a deposed leader's late applies are refused from now on), then re-publish
        the admissions, as at start-up; a ThunderAgent state machine restarts from the next
        snapshot, which lists every admitted session."""
        if epoch <= 0:
            return
        if not await self.store.fence(epoch):
            self.log.warning("lease_fence_refused", epoch=epoch)
            return
        self.fenced = epoch  # plans may go on from here, beside the re-publishing below
        if self.thunder is not None:
            self.thunder = ThunderState.for_policy(self.policy.name, self.ta_interval_s)
        await self.resync()

    async def plan_once(self, snap: Snapshot) -> Applied | None:
        """Solve, apply and publish one snapshot; ``None`` when there was nothing to plan
        (under a ThunderAgent policy with no move: what the forced resume did, if anything), or
        when this replica does not hold the lease. The apply carries the lease's epoch as it
        was when the solve began, so a lease lost meanwhile fences the plan out."""
        epoch = 0
        if self.leader is not None:
            if not self.leader.leading or self.fenced != self.leader.epoch:
                self.standby_skips += 1
                return None
            epoch = self.leader.epoch
        try:
            return await self._plan(snap, epoch)
        finally:  # bookkeeping, off the tool-end -> placement path
            self.rounds += 1
            self.last_tick = snap.core.tick
            with anyio.CancelScope(shield=True):
                await self.store.incr(ticks=1)

    async def _plan(self, snap: Snapshot, epoch: int) -> Applied | None:
        core = snap.core
        forced: Applied | None = None
        direct: tuple[Move, ...] = ()
        ta = TAStep()
        t_started = time.time()
        if self.thunder is not None:
            t0 = time.perf_counter()
            ta = self.thunder.step(core, snap.capacity, snap.held, snap.healthy, snap.used)
            elapsed_ms = (time.perf_counter() - t0) * 1000.0
            forced = await self._force_resume(core.tick, ta)
            if not core.candidates and not ta.pauses and not ta.admits:
                self.log.info("plan_tick", tick=core.tick, candidates=0, skipped="no move")
                return forced
            decision = _thunder_decision(core.tick, ta, self.policy.name)
            direct, decision = decision.admits, replace(decision, admits=())
        else:
            if not (core.candidates or core.overflow or core.pressure or core.stranded):
                self.log.info("plan_tick", tick=core.tick, candidates=0, skipped="empty pool")
                return forced
            t0 = time.perf_counter()
            if solves_inline(core):
                decision = self._solve(core)  # short: a thread's hand-off would cost more
            else:
                decision = await anyio.to_thread.run_sync(self._solve, core, limiter=self.limiter)
            elapsed_ms = (time.perf_counter() - t0) * 1000.0
        shown = replace(decision, admits=direct) if direct else decision
        if forced is not None and forced.admitted:
            shown = replace(shown, admits=forced.admitted + shown.admits)
        r = decision.result
        tao_family = self.policy.name.startswith("tao")  # only the DP has a fallback
        with anyio.CancelScope(shield=True):  # a stop between apply and publish loses placements
            applied = await self.store.apply(decision, self.clock(), epoch=epoch)
            if direct and not applied.fenced and self.can_plan:
                more = await admit_unchecked(self.store, direct, self.clock())
                applied = replace(
                    applied,
                    discarded=applied.discarded and not more.admitted,
                    admitted=applied.admitted + more.admitted,
                    sessions={**applied.sessions, **more.sessions},
                )
            placed = await self._publish_placements(core.tick, applied)
        # The plan before the replan and the bookkeeping: the valuation re-reads the sessions it
        # names at its next tick (it reuses the rest of its pool, services/valuation/handlers.py)
        await self.bus.publish(
            subjects.plan(), encode(plan_msg(shown, self.policy.name, elapsed_ms))
        )
        if applied.discarded and not applied.fenced:
            await self._ask_replan(applied)
        # Bookkeeping after the placements are out: it is off the tool-end -> placement path.
        await self.store.record_solve(
            elapsed_ms, r.method, r.exact, fallback=tao_family and not r.exact
        )
        if self.thunder is not None and not applied.discarded:
            self.thunder.applied(applied.sessions)
        _trace_plan(core.tick, self.policy.name, decision, applied, t_started, elapsed_ms)
        if decision.record is not None and decision.record.entries:
            self.log.info("plan_round", **round_fields(decision.record, applied))
        self.log.info(
            "plan_tick",
            tick=core.tick,
            policy=self.policy.name,
            candidates=len(core.candidates),
            planned=len(decision.admits),
            interrupts=len(decision.interrupts),
            released_by=dict(decision.released_by) or None,
            admitted=len(applied.admitted),
            discarded=applied.discarded,
            fenced=applied.fenced or None,
            epoch=epoch or None,
            changed=list(applied.changed) or None,
            truncated=applied.truncated,
            forced=len(forced.admitted) if forced is not None else None,
            placements=placed,
            method=r.method,
            exact=r.exact,
            states=r.states,
            reason=r.reason,
            solve_ms=round(elapsed_ms, 3),
            superseded=self.superseded,
            **r.diagnostics.log_fields(),
        )
        return applied

    async def _force_resume(self, tick: int, ta: TAStep) -> Applied | None:
        """ThunderAgent's forced resume: admit each overdue session regardless of capacity.

        The Lua apply admits only what live capacity allows, so forced admissions go through
        the store's atomic batch update instead (reserved totals and index sets stay
        consistent), each guarded by the session's version and pool membership, on a node
        that is healthy now; they over-commit the node by design, as ThunderAgent's do. One
        admit placement each; a refused one keeps its clock and is retried next snapshot."""
        if not ta.forced:
            return None
        with anyio.CancelScope(shield=True):
            applied = await admit_unchecked(self.store, ta.forced, self.clock())
            await self._publish_placements(tick, applied)
        done, recs = applied.admitted, applied.sessions
        if done:
            await self.store.incr(forced_resumes=len(done))
        if self.thunder is not None:
            self.thunder.applied(recs)
        self.log.info(
            "forced_resume",
            tick=tick,
            sessions=[m.session for m in done] or None,
            refused=[m.session for m in ta.forced if m not in done] or None,
        )
        return applied

    async def _publish(self, p: Placement, now: float) -> None:
        """Publish ``p``, signed when a signing key is configured."""
        await self.bus.publish_msg(p if self.signer is None else self.signer.sign(p, now))

    async def resync(self) -> int:
        """Re-publish the admission of every admitted session (kind ``admit``, its current
        version), so placements a crashed planner applied but never published still reach
        their gateways; a gateway ignores a placement it has already applied. Start-up only:
        it reads every session."""
        now = self.clock()
        out = [
            Placement(
                kind="admit",
                session_id=s.id,
                version=s.version,
                tick=0,
                gateway_id=s.gateway_id,
                node_id=s.node,
                issued_at=now,
            )
            for s in await self.store.sessions(None)
            if s.node is not None and not s.ended and s.gateway_id is not None
        ]
        await self._publish_all(out, now)
        self.log.info("placements_resynced", placements=len(out))
        return len(out)

    async def _publish_all(self, out: list[Placement], now: float) -> None:
        """Publish ``out`` with up to :data:`PUBLISH_WINDOW` awaiting their JetStream acks at
        once. They go out in this order on the one connection (the window's slots are handed
        out first come, first served), and the k-th no longer waits for k - 1 acks: a burst's
        last placement waited ~5 ms for 16, a takeover's re-publishing ~3 s for 9,500."""
        if len(out) == 1:
            await self._publish(out[0], now)
            return
        window = anyio.CapacityLimiter(PUBLISH_WINDOW)

        async def one(p: Placement) -> None:
            async with window:
                await self._publish(p, now)

        async with anyio.create_task_group() as tg:
            for p in out:
                tg.start_soon(one, p)

    async def _ask_replan(self, applied: Applied) -> None:
        """A discarded plan asks the valuation for a fresh snapshot at once. Its snapshot was
        older than the records: the usual cause is that the plan before it admitted some of
        the same sessions (a burst of requests valued in two ticks), and then no further
        change need come to wake the valuation before its next period (1 s: measured in
        benchmarks/control_loop.py's bursts before this). The simulator's planner does the
        same (shared/sim/cluster.py, ``apply``: a discarded plan starts the next round at once).
        A deposed leader's fenced plan asks nothing."""
        wake = wake_for(WAKE_REPLAN, self.clock(), applied.changed)
        await self.bus.publish(subjects.wake(), encode(wake))

    async def _publish_placements(self, tick: int, applied: Applied) -> int:
        if applied.discarded:
            return 0
        now = self.clock()
        kinds: list[tuple[PlacementKind, Move]] = [("interrupt", m) for m in applied.interrupted]
        kinds += [("admit", m) for m in applied.admitted]
        out: list[Placement] = []
        for kind, m in kinds:
            rec = applied.sessions.get(m.session)
            if rec is None or rec.gateway_id is None:
                continue
            out.append(
                Placement(
                    kind=kind,
                    session_id=m.session,
                    version=rec.version,
                    tick=tick,
                    gateway_id=rec.gateway_id,
                    node_id=m.node,
                    issued_at=now,
                )
            )
        await self._publish_all(out, now)
        return len(out)


def _trace_plan(
    tick: int, policy: str, decision: Decision, applied: Applied, started: float, solve_ms: float
) -> None:
    """One ``tao.plan`` span (shared.infra.tracing): the decision's solve, with the sessions it
    admitted and interrupted (the correlation keys with the gateway's turns) and one event per
    admit and release of its round record, with the rule and the price."""
    r = decision.result
    span = _tracer.start_span(
        "tao.plan",
        start_time=int(started * 1e9),
        attributes={
            "tao.tick": tick,
            "tao.policy": policy,
            "tao.method": r.method,
            "tao.exact": r.exact,
            "tao.discarded": applied.discarded,
            "tao.admitted": [m.session for m in applied.admitted],
            "tao.interrupted": [m.session for m in applied.interrupted],
            "tao.rules": "" if decision.record is None else decision.record.rules,
        },
    )
    if decision.record is not None:  # each admit and release, with its rule and price
        for e in decision.record.entries:
            if e.kind in ("admit", "release"):
                span.add_event(
                    f"tao.{e.kind}",
                    attributes={
                        "tao.session": e.session,
                        "tao.node": e.node,
                        "tao.rule": e.rule,
                        "tao.gain_s": e.gain_s,
                        "tao.cost_s": e.cost_s,
                        "tao.for": e.for_session,
                    },
                )
    span.end(end_time=int((started + solve_ms / 1000.0) * 1e9))
