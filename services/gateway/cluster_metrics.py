"""The scheduling domain's state as Prometheus series, read from the store at scrape time.

The planner, valuation and tools services keep their counters and node records in Redis (what
``tao status`` reads), not in their own processes, so the gateway — the one HTTP service and the
one scrape target compose publishes — exports them beside its own series on ``GET /metrics``:

    tao_node_capacity_tokens{node}      KV capacity (telemetry's last scrape)
    tao_node_reserved_tokens{node}      Σ weights of the sessions admitted there
    tao_node_free_tokens{node}          usable − reserved (0 when unhealthy)
    tao_node_running_requests{node}     requests the engine runs
    tao_node_waiting_requests{node}     requests the engine queues
    tao_node_healthy{node}              1 / 0
    tao_node_prefix_cache_queries_total{node}, tao_node_prefix_cache_hits_total{node}
    tao_planner_<counter>_total         ticks, plans applied / discarded / truncated,
                                        fallbacks, solves, exact solves, sessions admitted /
                                        interrupted (shared.infra.store_stats.BASE_COUNTERS)
    tao_planner_solve_ms{quantile}      over the last 1,024 solves (absent without samples)
    tao_pool_sessions                   sessions waiting for admission
    tao_admitted_tool_sessions          admitted sessions in a tool

A scrape reads the node hashes, the planner hash and two index-set sizes: a few round trips,
whatever the number of sessions. A store that cannot be read gives
``tao_cluster_scrape_ok 0`` and no cluster series, so the gateway's own series still come.
"""

from __future__ import annotations

from services.gateway.metrics import escape_label
from shared.infra.store_stats import BASE_COUNTERS
from shared.infra.store_types import StateStore

__all__ = ["NODE_SERIES", "PLANNER_SERIES", "cluster_lines"]

NODE_SERIES: tuple[tuple[str, str, str], ...] = (
    ("tao_node_capacity_tokens", "gauge", "KV-cache capacity of the node, tokens."),
    ("tao_node_reserved_tokens", "gauge", "Tokens reserved by sessions admitted on the node."),
    ("tao_node_free_tokens", "gauge", "Admissible tokens left: usable - reserved."),
    ("tao_node_running_requests", "gauge", "Requests the node's engine runs."),
    ("tao_node_waiting_requests", "gauge", "Requests the node's engine queues."),
    ("tao_node_healthy", "gauge", "1 if telemetry reaches the node, else 0."),
    ("tao_node_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the cache."),
    ("tao_node_prefix_cache_hits_total", "counter", "Prompt tokens the prefix cache served."),
)
PLANNER_SERIES: tuple[str, ...] = tuple(f"tao_planner_{c}_total" for c in BASE_COUNTERS)


async def cluster_lines(store: StateStore | None) -> list[str]:
    """The series of the module docstring, as exposition-format lines."""
    if store is None:
        return []
    try:
        nodes = await store.nodes()
        planner = await store.planner_stats()
        pooled = len(await store.pool_ids())
        in_tool = len(await store.admitted_tool_ids())
    except Exception:  # a scrape never fails on the store: the gateway's own series still count
        return ["# TYPE tao_cluster_scrape_ok gauge", "tao_cluster_scrape_ok 0"]
    out = ["# TYPE tao_cluster_scrape_ok gauge", "tao_cluster_scrape_ok 1"]
    for name, kind, help_text in NODE_SERIES:
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for n in sorted(nodes, key=lambda r: r.id):
            value: int | None = {
                "tao_node_capacity_tokens": n.capacity_tokens,
                "tao_node_reserved_tokens": n.reserved,
                "tao_node_free_tokens": n.free,
                "tao_node_running_requests": n.running,
                "tao_node_waiting_requests": n.waiting,
                "tao_node_healthy": int(n.healthy),
                "tao_node_prefix_cache_queries_total": n.prefix_cache_queries,
                "tao_node_prefix_cache_hits_total": n.prefix_cache_hits,
            }[name]
            if value is not None:
                out.append(f'{name}{{node="{escape_label(n.id)}"}} {int(value)}')
    for counter, name in zip(BASE_COUNTERS, PLANNER_SERIES, strict=True):
        count = planner.get(counter, 0)
        out += [f"# TYPE {name} counter", f"{name} {int(count) if isinstance(count, int) else 0}"]
    solve = planner.get("solve_ms")
    out += [
        "# HELP tao_planner_solve_ms Planner solve time, ms.",
        "# TYPE tao_planner_solve_ms gauge",
    ]
    if isinstance(solve, dict):
        for q, key in (("0.5", "p50"), ("0.9", "p90"), ("0.99", "p99")):
            v = solve.get(key)
            if isinstance(v, int | float):
                out.append(f'tao_planner_solve_ms{{quantile="{q}"}} {float(v)!r}')
    out += ["# TYPE tao_pool_sessions gauge", f"tao_pool_sessions {pooled}"]
    out += ["# TYPE tao_admitted_tool_sessions gauge", f"tao_admitted_tool_sessions {in_tool}"]
    return out
