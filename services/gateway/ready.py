"""``GET /readyz``: whether a request sent now is served without waiting for the stack to warm.

``/healthz`` is liveness (the process answers). ``/readyz`` is 200 only when, in the gateway's
domain (each domain, for a gateway of several):

* the planner that plans the domain is ready: its readiness record is current
  (:class:`~shared.infra.store_types.PlannerReady`, written every beat by the only planner, or
  by the leader once it fenced the domain at its lease epoch, and only after its kernels were
  loaded, ``planner_warm``), so an admission never waits for numba compilation;
* at least one node is healthy, with KV capacity, as telemetry last reported it.

Otherwise 503 with ``{"status": "not_ready", "reason": ...}`` naming what is missing. Without a
state store (tests that run the gateway alone) there is nothing to check: 200 with
``"store": null``. Like ``/healthz`` and ``/metrics`` it needs no key (probes).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.infra.store_types import NodeRecord, PlannerReady, StateStore

__all__ = ["check", "readiness"]


def check(
    planner: PlannerReady | None, nodes: Sequence[NodeRecord], now: float
) -> tuple[str | None, dict[str, object]]:
    """Why the domain is not ready (``None``: it is) and the details ``/readyz`` shows."""
    healthy = sorted(n.id for n in nodes if n.healthy and n.capacity_tokens > 0)
    detail: dict[str, object] = {"nodes_healthy": healthy}
    if planner is not None:
        detail["planner"] = {
            "instance": planner.instance,
            "epoch": planner.epoch,
            "warm_ms": planner.warm_ms,
            "ready_for_s": round(max(0.0, now - planner.since), 3),
            "beat_age_s": round(max(0.0, now - planner.beat_at), 3),
            "rounds": planner.rounds,
        }
    if planner is None:
        return (
            "no planner is ready: none has loaded its kernels and begun to plan this domain "
            "(is the planner running? it logs planner_warm, then planner_ready)",
            detail,
        )
    if not planner.fresh(now):
        age = now - planner.beat_at
        return f"the planner's last beat is {age:.1f} s old (limit {planner.ttl_s:g} s)", detail
    if not healthy:
        return "no healthy node with KV capacity has been reported (telemetry)", detail
    return None, detail


async def readiness(store: StateStore | None, now: float) -> tuple[str | None, dict[str, object]]:
    """:func:`check` on what ``store`` holds now; no store: ready, nothing checked."""
    if store is None:
        return None, {"store": None}
    try:
        planner = await store.planner_ready()
        nodes = await store.nodes()
    except Exception as exc:  # Redis unreachable: not ready, and say why
        return f"the state store cannot be read: {exc}", {}
    return check(planner, nodes, now)
