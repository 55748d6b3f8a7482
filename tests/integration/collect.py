"""A bus handler that records what it is given, for the integration tests to wait on.

Waits are bounded by a timeout so that a message that never comes fails the test instead of
hanging it; they are never timing assertions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from shared.contracts import DeadLetter, decode, subjects
from shared.infra import Delivery, MessageBus


class Collector:
    """Records (value, delivery) pairs; ``wait(n)`` returns once n have arrived, ``values(n,
    pred)`` once n values satisfy ``pred``."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.items: list[tuple[Any, Delivery]] = []
        self.timeout_s = timeout_s
        self._changed = asyncio.Event()

    async def __call__(self, value: Any, delivery: Delivery) -> None:
        self.items.append((value, delivery))
        self._changed.set()

    async def _until(self, ready: Callable[[], bool], want: str) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                while not ready():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            got = len(self.items)
            raise AssertionError(f"{want} within {self.timeout_s:g} s; {got} arrived") from None

    async def wait(self, n: int) -> list[tuple[Any, Delivery]]:
        """All pairs, once at least ``n`` have arrived."""
        await self._until(lambda: len(self.items) >= n, f"wanted {n} items")
        return self.items

    async def values(self, n: int = 1, pred: Callable[[Any], bool] | None = None) -> list[Any]:
        """The values that satisfy ``pred`` (all when ``None``), once there are ``n``."""

        def found() -> list[Any]:
            return [v for v, _ in self.items if pred is None or pred(v)]

        await self._until(lambda: len(found()) >= n, f"wanted {n} matching values")
        return found()


def _decode_dead_letter(data: bytes) -> DeadLetter:
    return decode(data, DeadLetter)


async def dead_letter_reader(bus: MessageBus, service: str, timeout_s: float = 10.0) -> Collector:
    """A collector of the dead letters of ``service``, read with a consumer of the DLQ stream."""
    got = Collector(timeout_s)
    await bus.consume(
        subjects.STREAM_DLQ,
        "dlq-reader",
        _decode_dead_letter,
        got,
        filter_subject=subjects.dead_letter(service),
    )
    return got
