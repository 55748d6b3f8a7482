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
     "residency": {NODE: {"k0", "t_obs", "age_s", "credit", "host"}}}

``state`` is the session's activity (``idle``, ``waiting``, ``running``, ``tool``).
``residency``: per node, the resident prefix in GPU memory (``k0`` tokens observed at ``t_obs``,
its decayed ``credit``) and ``host``, the tokens of the context from its start in the node's
host KV tier (vLLM's OffloadingConnector; 0 without one). A node holding the session in its
host tier only has ``k0`` 0 and ``t_obs``/``age_s`` ``null``.
``tao inspect tools --json``: ``{"tools": {NAME: STATS}, "global": STATS}`` with
``STATS = {"count", "mean_s", "stdev_s", "min_s", "max_s", "censored", "censored_max_s",
"predicted_s", "evidence"}`` (``predicted_s``: the duration a new call would be predicted to
take, and from which evidence).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import anyio
import orjson

from shared.core.decay import decayed_credit
from shared.core.predictor import ToolStats, estimate_duration, predict_end
from shared.core.readiness import ReadinessState, readiness
from shared.infra.settings import Settings
from shared.infra.store_types import StateStore

__all__ = ["SessionNotFound", "add_state_parsers", "session_view", "tools_view"]


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
    host = (await store.host_residency([session_id])).get(session_id, {})
    residency: dict[str, dict[str, Any]] = {
        node: {
            "k0": k0,
            "t_obs": t_obs,
            "age_s": max(0.0, now - t_obs),
            "credit": decayed_credit(
                k0, t_obs, now, half_life_s=settings.half_life_s, unit=settings.credit_unit
            ),
            "host": host.get(node, 0),
        }
        for node, (k0, t_obs) in observed.items()
    }
    for node, tokens in host.items():  # only in the node's host KV tier
        residency.setdefault(
            node, {"k0": 0, "t_obs": None, "age_s": None, "credit": 0, "host": tokens}
        )
    residency = dict(sorted(residency.items()))
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


# -- the commands ------------------------------------------------------------------------------


def add_state_parsers(targets: Any) -> None:
    """Register ``session`` and ``tools`` on ``tao inspect``'s target subparsers."""
    session = targets.add_parser(
        "session",
        help="one session: state, node, tokens, version, readiness, tool, residency",
        description="What the scheduler holds about one session, evaluated now.",
    )
    session.add_argument("session", metavar="ID", help="session id")
    tools = targets.add_parser(
        "tools",
        help="per-tool and global tool duration statistics",
        description="Tool duration statistics and the prediction each gives a new call.",
    )
    for p in (session, tools):
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.add_argument("--redis", metavar="URL", help="Redis URL (default: env, then tao up)")
        p.add_argument("--domain", metavar="NAME", help="scheduling domain (default: TAO_DOMAIN)")
    session.set_defaults(run=_cmd_session)
    tools.set_defaults(run=_cmd_tools)


async def _with_store(
    args: argparse.Namespace, read: Callable[[StateStore], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    from redis.exceptions import RedisError

    from shared.cli.ops import OpsError, redis_url
    from shared.infra.redisconn import open_redis
    from shared.infra.store import Store

    url = redis_url(args)
    domain = args.domain or os.environ.get("TAO_DOMAIN") or "default"
    client = open_redis(url, socket_connect_timeout=2.0, socket_timeout=5.0)
    try:
        return await read(Store(client, domain))
    except (RedisError, OSError) as exc:
        raise OpsError(f"cannot read {url}: {exc}") from None
    finally:
        await client.aclose()


def _settings() -> Settings:
    from shared.cli.ops import OpsError
    from shared.infra.errors import SettingsError

    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise OpsError(str(exc)) from None


def _cmd_session(args: argparse.Namespace, out: TextIO) -> int:
    from shared.cli.ops import OpsError

    settings = _settings()
    sid = str(args.session)

    async def read(store: StateStore) -> dict[str, Any]:
        return await session_view(store, sid, time.time(), settings)

    try:
        view = anyio.run(_with_store, args, read)
    except SessionNotFound:
        raise OpsError(f"no session {sid!r} in domain {args.domain or settings.domain!r}") from None
    out.write(orjson.dumps(view).decode() + "\n" if args.json else _session_text(view) + "\n")
    return 0


def _cmd_tools(args: argparse.Namespace, out: TextIO) -> int:
    view = anyio.run(_with_store, args, tools_view)
    out.write(orjson.dumps(view).decode() + "\n" if args.json else _tools_text(view) + "\n")
    return 0


def _f(v: object, fmt: str = ".1f") -> str:
    return "-" if v is None else format(v, fmt)


def _session_text(v: dict[str, Any]) -> str:
    lines = [
        f"session   {v['session']}  v{v['version']}  {v['state']}"
        + ("  (ended)" if v["ended"] else ""),
        f"node      {v['node'] or '-'}  tokens {v['tokens']}  weight {v['weight']}"
        f"  turns {v['turns']}",
        f"readiness r={v['readiness']['r']} ({v['readiness']['rule']})",
    ]
    t = v["tool"]
    if t is not None:
        lines.append(
            f"tool      {t['name']} call {t['call_id']} ({t['source']})"
            f"  started {t['started_at']:.3f}"
            f"  predicted end {t['predicted_end']:.3f} by {t['evidence']}"
            f"  remaining {t['remaining_s']:.1f} s"
        )
    for node, r in v["residency"].items():
        host = f"; {r['host']} in its host KV tier" if r["host"] else ""
        if r["k0"]:
            gpu = f"{r['k0']} tokens {r['age_s']:.1f} s ago, credit {r['credit']}"
        else:
            gpu = "none in GPU memory"
        lines.append(f"resident  {node}: {gpu}{host}")
    return "\n".join(lines)


def _tools_text(v: dict[str, Any]) -> str:
    lines = ["tool                  count   mean s  stdev s   max s  cut  predicted s  evidence"]
    rows = [*v["tools"].items(), ("(all tools)", v["global"])]
    for name, r in rows:
        lines.append(
            f"{name[:20]:<20} {r['count']:>6} {_f(r['mean_s']):>8} {_f(r['stdev_s']):>8}"
            f" {_f(r['max_s']):>7} {r['censored']:>4} {r['predicted_s']:>12.1f}  {r['evidence']}"
        )
    return "\n".join(lines)
