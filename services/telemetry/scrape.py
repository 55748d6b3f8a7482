"""Scraping one vLLM node: ``GET /metrics`` and ``GET /v1/models``, and the health rule.

The fetch is injected (:data:`Fetch`), so tests drive the scraper without a server; the live
service uses :class:`HttpFetch` (one shared aiohttp session, a total timeout per request).

Health: a node is healthy after a successful scrape and stays healthy through up to
``MAX_FAILURES - 1`` failed scrapes in a row; it turns unhealthy at the ``MAX_FAILURES``-th
consecutive failure once the failures also span at least :data:`DOWN_AFTER_S` since its last
good scrape (the planner then treats it as ineligible, and the gateway ends the forwards in
flight to it). Counting alone would make the rule depend on the scrape period: at 0.5 s, a
1.5 s stall of a loaded machine, where every node answered late, aborted every stream on every
node. A node never scraped successfully is unhealthy. A page whose metrics do not parse at
all, or that has no KV capacity, counts as a failed scrape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from services.telemetry.prom import parse_lenient
from services.telemetry.vllm_metrics import VllmMetrics, from_samples

__all__ = [
    "DOWN_AFTER_S",
    "MAX_FAILURES",
    "Fetch",
    "HttpFetch",
    "NodeHealth",
    "ScrapeError",
    "ScrapeResult",
    "parse_models",
    "scrape_node",
]

MAX_FAILURES: Final = 3
"""Consecutive failed scrapes that mark a node unhealthy (services issue)."""

DOWN_AFTER_S: Final = 3.0
"""The least time from a node's last good scrape to the failure that marks it unhealthy (the
default 1 s scrape reaches it with its third failure anyway)."""

Fetch = Callable[[str], Awaitable[bytes]]
"""``await fetch(url)`` → the response body; raises on a transport error or a non-2xx status."""


class ScrapeError(Exception):
    """Scraping ``url`` failed, for ``reason``."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


class _Model(msgspec.Struct):
    id: str


class _Models(msgspec.Struct):
    data: list[_Model] = msgspec.field(default_factory=list)


def parse_models(body: bytes) -> tuple[str, ...]:
    """Model ids from an OpenAI ``/v1/models`` body; raise :class:`ValueError` if unreadable."""
    try:
        return tuple(m.id for m in msgspec.json.decode(body, type=_Models).data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"/v1/models: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    """What one successful scrape found; ``models`` is None when the node did not say."""

    metrics: VllmMetrics
    models: tuple[str, ...] | None
    bad_lines: int = 0


async def scrape_node(
    fetch: Fetch, base_url: str, page: str, *, capacity_known: bool = False
) -> ScrapeResult:
    """Scrape the node at ``base_url`` (its Prometheus metrics from ``page``,
    :attr:`NodeSpec.metrics <shared.infra.settings.NodeSpec.metrics>`); raise
    :class:`ScrapeError` when the node cannot be used. ``capacity_known``: the nodes file
    overrides the capacity, so a page without ``vllm:cache_config_info`` is still usable."""
    base = base_url.rstrip("/")
    try:
        body = await fetch(page)
    except Exception as exc:
        raise ScrapeError(page, f"{type(exc).__name__}: {exc}") from exc
    samples, errors = parse_lenient(body.decode("utf-8", errors="replace"))
    if not samples:
        raise ScrapeError(page, "no metric samples in the page")
    metrics = from_samples(samples)
    if metrics.capacity_tokens <= 0 and not capacity_known:
        raise ScrapeError(page, "no KV capacity (vllm:cache_config_info)")
    models: tuple[str, ...] | None
    try:
        models = parse_models(await fetch(f"{base}/v1/models"))
    except Exception:
        models = metrics.model_names or None  # the metric labels name the served model too
    return ScrapeResult(metrics=metrics, models=models, bad_lines=len(errors))


@dataclass(slots=True)
class NodeHealth:
    """The consecutive-failure counter of one node, with the times of its last good scrape and
    its last failure (seconds on the scraper's clock)."""

    failures: int = 0
    seen_ok: bool = False
    ok_at: float = 0.0
    failed_at: float = 0.0

    def ok(self, now: float) -> None:
        self.failures = 0
        self.seen_ok = True
        self.ok_at = now

    def failed(self, now: float) -> None:
        self.failures += 1
        self.failed_at = now

    @property
    def healthy(self) -> bool:
        if not self.seen_ok:
            return False
        return self.failures < MAX_FAILURES or self.failed_at - self.ok_at < DOWN_AFTER_S


class HttpFetch:
    """:data:`Fetch` over one aiohttp session; close it with :meth:`aclose`."""

    def __init__(self, timeout_s: float) -> None:
        import aiohttp

        self._session: Any = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s))

    async def __call__(self, url: str) -> bytes:
        async with self._session.get(url) as resp:
            resp.raise_for_status()
            body: bytes = await resp.read()
            return body

    async def aclose(self) -> None:
        await self._session.close()
