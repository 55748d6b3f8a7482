"""Helpers for the tests that run real ZMQ KV-event streams (publisher → :class:`KvFeed`).

A ZMQ SUB socket misses what its PUB sends before the subscription has reached the PUB (the
"slow joiner"), so a test first *joins*: it sends probes until the feed yields one, and from
then on every batch arrives. Waits are bounded by ``WAIT_S`` so that a broken feed fails the
test instead of hanging it; they are never timing assertions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

from shared.infra.kvzmq import KvFeed, KvMessage

WAIT_S = 20.0
PROBE_EVERY_S = 0.02


class FeedReader:
    """Runs ``feed.messages()`` in a task and queues what it yields."""

    def __init__(self, feed: KvFeed) -> None:
        self.feed = feed
        self.queue: asyncio.Queue[KvMessage] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async for msg in self.feed.messages():
            await self.queue.put(msg)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with suppress(asyncio.CancelledError):
                await self.task

    async def next(self) -> KvMessage:
        """The next message (fails the test after ``WAIT_S``)."""
        return await asyncio.wait_for(self.queue.get(), WAIT_S)

    async def join(self, probe: Callable[[], Any]) -> KvMessage:
        """Call ``probe`` (which publishes something) until the feed yields a message."""
        async with asyncio.timeout(WAIT_S):
            while True:
                result = probe()
                if asyncio.iscoroutine(result):
                    await result
                try:
                    return await asyncio.wait_for(self.queue.get(), PROBE_EVERY_S)
                except TimeoutError:
                    continue

    async def until(self, seq: int) -> list[KvMessage]:
        """Messages up to and including the first with ``seq`` (and after any earlier ones)."""
        out: list[KvMessage] = []
        while True:
            msg = await self.next()
            out.append(msg)
            if msg.seq == seq:
                return out

    def drain_nowait(self) -> list[KvMessage]:
        out: list[KvMessage] = []
        while not self.queue.empty():
            out.append(self.queue.get_nowait())
        return out


@asynccontextmanager
async def reading(feed: KvFeed) -> AsyncIterator[FeedReader]:
    """A started :class:`FeedReader`, stopped (and the feed's sockets closed) on exit."""
    reader = FeedReader(feed)
    reader.start()
    try:
        yield reader
    finally:
        await reader.stop()
