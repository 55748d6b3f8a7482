"""Admissions the gateway learns from the state store rather than from a placement.

Placements reach the gateway on an ephemeral consumer that starts with the placements published
after it was created (``deliver="new"``), so a gateway that restarted, or whose consumer lost
messages, does not know sessions admitted before. Their requests would hold until the hold
timeout, and no admit placement would ever come: the store already says they are admitted.

Two reads close that gap; neither is on the hot path (a session the gateway knows as admitted is
forwarded without touching Redis):

* on arrival: a request of a session not known as admitted reads ``store.get_session`` once;
* while held: one watcher per held session re-reads the record every ``every_s`` seconds (one
  ``HGETALL`` per session, however many of its requests are held), so no request waits for a
  placement that was applied already.

A stored record counts when it is admitted (``node`` set, not ended) and the gateway knows the
node's URL; it is recorded in the :class:`.placements.PlacementMap` with the record's version
(placements of the same or an older version are then stale). A store that cannot be read is
logged and treated as "not admitted": the request holds as it would without a store.
"""

from __future__ import annotations

import asyncio
from typing import Final, Literal

from structlog.typing import FilteringBoundLogger

from services.gateway.holds import Holds
from services.gateway.metrics import GatewayMetrics
from services.gateway.nodes import NodeDirectory
from services.gateway.placements import PlacementMap
from shared.infra.store_types import StateStore

__all__ = ["STORE_RECHECK_S", "StoreCheck"]

STORE_RECHECK_S: Final = 2.0
"""Default interval of the held-session watcher, seconds: well under the default 120 s hold
limit, at one small Redis read per held session."""

When = Literal["arrival", "held"]


class StoreCheck:
    """Reads admissions from the store on arrival and for held sessions (module docstring)."""

    def __init__(
        self,
        store: StateStore | None,
        placements: PlacementMap,
        nodes: NodeDirectory,
        holds: Holds,
        metrics: GatewayMetrics,
        log: FilteringBoundLogger,
        *,
        every_s: float = STORE_RECHECK_S,
    ) -> None:
        if not every_s > 0:
            raise ValueError(f"store re-check interval must be > 0 s, got {every_s!r}")
        self.store = store
        self.placements = placements
        self.nodes = nodes
        self.holds = holds
        self.metrics = metrics
        self.log = log
        self.every_s = every_s
        self._watchers: dict[str, asyncio.Task[None]] = {}

    async def lookup(self, session_id: str, when: When) -> str | None:
        """The session's node: the stored record's when it is admitted on a node with a known
        URL (recorded in the placement map), else what the placement map says after the read
        (a placement may have arrived meanwhile)."""
        if self.store is None:
            return self.placements.node_of(session_id)
        try:
            record = await self.store.get_session(session_id)
        except Exception as exc:  # any store failure: hold as without a store
            self.log.warning("store_read_failed", session_id=session_id, error=str(exc))
            return self.placements.node_of(session_id)
        if (
            record is not None
            and record.node is not None
            and not record.ended
            and self.nodes.url_of(record.node) is not None
            and self.placements.restore(session_id, record.version, record.node) == "admitted"
        ):
            self.metrics.store_admissions.inc(when=when)
            self.log.info(
                "admitted_from_store",
                session_id=session_id,
                node_id=record.node,
                version=record.version,
                when=when,
            )
        return self.placements.node_of(session_id)

    def watch(self, session_id: str) -> None:
        """Start the session's watcher unless it runs already (no-op without a store)."""
        if self.store is None:
            return
        running = self._watchers.get(session_id)
        if running is None or running.done():
            self._watchers[session_id] = asyncio.create_task(self._watch(session_id))

    async def _watch(self, session_id: str) -> None:
        me = asyncio.current_task()
        try:
            while self.holds.is_held(session_id):
                await asyncio.sleep(self.every_s)
                if not self.holds.is_held(session_id):
                    return
                node = await self.lookup(session_id, "held")
                if node is not None and self.holds.admit(session_id, node):
                    self.log.info("held_released_from_store", session_id=session_id, node_id=node)
                    return
        finally:
            if self._watchers.get(session_id) is me:  # removed before the task completes
                del self._watchers[session_id]

    def watching(self) -> int:
        """How many held sessions are being watched now."""
        return len(self._watchers)

    async def close(self) -> None:
        """Stop every watcher (app cleanup)."""
        tasks = list(self._watchers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchers.clear()
