"""Helpers shared by the gateway's service tests: what it publishes, and placements for it."""

from __future__ import annotations

import asyncio
from typing import Any

from shared.contracts import Message, Placement, SessionResponse, decode, subjects
from shared.infra import Delivery, FakeBus


class Recorder:
    """Collects the session events the gateway publishes, awaitable by type."""

    def __init__(self) -> None:
        self.seen: list[Message] = []
        self._new = asyncio.Condition()

    async def handler(self, msg: Message, delivery: Delivery) -> None:
        async with self._new:
            self.seen.append(msg)
            self._new.notify_all()

    async def next(self, kind: type[Message], count: int = 1) -> list[Any]:
        """Wait until ``count`` messages of ``kind`` were seen; return them."""

        def have() -> list[Any]:
            return [m for m in self.seen if isinstance(m, kind)]

        async with self._new:
            await asyncio.wait_for(self._new.wait_for(lambda: len(have()) >= count), 10)
        return have()

    def of(self, kind: type[Message]) -> list[Any]:
        return [m for m in self.seen if isinstance(m, kind)]


def reported(bus: FakeBus) -> list[SessionResponse]:
    """The session responses the gateway published on ``bus``, in order."""
    prefix = subjects.session_events("response")[:-1]
    return [decode(d, SessionResponse) for s, d, _ in bus.published if s.startswith(prefix)]


async def admit(bus: FakeBus, gateway: str, session: str = "s1", version: int = 1) -> None:
    """Place ``session`` on node ``n1`` of ``gateway`` (tick 1) and let the gateway see it."""
    placement = Placement(
        kind="admit", session_id=session, version=version, tick=1, gateway_id=gateway, node_id="n1"
    )
    await bus.publish_msg(placement)
    await bus.settle()
