"""Telemetry's node handler: scrape a node → NodeRecord in the store → NodeStatus → one line.

The scrape loop (``app.py``) calls :meth:`NodeScrapers.scrape_all` once per ``TAO_SCRAPE_S``;
every node is scraped concurrently, each with its own failure counter (:class:`NodeHealth`).
A failed scrape rewrites only health, failure count and time (capacity and models stay as last
seen, for ``tao status``); the planner reads ``healthy`` and treats an unhealthy node as
ineligible with no free capacity.

**Engine restarts.** A good scrape whose engine start time (``process_start_time_seconds``)
differs from the previous good scrape's, or whose prefix-cache counters went backwards, means
the engine behind the node was restarted in between, with an empty cache. ``on_restart`` (the
residency source's hook) is then called with the time of the previous good scrape before the
node is written healthy again, so the planner never sees the old engine's prefixes on the new
one. (An engine restarted without publishing a KV event since gives the KV-event index no
``seq`` reset to notice.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio
from structlog.typing import FilteringBoundLogger

from services.telemetry.scrape import Fetch, NodeHealth, ScrapeError, scrape_node
from services.telemetry.vllm_metrics import VllmMetrics
from shared.contracts.node import NodeStatus
from shared.core.nodecost import NodeCost, PrefillEstimator
from shared.infra.busapi import MessageBus
from shared.infra.settings import NodeSpec
from shared.infra.store_stats import prefix_hit_rate
from shared.infra.store_types import NodeRecord, NodeUpdate, StateStore

__all__ = ["NodeScrapers", "RestartHook"]

RestartHook = Callable[[str, "float | None", str], Awaitable[object]]
"""``(node, since, reason)``: the node's engine was restarted after ``since`` (the wall time of
the last good scrape of the old one), for ``reason``."""


def _status(rec: NodeRecord, ts: float) -> NodeStatus:
    return NodeStatus(
        node_id=rec.id,
        ts=ts,
        models=sorted(rec.models or ()),
        capacity_tokens=rec.capacity_tokens,
        used_tokens=rec.used_tokens,
        usage=rec.usage,
        running=rec.running,
        waiting=rec.waiting,
        healthy=rec.healthy,
        block_size=rec.block_size,
        url=rec.url,
        prefix_cache_queries=rec.prefix_cache_queries,
        prefix_cache_hits=rec.prefix_cache_hits,
    )


@dataclass(slots=True)
class NodeScrapers:
    """Scrapes the configured nodes into the store and onto the bus."""

    nodes: Sequence[NodeSpec]
    fetch: Fetch
    store: StateStore
    bus: MessageBus
    log: FilteringBoundLogger
    target_utilisation: float
    clock: Callable[[], float]
    health: dict[str, NodeHealth] = field(default_factory=dict)
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    on_restart: RestartHook | None = None
    starts: dict[str, float] = field(default_factory=dict)
    last_ok: dict[str, float] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    prices: dict[str, PrefillEstimator] = field(default_factory=dict)
    """Per node, the estimate of its prefill price from its own counters (docs/internals.md,
    "The cost of a node"), warmed up from its nodes-file profile; none for a pinned node."""

    def price(self, spec: NodeSpec, m: VllmMetrics) -> NodeCost:
        """The node's prices after this scrape: its pin, else its estimate moved on by the
        scrape's prefill counters (its profile's until the node has computed a prompt)."""
        prior = spec.prior_cost()
        if prior.source == "pinned":
            return prior
        est = self.prices.get(spec.id)
        if est is None:
            est = self.prices[spec.id] = PrefillEstimator(prior)
        if m.prefill is not None:
            est.observe(m.prefill)
        return est.cost()

    def restart_reason(self, node: str, m: VllmMetrics) -> str | None:
        """Why the engine behind ``node`` is not the one its previous good scrape saw, or
        ``None`` (also on the first scrape: nothing to compare). Call before
        :meth:`window_hit_rate`, which moves the counters on."""
        prev_start = self.starts.get(node)
        if m.start_time is not None:
            self.starts[node] = m.start_time
            if prev_start is not None and m.start_time != prev_start:
                return f"process start time {prev_start:.0f} -> {m.start_time:.0f}"
        prev = self.counters.get(node)
        queries, hits = m.prefix_cache_queries, m.prefix_cache_hits
        if (
            prev is not None
            and queries is not None
            and hits is not None
            and (queries < prev[0] or hits < prev[1])
        ):
            return f"prefix-cache counters went back ({prev[0]} -> {queries} queries)"
        return None

    def window_hit_rate(self, node: str, queries: int | None, hits: int | None) -> float | None:
        """Prefix-cache hit rate since the previous scrape of ``node`` (``None``: no queries in
        between, no counters, or the counters went back because the engine restarted)."""
        if queries is None or hits is None:
            return None
        prev = self.counters.get(node)
        self.counters[node] = (queries, hits)
        if prev is None or queries < prev[0] or hits < prev[1]:
            return None
        return prefix_hit_rate(queries - prev[0], hits - prev[1])

    async def scrape_all(self) -> None:
        """One round: every node, concurrently; one node's failure never stops the others."""
        async with anyio.create_task_group() as tg:
            for spec in self.nodes:
                tg.start_soon(self._scrape_logged, spec)

    async def _scrape_logged(self, spec: NodeSpec) -> None:
        try:
            await self.scrape_one(spec)
        except Exception:  # the store or the bus failed, not the node: try again next round
            self.log.exception("node_scrape_failed", node=spec.id)

    async def scrape_one(self, spec: NodeSpec) -> NodeRecord:
        """Scrape one node, write its record, publish its status, log one line."""
        health = self.health.setdefault(spec.id, NodeHealth())
        error: str | None = None
        bad_lines = 0
        hit_rate: float | None = None
        try:
            res = await scrape_node(
                self.fetch,
                spec.url,
                spec.metrics,
                capacity_known=spec.capacity_tokens is not None,
            )
        except ScrapeError as exc:
            health.failed(self.clock())
            error = str(exc)
            rec = await self.store.put_node_status(
                spec.id,
                NodeUpdate(
                    url=spec.url,
                    healthy=health.healthy,
                    failures=health.failures,
                    updated_at=self.clock(),
                ),
            )
        else:
            health.ok(self.clock())
            m = res.metrics
            bad_lines = res.bad_lines
            restarted = self.restart_reason(spec.id, m)
            if restarted is not None:
                self.restarts[spec.id] = self.restarts.get(spec.id, 0) + 1
                self.log.warning("engine_restarted", node=spec.id, reason=restarted)
                if self.on_restart is not None:
                    await self.on_restart(spec.id, self.last_ok.get(spec.id), restarted)
            self.last_ok[spec.id] = self.clock()
            hit_rate = self.window_hit_rate(spec.id, m.prefix_cache_queries, m.prefix_cache_hits)
            models = res.models if res.models is not None else (spec.model,) if spec.model else None
            capacity = spec.capacity_tokens or m.capacity_tokens  # the nodes file overrides
            cost = self.price(spec, m)
            rec = await self.store.put_node_status(
                spec.id,
                NodeUpdate(
                    url=spec.url,
                    capacity_tokens=capacity,
                    target_utilisation=self.target_utilisation,
                    healthy=True,
                    models=None if models is None else frozenset(models),
                    block_size=m.block_size,
                    used_tokens=round(m.usage * capacity),
                    usage=m.usage,
                    running=m.running,
                    waiting=m.waiting,
                    prefix_cache_queries=m.prefix_cache_queries,
                    prefix_cache_hits=m.prefix_cache_hits,
                    updated_at=self.clock(),
                    failures=0,
                    prefill_s=cost.prefill_s,
                    attn_s=cost.attn_s,
                    cost_tokens=cost.observed_tokens,
                    cost_source=cost.source,
                ),
            )
        await self.bus.publish_msg(_status(rec, rec.updated_at))
        log = self.log.warning if error is not None else self.log.info
        log(
            "node_scraped",
            node=spec.id,
            healthy=rec.healthy,
            failures=health.failures,
            capacity=rec.capacity_tokens,
            used=rec.used_tokens,
            reserved=rec.reserved,
            running=rec.running,
            waiting=rec.waiting,
            prefix_hit_rate=None if hit_rate is None else round(hit_rate, 4),
            prefill_us_per_token=None if rec.prefill_s is None else round(rec.prefill_s * 1e6, 3),
            cost_source=rec.cost_source or None,
            bad_lines=bad_lines or None,
            error=error,
        )
        return rec
