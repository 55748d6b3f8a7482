"""The valuation service: one valuation tick per ``TAO_TICK_S``, and early on wake-ups.

A core-NATS subscription to ``tao.v1.wake`` (published by the tools service after a tool end
or an arrival was written) triggers an early tick after ``TAO_DEBOUNCE_S``, so a burst of
wake-ups costs one tick; it reads only the sessions the wake-ups name, and those of the plans
heard on ``tao.v1.plan`` (a second core-NATS subscription), reusing the rest of the pool for up
to a second (``Valuator.pool_every_s``). A ``shared`` wake-up (sessions whose shared prefix
changed) wakes nothing: its sessions are read at the next tick (``Valuator.note_shared``). The
idle sweep runs in its own task every ``sweep_period`` seconds (:func:`sweep_loop`), so a long
sweep never holds a tick back. Run: ``python -m services.valuation`` (needs NATS and Redis).

With ``TAO_LEASE_TTL_S`` > 0 replicas elect one leader per domain (:mod:`shared.infra.lease`);
the others stay subscribed and tick only once they lead.
"""

from __future__ import annotations

import time
from typing import Final

import anyio

from services._common import leadership, store_from
from services.planner.thunder import is_thunderagent
from services.valuation.handlers import Valuator, params_from
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.plan import Plan
from shared.contracts.wake import WAKE_SHARED, Wake
from shared.core.policies import get_policy
from shared.core.tick import policy_rules
from shared.infra.busapi import Delivery, MessageBus
from shared.infra.lease import Leadership
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["NAME", "Ticker", "main", "run", "sweep_loop", "sweep_period", "tick_loop"]

NAME = "valuation"


def sweep_period(settings: Settings) -> float:
    """Seconds between idle sweeps: a quarter of the idle timeout, within [tick, 30 s]."""
    return max(settings.tick_s, min(30.0, settings.idle_timeout_s / 4))


TIMER_RESOLUTION_S: Final = 0.001
"""The event loop's timer resolution: asyncio's epoll selector waits whole milliseconds
(rounded up), so ``anyio.sleep(0.0005)`` lasted 1-2 ms. In the control-loop benchmark the
0.5 ms default debounce cost 2 ms of the tool end -> placement p50 (10.5 against 8.4 ms with
``TAO_DEBOUNCE_S=0``, docs/benchmarks.md)."""


class Ticker:
    """Wakes the tick loop early on a wake-up message (debounced: ``debounce_s`` after the
    first wake-up, during which further ones are taken together; below
    :data:`TIMER_RESOLUTION_S`, one pass of the event loop), and gathers the sessions the
    wake-ups name (:attr:`named`: ``None`` once one of them names none)."""

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.wakes = 0
        self.named: set[str] | None = set()

    async def on_wake(self, msg: Wake, d: Delivery) -> None:
        self.wakes += 1
        names = msg.names()
        if names is None:
            self.named = None
        elif self.named is not None:
            self.named |= names
        self.event.set()

    async def wait(self, timeout_s: float, debounce_s: float) -> str:
        """Return ``"wake"`` after a wake-up (and the debounce), else ``"period"``."""
        reason = "period"
        with anyio.move_on_after(timeout_s):
            await self.event.wait()
            reason = "wake"
        if reason == "wake" and debounce_s > 0:
            # below the loop's timer resolution a sleep lasts 1-2 ms whatever it is asked for:
            # one pass of the loop instead takes the wake-ups that have arrived meanwhile
            await anyio.sleep(debounce_s if debounce_s >= TIMER_RESOLUTION_S else 0)
        self.event = anyio.Event()
        return reason

    def take(self) -> set[str] | None:
        """The sessions named since the last call (``None``: one wake-up named none)."""
        named, self.named = self.named, set()
        return named


def host_links(settings: Settings) -> dict[str, float]:
    """Each configured node's host-tier load seconds per token (nodes with a host tier only)."""
    return {n.id: n.host_load_s_per_token for n in settings.nodes if n.host_load_s_per_token > 0}


def _standby(leader: Leadership | None) -> bool:
    return leader is not None and not leader.leading


async def sweep_loop(valuator: Valuator, every_s: float, leader: Leadership | None = None) -> None:
    """Run the idle sweep every ``every_s`` seconds (first after one period), forever (only
    while ``leader`` leads, when given)."""
    while True:
        await anyio.sleep(every_s)
        if _standby(leader):
            continue
        try:
            await valuator.sweep_idle()
        except Exception:  # Redis or NATS hiccup: log it, sweep again next period
            valuator.log.exception("idle_sweep_failed", tick=valuator.tick)


async def tick_loop(
    valuator: Valuator, ticker: Ticker, settings: Settings, leader: Leadership | None = None
) -> None:
    """Tick every ``tick_s``, early after a (debounced) wake-up, forever (a standby, while
    ``leader`` does not lead, only waits)."""
    reason = "start"
    while True:
        started = anyio.current_time()
        named = ticker.take()  # what the wake-ups named up to now; later ones wake the next
        try:
            if not _standby(leader):
                await valuator.run_tick(reason, named)
        except Exception:  # Redis or NATS hiccup: log it, tick again next period
            valuator.log.exception("valuation_tick_failed", tick=valuator.tick)
        remaining = max(0.0, settings.tick_s - (anyio.current_time() - started))
        reason = await ticker.wait(remaining, settings.debounce_s)


async def run(
    settings: Settings, store: StateStore, bus: MessageBus, *, name: str = NAME
) -> Valuator:
    """Tick and sweep forever (until cancelled); returns only by cancellation."""
    valuator = Valuator(
        store=store,
        bus=bus,
        log=get_logger(name),
        params=params_from(settings),
        idle_timeout_s=settings.idle_timeout_s,
        clock=time.time,
        thunderagent=is_thunderagent(settings.policy),
        rules=policy_rules(get_policy(settings.policy)),
        host_load=host_links(settings),
    )
    counted = await store.rebuild_contexts()  # the context totals, right from here on
    valuator.log.info("contexts_rebuilt", sessions=counted)
    ticker = Ticker()

    async def on_wake(msg: Wake, d: Delivery) -> None:
        if msg.reason == WAKE_SHARED:  # read at the next tick, not worth one of its own
            valuator.note_shared(msg.names())
            return
        await ticker.on_wake(msg, d)

    await bus.subscribe(subjects.wake(), name, lambda b: decode(b, Wake), on_wake)
    await bus.subscribe(subjects.plan(), name, lambda b: decode(b, Plan), valuator.on_plan)
    leader = await leadership(settings, bus, NAME)
    async with anyio.create_task_group() as tg:
        if leader is not None:
            tg.start_soon(leader.run, _on_leadership)
        tg.start_soon(sweep_loop, valuator, sweep_period(settings), leader)
        tg.start_soon(tick_loop, valuator, ticker, settings, leader)
    return valuator  # pragma: no cover - the loops end only by cancellation


async def _on_leadership(epoch: int) -> None:
    """Nothing to hand over: a new leader's next tick reads everything from the store."""


async def main(settings: Settings, ctx: ServiceContext) -> None:
    """Service entry point for the runner."""
    await run(settings, store_from(settings, ctx), ctx.require_bus(), name=ctx.name)
