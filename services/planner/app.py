"""The planner service: the newest valuation snapshot → plan → verify-and-apply → placements.

Subscribes (core NATS) to ``tao.v1.valuation.snapshot``; solves with the policy of
``TAO_POLICY`` (one policy object for the life of the process), budget ``TAO_PLANNER_BUDGET``
and wall-clock limit ``TAO_PLANNER_TIME_LIMIT_MS`` (under ``thunderagent`` /
``thunderagent-ideal``: ThunderAgent's state machine instead, its periodic check every
``TAO_TA_INTERVAL_S``); publishes placements on ``tao.v1.placement.<gateway>`` (JetStream)
and the plan on ``tao.v1.plan``. The numba kernels
are loaded (or compiled) once at start. Run: ``python -m services.planner`` (needs NATS and
Redis).

With ``TAO_LEASE_TTL_S`` > 0 (the default) replicas of the planner elect one leader per domain
(:mod:`shared.infra.lease`): only the leader plans, each of its applies carries its epoch, and
a new leader fences the domain at its epoch and re-publishes the admissions before it plans.

Readiness: once the kernels are loaded (``planner_warm``), the snapshots subscribed and (the
only planner) the admissions re-published or (under a lease) the domain fenced at its epoch,
the replica that plans writes its readiness record (:class:`~shared.infra.store_types.
PlannerReady`) every :data:`READY_BEAT_S`; it lapses :data:`READY_TTL_S` after the last beat.
The gateway's ``/readyz`` is 200 only while one is current, so a request sent after it never
waits for the planner's warm-up.
"""

from __future__ import annotations

from typing import Final

import anyio
import anyio.to_thread

from services._common import leadership, store_from
from services.planner.handlers import Planner, decode_snapshot
from shared.contracts import subjects
from shared.core.planner import warm_up
from shared.core.policies import get_policy
from shared.infra.busapi import MessageBus
from shared.infra.lease import default_instance
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.signing import load_signer
from shared.infra.store_types import PlannerReady, StateStore

__all__ = ["NAME", "READY_BEAT_S", "READY_TTL_S", "beat", "build", "main", "run"]

NAME = "planner"
READY_BEAT_S: Final = 0.5
"""How often the planning replica re-writes its readiness record."""
READY_TTL_S: Final = 5.0
"""How long a readiness record stays current after its last beat."""


def build(settings: Settings, store: StateStore, bus: MessageBus, *, name: str = NAME) -> Planner:
    """The planner with the configured policy, budget and time limit."""
    return Planner(
        store=store,
        bus=bus,
        log=get_logger(name),
        policy=get_policy(settings.policy),
        budget=settings.planner_budget,
        time_limit_ms=float(settings.planner_time_limit_ms),
        ta_interval_s=settings.ta_interval_s,
        signer=None if settings.placement_key is None else load_signer(settings.placement_key),
    )


async def run(
    settings: Settings, store: StateStore, bus: MessageBus, *, name: str = NAME
) -> Planner:
    """Warm up, subscribe, re-publish current admissions, and plan forever (until
    cancelled)."""
    planner = build(settings, store, bus, name=name)
    t0 = anyio.current_time()
    await anyio.to_thread.run_sync(warm_up, limiter=planner.limiter)
    warm_ms = round((anyio.current_time() - t0) * 1000, 1)
    planner.log.info("planner_warm", ms=warm_ms)
    await bus.subscribe(subjects.valuation_snapshot(), name, decode_snapshot, planner.on_snapshot)
    leader = planner.leader = await leadership(settings, bus, NAME)
    instance = settings.instance or default_instance(settings.service_name or NAME)
    async with anyio.create_task_group() as tg:
        if leader is None:
            await planner.resync()
        else:
            tg.start_soon(leader.run, planner.on_leadership)
        tg.start_soon(beat, planner, instance, warm_ms)
        tg.start_soon(planner.run)
    return planner  # pragma: no cover - the loops end only by cancellation


async def beat(
    planner: Planner, instance: str, warm_ms: float, every_s: float = READY_BEAT_S
) -> None:
    """Write the readiness record every ``every_s`` while this replica plans (module
    docstring), forever; a failed write is logged and tried again at the next beat."""
    since: tuple[int, float] | None = None  # (epoch, when this replica began to plan)
    while True:
        if planner.can_plan:
            epoch = planner.leader.epoch if planner.leader is not None else 0
            now = planner.clock()
            if since is None or since[0] != epoch:
                since = (epoch, now)
                planner.log.info("planner_ready", epoch=epoch or None, warm_ms=warm_ms)
            record = PlannerReady(
                instance, epoch, warm_ms, since[1], now, READY_TTL_S, planner.rounds,
                planner.last_tick,
            )  # fmt: skip
            try:
                await planner.store.put_planner_ready(record)
            except Exception as exc:  # Redis hiccup: the record lapses, readiness with it
                planner.log.warning("planner_ready_write_failed", error=str(exc))
        else:
            since = None
        await anyio.sleep(every_s)


async def main(settings: Settings, ctx: ServiceContext) -> None:
    """Service entry point for the runner."""
    await run(settings, store_from(settings, ctx), ctx.require_bus(), name=ctx.name)
