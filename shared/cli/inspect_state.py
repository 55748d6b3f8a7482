"""``tao inspect session`` and ``tao inspect tools``: what the scheduler knows, from Redis.

Both read the store the services write (the ``tao up`` run file, ``TAO_REDIS_URL`` or
``--redis``) and evaluate the same pure core the valuation service runs — the predictor for a
running tool's end, the readiness rule, the credit decay — at the time of the call, so what
they print is what the next tick would see. Nothing is written (a readiness probe the next tick
would spend is shown, not spent).

``tao inspect session ID --json``::

    {"session", "state", "admitted", "ended", "node", "tokens", "weight", "version", "turns",
     "model", "gateway_id", "updated_at",
     "readiness": {"r", "rule"},
     "tool": null | {"name", "call_id", "source", "started_at", "deadline", "predicted_end",
                     "evidence", "evidence_ts", "remaining_s", "background", "completed_at"},
     "residency": {NODE: {"k0", "t_obs", "age_s", "credit"}}}

``state`` is the session's activity (``idle``, ``waiting``, ``running``, ``tool``).
``tao inspect tools --json``: ``{"tools": {NAME: STATS}, "global": STATS}`` with
``STATS = {"count", "mean_s", "stdev_s", "min_s", "max_s", "censored", "censored_max_s",
"predicted_s", "evidence"}`` (``predicted_s``: the duration a new call would be predicted to
take, and from which evidence).
"""

from __future__ import annotations

import math
from typing import Any

from shared.core.decay import decayed_credit
from shared.core.predictor import ToolStats, estimate_duration, predict_end
from shared.core.readiness import ReadinessState, readiness
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["SessionNotFound", "session_view", "tools_view"]


class SessionNotFound(LookupError):
    """No live session with this id in the store's domain."""


def _num(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _stats(stats: ToolStats) -> dict[str, Any]:
    return {
        "count": stats.count,
        "mean_s": stats.mean if stats.count else None,
        "stdev_s": stats.stdev if stats.count >= 2 else None,
        "min_s": _num(stats.min_s) if stats.count else None,
        "max_s": _num(stats.max_s) if stats.count else None,
        "censored": stats.censored,
        "censored_max_s": stats.censored_max_s if stats.censored else None,
    }


async def tools_view(store: StateStore) -> dict[str, Any]:
    """Per-tool and global duration statistics, with the prediction each gives a new call."""
    history = await store.history()
    tools: dict[str, Any] = {}
    for name in sorted(history.tools):
        row = _stats(history.tools[name])
        row["predicted_s"], row["evidence"] = estimate_duration(history, name)
        tools[name] = row
    overall = _stats(history.overall)
    # A tool never seen is predicted from the global statistics (or the default).
    overall["predicted_s"], overall["evidence"] = estimate_duration(history, "\0unseen")
    return {"tools": tools, "global": overall}


async def session_view(
    store: StateStore, session_id: str, now: float, settings: Settings
) -> dict[str, Any]:
    """Everything the scheduler holds about one session, evaluated at ``now``."""
    s = await store.get_session(session_id)
    if s is None:
        raise SessionNotFound(session_id)
    history = await store.history()
    tool: dict[str, Any] | None = None
    prediction = None
    if s.tool is not None and s.activity == "tool":
        call = s.tool
        prediction = predict_end(call.view(), history, now)
        tool = {
            "name": call.tool,
            "call_id": call.call_id,
            "source": call.source,
            "started_at": call.started_at,
            "deadline": call.deadline,
            "predicted_end": prediction.predicted_end,
            "evidence": prediction.evidence,
            "evidence_ts": prediction.evidence_ts,
            "remaining_s": prediction.remaining(now),
            "background": call.background,
            "completed_at": call.completed_at,
        }
    ready = readiness(
        ReadinessState(prediction, s.probe_mark),
        now,
        horizon_s=settings.horizon_s,
        freshness_s=settings.freshness_s,
    )
    observed = (await store.residency([session_id])).get(session_id, {})
    residency = {
        node: {
            "k0": k0,
            "t_obs": t_obs,
            "age_s": max(0.0, now - t_obs),
            "credit": decayed_credit(
                k0, t_obs, now, half_life_s=settings.half_life_s, unit=settings.credit_unit
            ),
        }
        for node, (k0, t_obs) in sorted(observed.items())
    }
    return {
        "session": s.id,
        "state": s.activity,
        "admitted": s.admitted,
        "ended": s.ended,
        "node": s.node,
        "tokens": s.tokens,
        "weight": s.weight,
        "version": s.version,
        "turns": s.turns,
        "model": s.model,
        "gateway_id": s.gateway_id,
        "updated_at": s.updated_at,
        "readiness": {"r": ready.r, "rule": ready.rule},
        "tool": tool,
        "residency": residency,
    }
