"""Handlers of the tools service: session and tool events → session records in the store.

Each handler: decode (done by the bus) → the step's core transition inside the store's
optimistic update → tool statistics / wake-up → one log line. Acks, retries and dead letters
are the bus's (``shared.infra``). A wake-up is published only after the write it announces.

Shared prefixes (:mod:`shared.core.sharedprefix`): before a session batch is cut to this shard's
sessions, every response's block keys are registered (every shard, so every shard counts all
sessions) and every end forgets its session. A response of this shard's then records its
session's ``shared`` with the response; the sessions of this shard whose ``shared`` another
session's response raised are written after the batch
(:func:`~shared.core.sharedprefix.with_shared`: an admitted weight moves with it). Both kinds
are named in one ``shared`` wake-up, so that the valuation reads them (it keeps each node's
shared prefix from the admitted sessions it reads).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Protocol, TypeVar

from structlog.typing import FilteringBoundLogger

from services.tools.steps import (
    Outcome,
    cancel_step,
    request_step,
    response_step,
    tool_end_step,
    tool_progress_step,
    tool_start_step,
)
from shared.contracts import subjects
from shared.contracts.codec import encode
from shared.contracts.session import (
    SessionCancel,
    SessionEnd,
    SessionEvent,
    SessionRequest,
    SessionResponse,
)
from shared.contracts.tool import ToolEnd, ToolEvent, ToolProgress, ToolStart
from shared.contracts.wake import (
    WAKE_ARRIVAL,
    WAKE_CANCEL,
    WAKE_END,
    WAKE_SHARED,
    WAKE_TOOL_END,
    wake_for,
)
from shared.core.rules import RuleSet
from shared.core.session import Session, on_end
from shared.core.sharedprefix import SharedPrefixes, with_shared
from shared.infra import tracing
from shared.infra.busapi import Delivery, MessageBus
from shared.infra.shard import ONE, Shard
from shared.infra.store_types import SessionFn, SessionFnWith, StateStore

__all__ = ["ToolsHandlers"]

_tracer = tracing.tracer("services.tools")


class _OfSession(Protocol):
    @property
    def session_id(self) -> str: ...


E = TypeVar("E", bound=_OfSession)


_WAKE_OF: dict[type, str] = {
    SessionRequest: WAKE_ARRIVAL,
    SessionCancel: WAKE_CANCEL,
    SessionEnd: WAKE_END,
}


def _end_step(ev: SessionEnd, out: Outcome) -> SessionFn:
    def step(s: Session | None) -> Session | None:
        out.skipped = None if s is not None and not s.ended else "unknown or ended"
        return None if s is None or s.ended else on_end(s, ev.ended_at)

    return step


@dataclass(slots=True)
class ToolsHandlers:
    """The tools service's handlers; ``store`` and ``bus`` are the boundaries (Protocols).

    ``reserve`` (``TAO_RESERVE_TOKENS``) re-weighs an admitted session on each response:
    weight = total tokens + reserve (``shared.core.session.on_response``)."""

    store: StateStore
    bus: MessageBus
    log: FilteringBoundLogger
    reserve: int | None = None
    rules: RuleSet | None = None
    """The policy's rules (``TAO_POLICY``): the growth rule sets the reserve."""
    shard: Shard = ONE
    """This process's share of the sessions (``TAO_SHARD``): events of other sessions are
    acknowledged and left to their shard (:mod:`shared.infra.shard`)."""
    handled: int = 0
    foreign: int = 0
    """Events left to another shard."""
    prefixes: SharedPrefixes | None = None
    """The shared-prefix registry fed by every response (``None``: sessions' ``shared`` is
    never set, their weights are their whole contexts)."""
    bad_chains: int = 0
    """Responses whose block keys the registry refused."""

    def mine(self, items: list[tuple[E, Delivery]]) -> list[tuple[E, Delivery]]:
        """The events of this shard's sessions, in order (all of them when unsharded)."""
        if self.shard.count == 1:
            return items
        kept = [(ev, d) for ev, d in items if self.shard.owns(ev.session_id)]
        self.foreign += len(items) - len(kept)
        return kept

    async def _wake(self, reason: str, sids: Collection[str]) -> None:
        await self.bus.publish(subjects.wake(), encode(wake_for(reason, time.time(), sids)))

    async def on_session_batch(self, items: list[tuple[SessionEvent, Delivery]]) -> None:
        """SessionRequest / Response / Cancel → each record's transition, batched into one
        store transaction per run of events; a SessionEnd ends the run (``on_end``, then the
        record is deleted) so order holds. One wake-up per reason after the writes. Every
        response's block keys feed the shared-prefix registry first, this shard's or not."""
        shared = self._learn(items)
        items = self.mine(items)
        if not items:
            await self._share()
            return
        outs = [Outcome() for _ in items]
        recs: list[Session | None] = [None] * len(items)
        run: list[tuple[int, str, SessionFn]] = []
        deleted = 0

        async def flush() -> None:
            if not run:
                return
            stored = await self.store.update_sessions([(sid, fn) for _, sid, fn in run])
            for (i, _, _), rec in zip(run, stored, strict=True):
                recs[i] = rec
            run.clear()

        for i, ((ev, _), out) in enumerate(zip(items, outs, strict=True)):
            if isinstance(ev, SessionEnd):
                await flush()
                recs[i] = await self.store.update_session(ev.session_id, _end_step(ev, out))
                deleted += await self.store.delete_session(ev.session_id)
            else:
                run.append((i, ev.session_id, self._session_step(ev, out, shared.get(id(ev)))))
        await flush()
        woken: dict[str, set[str]] = {}
        for (ev, _), out in zip(items, outs, strict=True):
            reason = _WAKE_OF.get(type(ev))
            if reason is not None and out.skipped is None:
                woken.setdefault(reason, set()).add(ev.session_id)
        for reason, sids in woken.items():
            await self._wake(reason, sids)
        changed = {
            ev.session_id
            for (ev, _), out in zip(items, outs, strict=True)
            if out.shared_changed and out.skipped is None
        }
        await self._share(changed)
        self.handled += len(items)
        self._log_sessions(items, outs, recs, deleted)

    def _learn(self, items: list[tuple[SessionEvent, Delivery]]) -> dict[int, int]:
        """Feed the registry every response's chain and every end, in order; the ``shared``
        tokens of each response registered, by ``id`` of its event."""
        reg = self.prefixes
        if reg is None:
            return {}
        out: dict[int, int] = {}
        for ev, _ in items:
            if isinstance(ev, SessionResponse):
                keys, bs = ev.block_keys, ev.block_size
                if keys is None or not bs or ev.error is not None:
                    continue
                try:
                    out[id(ev)] = reg.observe(ev.session_id, keys, bs, ev.model, ev.finished_at)
                except ValueError:
                    self.bad_chains += 1  # the telemetry service logs it (bad_chain)
            elif isinstance(ev, SessionEnd):
                reg.forget(ev.session_id, ev.ended_at)
        return out

    async def _share(self, changed: Collection[str] = ()) -> None:
        """Write the new ``shared`` of this shard's sessions that other sessions' responses
        raised, then name them and ``changed`` (the responses that changed theirs) in one
        ``shared`` wake-up."""
        reg = self.prefixes
        if reg is None:
            return
        touched = sorted(sid for sid in reg.take_touched() if self.shard.owns(sid))
        woken = set(changed)
        if touched:
            reweigh = self.reserve is not None

            def step(sid: str) -> SessionFnWith[bool]:
                def fn(s: Session | None) -> tuple[Session | None, bool]:
                    if s is None or s.ended:
                        return None, False
                    new = with_shared(s, reg.shared(sid), reweigh=reweigh)
                    return (None, False) if new is s else (new, True)

                return fn

            out = await self.store.update_sessions_with([(sid, step(sid)) for sid in touched])
            written = {sid for sid, (_, wrote) in zip(touched, out, strict=True) if wrote}
            woken |= written
            self.log.info(
                "shared_prefix",
                touched=len(touched),
                written=len(written),
                registry=len(reg),
                keys=reg.keys,
            )
        if woken:
            await self._wake(WAKE_SHARED, woken)

    def _session_step(self, ev: SessionEvent, out: Outcome, shared: int | None = None) -> SessionFn:
        match ev:
            case SessionRequest():
                return request_step(ev, out)
            case SessionResponse():
                return response_step(ev, out, self.reserve, self.rules, shared)
            case SessionCancel():
                return cancel_step(ev, out)
            case SessionEnd():
                return _end_step(ev, out)

    def _log_sessions(
        self,
        items: list[tuple[SessionEvent, Delivery]],
        outs: list[Outcome],
        recs: list[Session | None],
        deleted: int,
    ) -> None:
        """The batch's one log line; a batch of one names the session and its new state."""
        one = len(items) == 1
        ev = items[0][0]
        rec, out = recs[0], outs[0]
        ended = out.ended_call if one else None
        self.log.info(
            "session_events",
            n=len(items),
            kinds=dict(Counter(type(e).__name__ for e, _ in items)),
            session=ev.session_id if one else None,
            skipped=sum(o.skipped is not None for o in outs) or None,
            reason=out.skipped if one else None,
            version=rec.version if one and rec is not None else None,
            activity=rec.activity if one and rec is not None else None,
            node=rec.node if one and rec is not None else None,
            inferred_tool_end=None if ended is None else ended.tool,
            deleted=deleted or None,
            redelivered=sum(d.num_delivered > 1 for _, d in items) or None,
        )

    async def on_tool_batch(self, items: list[tuple[ToolEvent, Delivery]]) -> None:
        """ToolStart / ToolEnd / ToolProgress → each record's transition, in stream order;
        ends with a duration feed the history; one wake-up if any call ended. Idempotent (a
        failed batch is replayed message by message by the bus)."""
        items = self.mine(items)
        if not items:
            return
        outs = [Outcome() for _ in items]
        steps = [
            (ev.session_id, _tool_step(ev, out)) for (ev, _), out in zip(items, outs, strict=True)
        ]
        samples: list[tuple[str, float, bool]] = []

        def record() -> list[tuple[str, float, bool]]:
            samples[:] = [
                (out.tool, out.duration, ev.censored)
                for (ev, _), out in zip(items, outs, strict=True)
                if isinstance(ev, ToolEnd) and out.duration is not None and out.tool
            ]
            return samples

        # one transaction for the batch's records and the durations their ends record: a crash
        # in between would leave an end that its redelivery skips as a duplicate, unrecorded
        stored = await self.store.update_sessions(steps, record=record)
        ended = {
            ev.session_id
            for (ev, _), out in zip(items, outs, strict=True)
            if isinstance(ev, ToolEnd) and out.skipped is None
        }
        for (ev, d), out in zip(items, outs, strict=True):
            if isinstance(ev, ToolEnd) and out.duration is not None and not ev.censored:
                _trace_tool(ev, out.duration, d)
        if ended:  # it names the pooled sessions the batch changed too (a start, a progress)
            pooled = {rec.id for rec in stored if rec is not None and rec.pooled}
            await self._wake(WAKE_TOOL_END, ended | pooled)
        self.handled += len(items)
        single = items[0][0] if len(items) == 1 else None
        self.log.info(
            "tool_events",
            n=len(items),
            session=None if single is None else single.session_id,
            kind=None if single is None else type(single).__name__,
            starts=sum(isinstance(ev, ToolStart) for ev, _ in items),
            ends=sum(isinstance(ev, ToolEnd) for ev, _ in items),
            skipped=sum(out.skipped is not None for out in outs) or None,
            recorded=len(samples) or None,
            redelivered=sum(d.num_delivered > 1 for _, d in items) or None,
        )


def _tool_step(ev: ToolEvent, out: Outcome) -> SessionFn:
    match ev:
        case ToolStart():
            return tool_start_step(ev, out)
        case ToolEnd():
            return tool_end_step(ev, out)
        case ToolProgress():
            return tool_progress_step(ev, out)


def _trace_tool(ev: ToolEnd, duration: float, d: Delivery) -> None:
    """One ``tao.tool`` span (shared.infra.tracing) from the call's start to its end, in the
    trace its message's headers carry, if any."""
    end = ev.ended_at
    span = _tracer.start_span(
        "tao.tool",
        context=tracing.extract(d.headers),
        start_time=int((end - duration) * 1e9),
        attributes={
            "tao.session_id": ev.session_id,
            "tao.tool": ev.tool or "",
            "tao.call_id": ev.call_id,
            "tao.source": ev.source,
            "tao.ok": ev.ok,
        },
    )
    span.end(end_time=int(end * 1e9))
