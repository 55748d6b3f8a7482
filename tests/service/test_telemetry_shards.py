"""Telemetry partitioned by node (``TAO_SHARD``): two KvResidency shards and their inspection
responders on one FakeBus and FakeStore, against one unsharded KvResidency fed the same events.

The shards together write what the unsharded process writes (residency of every session on
every node, the chains), each keeps the block index of its own nodes only, and each inspection
request is answered once, by the shard that owns the node."""

from __future__ import annotations

import asyncio
import contextlib

import orjson

from services.telemetry import app
from services.telemetry.inspect import Inspector
from services.telemetry.kvresidency import KV_RECEIVED_AT_HEADER, KV_SEQ_HEADER, KvResidency
from shared.contracts import subjects
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.settings import NodeSpec, Settings
from shared.infra.shard import Shard
from tests.service.test_telemetry_kv import BS, KEYS, TOKENS, TS, payload, response, stored
from tests.service.test_telemetry_service import MODELS, PAGE

SHARDS = (Shard(0, 2), Shard(1, 2))
SESSIONS = ["s1", "s2", "s3"]


def _node_of(shard: Shard, taken: set[str]) -> str:
    """A node id ``shard`` owns, not in ``taken``."""
    return next(f"n{i}" for i in range(100) if shard.owns(f"n{i}") and f"n{i}" not in taken)


A = _node_of(SHARDS[0], set())
B = _node_of(SHARDS[1], {A})
B2 = _node_of(SHARDS[1], {A, B})
NODES = [NodeSpec(n, f"http://{n}") for n in (A, B, B2)]


class Cluster:
    """``shards`` KvResidency processes (or one unsharded) on one bus and store."""

    def __init__(self, shards: tuple[Shard, ...] | None) -> None:
        self.bus = FakeBus()
        self.store = FakeStore()
        log = get_logger("test")
        self.kvs = (
            [KvResidency(self.store, log, NODES, feeds=None)]
            if shards is None
            else [
                KvResidency(
                    self.store, log, [n for n in NODES if s.owns(n.id)], feeds=None, shard=s
                )
                for s in shards
            ]
        )

    async def start(self) -> Cluster:
        for kv in self.kvs:
            await kv.start(self.bus, kv.shard.member("telemetry"))
            nodes = [n for n in NODES if kv.shard.owns(n.id)]
            inspector = Inspector(kv.index, self.store, nodes, shard=kv.shard)
            await inspector.start(self.bus, kv.shard.member("telemetry"))
        return self

    async def feed(self) -> None:
        """Blocks on three nodes, then responses of three sessions served on them."""
        events = [
            (A, 0, payload(stored([1, 2], None, TOKENS[: 2 * BS]))),
            (B, 0, payload(stored([1, 2, 3], None, TOKENS[: 3 * BS]))),
            (B2, 0, payload(stored([1], None, TOKENS[:BS]))),
            (A, 1, payload(stored([3], 2, TOKENS[2 * BS : 3 * BS]), ts=TS + 1)),
        ]
        for node, seq, data in events:
            headers = {KV_SEQ_HEADER: str(seq), KV_RECEIVED_AT_HEADER: repr(TS)}
            await self.bus.publish(subjects.kv_events(node), data, headers)
        await self.bus.publish_msg(response("s1", A, keys=KEYS))
        await self.bus.publish_msg(response("s2", B, keys=KEYS[:2]))
        await self.bus.publish_msg(response("s3", B2, keys=None))  # usage-based: no chain
        await self.bus.settle()
        for kv in self.kvs:
            assert await kv.flush()

    async def ask(self, what: str, body: dict[str, object]) -> dict[str, object]:
        reply = await self.bus.request(subjects.inspect(what), orjson.dumps(body), 1.0)
        return orjson.loads(reply)  # type: ignore[no-any-return]


async def test_shards_write_what_one_process_writes() -> None:
    one = await Cluster(None).start()
    two = await Cluster(SHARDS).start()
    await one.feed()
    await two.feed()
    want = await one.store.residency(SESSIONS)
    assert want["s1"] == {A: (3 * BS, TS), B: (3 * BS, TS), B2: (BS, TS)}  # a real mix
    assert want["s2"] == {A: (2 * BS, TS), B: (2 * BS, TS), B2: (BS, TS)} and want["s3"]
    assert await two.store.residency(SESSIONS) == want
    assert await two.store.chains() == await one.store.chains()
    await one.bus.drain()
    await two.bus.drain()


async def test_each_shard_indexes_its_own_nodes_and_shard_zero_stores_the_chains() -> None:
    two = await Cluster(SHARDS).start()
    await two.feed()
    first, second = two.kvs
    assert (first.index.has_node(A), first.index.has_node(B), first.index.has_node(B2)) == (
        True,
        False,
        False,
    )
    assert (second.index.has_node(A), second.index.has_node(B), second.index.has_node(B2)) == (
        False,
        True,
        True,
    )
    assert first.counts["foreign_kv"] == 2 and second.counts["foreign_kv"] == 2
    assert first.counts["chains_written"] == 2 and second.counts["chains_written"] == 0
    # every shard keeps every chain: a session's prefix may sit on any node
    assert second.index.walk(A, KEYS) == 0 and second.index.walk(B, KEYS) == 3
    await two.bus.drain()


async def test_each_inspection_is_answered_by_the_node_owner() -> None:
    two = await Cluster(SHARDS).start()
    await two.feed()
    for node, blocks in ((A, 3), (B, 3), (B2, 1)):
        reply = await two.ask("node", {"node": node})
        assert (reply["node"], reply["blocks"]) == (node, blocks)
        prefix = await two.ask("prefix", {"node": node, "tokens": TOKENS})
        assert prefix == {"resident_prefix_tokens": blocks * BS, "host_prefix_tokens": 0}
    assert await two.ask("node", {"node": "zz"}) == {"error": "unknown node 'zz'"}
    bad = await two.ask("prefix", {"node": 1})
    assert "PrefixQuery" in str(bad["error"])
    await two.bus.drain()


async def test_the_service_scrapes_only_its_shards_nodes() -> None:
    """``run`` with ``TAO_SHARD=1/2`` scrapes, stores and publishes only its nodes."""
    store, bus = FakeStore(), FakeBus()
    fetched: list[str] = []

    async def fetch(url: str) -> bytes:
        fetched.append(url)
        return MODELS if url.endswith("/v1/models") else PAGE.encode()

    settings = Settings(nodes=tuple(NODES), shard=SHARDS[1], scrape_s=0.05)
    task = asyncio.ensure_future(app.run(settings, store, bus, fetch))
    try:
        async with asyncio.timeout(10):
            while {r.id for r in await store.nodes()} != {B, B2}:
                await asyncio.sleep(0.01)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert {u.split("/")[2] for u in fetched} == {B, B2}
    statuses = {subjects.node_status(n.id) for n in NODES}
    sent = {s for s, _, _ in bus.published if s in statuses}
    assert sent == {subjects.node_status(B), subjects.node_status(B2)}
    await bus.drain()
