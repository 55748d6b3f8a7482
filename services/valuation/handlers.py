"""Valuation ticks: store → :func:`shared.core.tick.value_snapshot` → probe marks → snapshot.

A tick reads only the pool and the admitted-in-tool sessions (the store's index sets), so its
cost is O(pool + interrupt candidates), not O(all sessions). The snapshot is published on
``tao.v1.valuation.snapshot`` when the pool has candidates, plus once when it becomes empty
(so the planner sees the change), and whenever a node is over-committed by reservations that
grew after admission (the planner releases tool-running sessions there); an empty, unchanged
pool publishes nothing but the tick
counter still advances.

With ``TAO_POLICY=thunderagent`` (``thunderagent=True``) every tick publishes, empty pool or
not (ThunderAgent's pause check runs every 5 s whatever the pool), and the snapshot lists the
admitted sessions outside a tool (``admitted``: a model call in flight, or idle), which its pause
rule counts. The store has no index of them, so that costs one read of the ``sessions`` id set
and one pipelined record read per stored session outside the two index sets (ended ones not
yet deleted included): O(stored sessions) per tick, under this policy only.

The idle sweep ends admitted sessions idle longer than ``TAO_IDLE_TIMEOUT_S``: ``on_end``
through the store's consistent update (which releases the reservation), then ``SessionEnd``
(``reason="idle_timeout"``) on the session stream, for the gateway and the tools service.
The sweep reads every session, so it runs on its own, slower period.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from structlog.typing import FilteringBoundLogger

from services.planner.mapping import to_wire
from services.planner.thunder import Held, held_sessions
from shared.contracts import subjects
from shared.contracts.codec import encode
from shared.contracts.session import END_IDLE_TIMEOUT, SessionEnd
from shared.core.session import Session, on_end
from shared.core.tick import TickSnapshot, value_snapshot
from shared.core.valuation import ValuationParams
from shared.infra.busapi import MessageBus
from shared.infra.settings import Settings
from shared.infra.store_types import SessionFn, StateStore

__all__ = ["Valuator", "params_from"]


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


def _idle_too_long(s: Session | None, now: float, timeout_s: float) -> bool:
    return (
        s is not None
        and not s.ended
        and s.node is not None
        and s.activity == "idle"
        and now - s.updated_at > timeout_s
    )


def _idle_end(now: float, timeout_s: float) -> SessionFn:
    def step(s: Session | None) -> Session | None:
        return on_end(s, now) if s is not None and _idle_too_long(s, now, timeout_s) else None

    return step


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

    async def run_tick(self, reason: str = "period") -> TickSnapshot:
        """Value the pool now; persist changed probe marks; publish the snapshot if useful."""
        self.tick += 1
        now = self.clock()
        ids = sorted((await self.store.pool_ids()) | (await self.store.admitted_tool_ids()))
        sessions = await self.store.sessions(ids) if ids else []
        views = await self.store.node_views()
        residency = await self.store.residency(ids) if ids else {}
        history = await self.store.history()
        snap = value_snapshot(
            sessions, views, residency, history, now, tick=self.tick, params=self.params
        )
        stored = {s.id: s.probe_mark for s in sessions}
        marks = {sid: m for sid, m in snap.probe_marks.items() if stored.get(sid) != m}
        written = await self.store.put_probe_marks(marks, snap.versions) if marks else 0
        held: list[Held] | None = None
        if self.thunderagent:
            rest = (await self.store.session_ids()) - set(ids)
            held = held_sessions(await self.store.sessions(sorted(rest))) if rest else []
        publish = (
            bool(snap.candidates) or bool(snap.overflow) or self.last_nonempty or self.thunderagent
        )
        if publish:
            msg = to_wire(snap, views, held)
            await self.bus.publish(subjects.valuation_snapshot(), encode(msg))
            self.published += 1
        self.last_nonempty = bool(snap.candidates) or bool(snap.overflow)
        self.log.info(
            "valuation_tick",
            tick=self.tick,
            reason=reason,
            candidates=len(snap.candidates),
            interrupts=len(snap.interrupts),
            admitted_other=len(held) if held is not None else None,
            ready=sum(c.ready for c in snap.candidates),
            nodes=len(views),
            free=sum(nd.free for nd in snap.nodes),
            marks_written=written,
            published=publish,
        )
        return snap

    async def sweep_idle(self) -> list[str]:
        """End admitted sessions idle longer than the timeout; return their ids."""
        now = self.clock()
        ended: list[str] = []
        for s in await self.store.sessions(None):
            if not _idle_too_long(s, now, self.idle_timeout_s):
                continue
            rec = await self.store.update_session(s.id, _idle_end(now, self.idle_timeout_s))
            if rec is None or not rec.ended:
                continue  # it moved meanwhile (a new request): not idle after all
            ended.append(s.id)
            await self.bus.publish_msg(
                SessionEnd(
                    session_id=s.id,
                    ended_at=now,
                    reason=END_IDLE_TIMEOUT,
                    gateway_id=rec.gateway_id,
                )
            )
        self.log.info("idle_sweep", ended=len(ended), sessions=ended or None)
        return ended
