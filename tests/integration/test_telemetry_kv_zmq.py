"""KvResidency on a real ZMQ stream in vLLM's wire format (the sim node's publisher): catch-up
replay, a forced gap filled by replay, AllBlocksCleared, and an engine restart, down to the
residency written to the store. (Bus and store are the in-memory ones: the ZMQ path is what is
real here.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import anyio
import pytest

from services.simnode.kvpub import KvPublisher
from services.telemetry.kvresidency import KvMessageLike, KvResidency, zmq_feed
from shared.contracts.kv import AllBlocksCleared, BlockStored, KVEncoding, KVEventBatch
from shared.contracts.session import SessionResponse, Usage
from shared.core.blockkeys import chain_keys
from shared.infra.embedded import free_port
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.settings import NodeSpec

BS = 16
TOKENS = list(range(700, 700 + 4 * BS))
KEYS = chain_keys(TOKENS, BS)
WAIT_S = 20.0
PROBE_EVERY_S = 0.05


def store_batch(hashes: list[int], parent: int | None, lo: int, hi: int) -> KVEventBatch:
    ev = BlockStored(hashes, parent, TOKENS[lo * BS : hi * BS], BS, None, "GPU", None)
    return KVEventBatch(ts=time.time(), events=[ev])


def probe() -> KVEventBatch:
    return KVEventBatch(ts=time.time(), events=[])


class Stream:
    """A real ZMQ publisher and a KvResidency following it; ``seen`` gets every applied seq."""

    def __init__(self, encoding: KVEncoding) -> None:
        self.ports = (free_port(), free_port())
        self.encoding = encoding
        self.pub = self.publisher()
        self.seen: asyncio.Queue[int] = asyncio.Queue()
        self.store = FakeStore()
        self.bus = FakeBus()
        self.spec = NodeSpec(
            "n1",
            "http://127.0.0.1:1",
            kv_events=f"tcp://127.0.0.1:{self.ports[0]}",
            kv_replay=f"tcp://127.0.0.1:{self.ports[1]}",
        )
        self.kv = KvResidency(self.store, get_logger("test"), [self.spec], feeds=self.feed)

    def publisher(self) -> KvPublisher:
        p, r = self.ports
        pub = KvPublisher(f"tcp://*:{p}", f"tcp://*:{r}", encoding=self.encoding)
        pub.start()
        return pub

    async def feed(self, spec: NodeSpec) -> AsyncIterator[KvMessageLike]:
        async for msg in zmq_feed(spec):
            yield msg
            self.seen.put_nowait(msg.seq)  # after the consumer applied it

    async def until(self, seq: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while await self.seen.get() != seq:
                pass

    async def join(self) -> None:
        """Publish empty batches until one arrives live (the SUB has joined the PUB)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                seq = self.pub.publish_batch(probe())
                try:
                    async with asyncio.timeout(PROBE_EVERY_S):
                        await self.until(seq)
                    return
                except TimeoutError:
                    continue

    async def residency(self) -> dict[str, tuple[int, float]]:
        assert await self.kv.flush()
        return (await self.store.residency(["s1"]))["s1"]


@pytest.mark.parametrize("encoding", ["legacy", "mapev", "map"])
async def test_residency_follows_a_real_zmq_stream(encoding: KVEncoding) -> None:
    s = Stream(encoding)
    try:
        s.pub.publish_batch(store_batch([1, 2], None, 0, 2))  # before telemetry: caught up
        await s.kv.start(s.bus, "telemetry")
        async with anyio.create_task_group() as tg:
            tg.start_soon(s.kv.run)
            await s.until(0)
            await s.bus.publish_msg(
                SessionResponse(
                    session_id="s1",
                    request_id="r1",
                    node_id="n1",
                    gateway_id="gw",
                    finished_at=time.time(),
                    usage=Usage(prompt_tokens=64, total_tokens=64),
                    block_size=BS,
                    block_keys=KEYS,
                )
            )
            await s.bus.settle()
            assert (await s.residency())["n1"][0] == 2 * BS

            await s.join()
            s.pub.drop_next(1)  # a gap the feed fills from the replay socket
            s.pub.publish_batch(store_batch([3], 2, 2, 3))
            last = s.pub.publish_batch(store_batch([4], 3, 3, 4))
            await s.until(last)
            assert (await s.residency())["n1"][0] == 4 * BS
            assert s.kv.counts["gaps_zmq"] == 0

            await s.until(
                s.pub.publish_batch(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))
            )
            assert await s.residency() == {}
            stats = s.kv.index.stats("n1")
            assert stats is not None and stats.blocks == 0 and stats.incarnation == 0

            # An engine that ran a while has a high seq; a restarted one numbers from 0 again.
            # (Its first batches may be lost while the SUB reconnects: a backwards seq is only
            # visible while the new numbering is still below the old one, see KvFeed.)
            for _ in range(500):
                last = s.pub.publish_batch(probe())
            await s.until(last)
            await s.pub.close()
            s.pub = s.publisher()
            s.pub.publish_batch(store_batch([1], None, 0, 1))
            await s.join()
            stats = s.kv.index.stats("n1")
            assert stats is not None and stats.incarnation == 1 and stats.blocks == 1
            assert s.kv.counts["restarts"] == 1
            tg.cancel_scope.cancel()
    finally:
        await s.pub.close()
        await s.bus.drain()
