"""Where the gateway forwards: node id → base URL, and the models the nodes serve (pure).

Two sources: the static list (``TAO_NODES="id=url,id=url"`` or ``create_app(node_urls=...)``)
and the :class:`~shared.contracts.NodeStatus` messages telemetry publishes, which carry the
node's ``url``, ``models`` and ``block_size`` (scraped from ``vllm:cache_config_info``). A
status with a URL overrides the static one (telemetry sees the node that actually answers). A
node no status has described has no known block size: the gateway then makes no block keys
for it (:mod:`.tokenids`).

Health: a status saying ``healthy=false`` (telemetry: three failed scrapes in a row, at least
3 s since the last good one) sets the node's :meth:`NodeDirectory.down` event, which aborts
every forward in flight to it and turns away new ones (:mod:`.relay`), so a frozen or dead
engine holds no client past its detection; a later healthy status gives the node a fresh
event.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.contracts import NodeStatus

__all__ = ["NodeDirectory", "NodeEntry"]


@dataclass(slots=True)
class NodeEntry:
    """What the gateway knows of one node."""

    url: str | None = None
    models: list[str] = field(default_factory=list)
    healthy: bool = True
    seen_at: float | None = None
    block_size: int | None = None
    down: asyncio.Event = field(default_factory=asyncio.Event)


class NodeDirectory:
    """Node URLs and models, from static configuration and node status messages."""

    def __init__(self, static: Mapping[str, str] | None = None) -> None:
        self._nodes: dict[str, NodeEntry] = {
            node_id: NodeEntry(url=url.rstrip("/")) for node_id, url in (static or {}).items()
        }

    def update(self, status: NodeStatus) -> None:
        """Record a node status (URL, models, health); older statuses are ignored."""
        entry = self._nodes.setdefault(status.node_id, NodeEntry())
        if entry.seen_at is not None and status.ts < entry.seen_at:
            return
        entry.seen_at = status.ts
        if not status.healthy:
            entry.down.set()  # forwards in flight to it end now
        elif entry.down.is_set():
            entry.down = asyncio.Event()
        entry.healthy = status.healthy
        entry.models = list(status.models)
        entry.block_size = status.block_size if status.block_size > 0 else None
        if status.url:
            entry.url = status.url.rstrip("/")

    def url_of(self, node_id: str) -> str | None:
        """The base URL of ``node_id`` (``http://host:port``, maybe ending in ``/v1``)."""
        entry = self._nodes.get(node_id)
        return entry.url if entry is not None else None

    def down(self, node_id: str) -> asyncio.Event:
        """Set while ``node_id`` is known unhealthy (module docstring)."""
        return self._nodes.setdefault(node_id, NodeEntry()).down

    def block_size(self, node_id: str) -> int | None:
        """The KV block size of ``node_id`` in tokens, ``None`` until a status gave it."""
        entry = self._nodes.get(node_id)
        return entry.block_size if entry is not None else None

    def items(self) -> list[tuple[str, str]]:
        """``(node id, base URL)`` of every node with a known URL."""
        return [(n, e.url) for n, e in sorted(self._nodes.items()) if e.url]

    def models(self) -> list[str]:
        """The union of the models reported by the nodes, sorted."""
        return sorted({m for e in self._nodes.values() for m in e.models})

    def endpoint(self, node_id: str, path: str) -> str | None:
        """The full URL of the OpenAI ``path`` (``/v1/...``) on ``node_id``, or ``None``."""
        base = self.url_of(node_id)
        if base is None:
            return None
        if base.endswith("/v1") and path.startswith("/v1/"):
            return base + path[3:]
        return base + path
