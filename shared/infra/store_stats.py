"""The plain dicts ``tao status`` shows, built from store records (shared by both stores).

``status_dict`` shape (``tao status --json``)::

    {"domain": str,
     "nodes": [{"id", "url", "healthy", "capacity_tokens", "target_utilisation", "usable",
                "reserved", "free", "models" (sorted list | None), "used_tokens", "usage",
                "running", "waiting", "updated_at", "failures", "prefix_cache_queries",
                "prefix_cache_hits", "prefix_hit_rate", "prefill_s_per_token",
                "attn_s_per_pair", "cost_source", "cost_tokens"}],                 # by id
     "sessions": [{"id", "version", "activity", "ended", "pooled", "node", "weight", "tokens",
                   "model", "turns", "updated_at", "probe_mark",
                   "tool": None | {"call_id", "tool", "source", "started_at", "deadline",
                                   "expected_end", "progress", "background", "completed_at"}}],
     "planner": planner_stats}

``planner_stats`` shape: every counter stored (``ticks``, ``plans_applied``,
``plans_discarded``, ``plans_truncated``, ``fallbacks``, ``solves``, ``solves_exact``,
``sessions_admitted``, ``sessions_interrupted`` always present, default 0, plus any other
counter given to ``incr``), ``methods`` (``{method: solves}``) and ``solve_ms``
(``{"n", "p50", "p90", "p99"}``, percentiles ``None`` without samples). Percentiles use the
nearest-rank rule: the ``ceil(p/100 × n)``-th smallest sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from shared.core.session import Session
from shared.infra.store_types import NodeRecord

__all__ = [
    "BASE_COUNTERS",
    "node_status_dict",
    "percentile",
    "planner_stats_from",
    "prefix_hit_rate",
    "status_dict",
]

BASE_COUNTERS: Final = (
    "ticks",
    "plans_applied",
    "plans_discarded",
    "plans_truncated",
    "fallbacks",
    "solves",
    "solves_exact",
    "sessions_admitted",
    "sessions_interrupted",
)


def percentile(sorted_xs: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted samples; None when there are none."""
    if not sorted_xs:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_xs)))
    return sorted_xs[min(rank, len(sorted_xs)) - 1]


def planner_stats_from(counters: Mapping[str, int], samples: Iterable[float]) -> dict[str, object]:
    """The ``planner`` section of ``tao status`` (module docstring)."""
    out: dict[str, object] = dict.fromkeys(BASE_COUNTERS, 0)
    methods: dict[str, int] = {}
    for name, n in counters.items():
        if name.startswith("method:"):
            methods[name[7:]] = n
        else:
            out[name] = n
    out["methods"] = dict(sorted(methods.items()))
    xs = sorted(samples)
    out["solve_ms"] = {
        "n": len(xs),
        "p50": percentile(xs, 50),
        "p90": percentile(xs, 90),
        "p99": percentile(xs, 99),
    }
    return out


def node_status_dict(rec: NodeRecord) -> dict[str, object]:
    """One node as ``tao status`` shows it."""
    return {
        "id": rec.id,
        "url": rec.url,
        "healthy": rec.healthy,
        "capacity_tokens": rec.capacity_tokens,
        "target_utilisation": rec.target_utilisation,
        "usable": rec.usable,
        "reserved": rec.reserved,
        "free": rec.free,
        "models": None if rec.models is None else sorted(rec.models),
        "used_tokens": rec.used_tokens,
        "usage": rec.usage,
        "running": rec.running,
        "waiting": rec.waiting,
        "updated_at": rec.updated_at,
        "failures": rec.failures,
        "prefix_cache_queries": rec.prefix_cache_queries,
        "prefix_cache_hits": rec.prefix_cache_hits,
        "prefix_hit_rate": prefix_hit_rate(rec.prefix_cache_queries, rec.prefix_cache_hits),
        "prefill_s_per_token": rec.prefill_s,
        "attn_s_per_pair": rec.attn_s,
        "cost_source": rec.cost_source or None,
        "cost_tokens": rec.cost_tokens,
    }


def prefix_hit_rate(queries: int | None, hits: int | None) -> float | None:
    """Hits / queries of vLLM's prefix-cache counters (tokens, since the engine started);
    ``None`` when the node reports no counters or no query yet."""
    if not queries or hits is None:
        return None
    return min(1.0, max(0.0, hits / queries))


def session_status_dict(s: Session) -> dict[str, object]:
    """One session as ``tao status`` shows it (with its readiness inputs)."""
    tool: dict[str, object] | None = None
    if s.tool is not None:
        t = s.tool
        tool = {
            "call_id": t.call_id,
            "tool": t.tool,
            "source": t.source,
            "started_at": t.started_at,
            "deadline": t.deadline,
            "expected_end": t.expected_end,
            "progress": t.progress,
            "background": t.background,
            "completed_at": t.completed_at,
        }
    return {
        "id": s.id,
        "version": s.version,
        "activity": s.activity,
        "ended": s.ended,
        "pooled": s.pooled,
        "node": s.node,
        "weight": s.weight,
        "tokens": s.tokens,
        "model": s.model,
        "turns": s.turns,
        "updated_at": s.updated_at,
        "probe_mark": s.probe_mark,
        "tool": tool,
    }


def status_dict(
    domain: str,
    nodes: Iterable[NodeRecord],
    sessions: Iterable[Session],
    planner: Mapping[str, object],
) -> dict[str, object]:
    """The whole ``tao status --json`` document (module docstring)."""
    return {
        "domain": domain,
        "nodes": [node_status_dict(n) for n in sorted(nodes, key=lambda n: n.id)],
        "sessions": [session_status_dict(s) for s in sorted(sessions, key=lambda s: s.id)],
        "planner": dict(planner),
    }
