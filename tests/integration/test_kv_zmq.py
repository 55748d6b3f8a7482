"""Real KV-event streams: sim node (in process and as a process) → ZMQ → KvFeed, and the bridge.

The sim node publishes its engine's cache events in vLLM's wire format; these tests read them
back through :class:`~shared.infra.kvzmq.KvFeed` over real sockets (forced gap, restart,
``POST /reset_prefix_cache``, each encoding) and through ``tao kv-bridge`` onto real NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import msgspec
import pytest
from aiohttp import web

from services.simnode.app import SimNodeConfig, create_app
from services.simnode.kvpub import KvPublisher
from shared.cli.kvbridge import bridge
from shared.contracts import subjects
from shared.contracts.kv import (
    AllBlocksCleared,
    BlockStored,
    KVEncoding,
    KVEventBatch,
    decode_kv_batch,
)
from shared.core.kvseq import SeqTracker
from shared.infra import Bus, Delivery, Settings
from shared.infra.embedded import free_port, stop_processes
from shared.infra.kvzmq import KV_RECEIVED_AT_HEADER, KV_SEQ_HEADER, KvFeed, KvMessage
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from tests.inspect_contract import NODE_KEYS
from tests.kvzmq_util import PROBE_EVERY_S, WAIT_S, FeedReader, reading

ROOT = Path(__file__).resolve().parents[2]
_prompts = itertools.count(1)


def prompt(tokens: int = 40) -> list[int]:
    """A prompt no earlier request shared a block with (so the engine stores new blocks)."""
    k = next(_prompts)
    return [(k * 1000 + i) % 50_000 for i in range(tokens)]


@dataclass
class Node:
    url: str
    pub_port: int
    replay_port: int

    def feed(self, node: str = "sim1", **kw: Any) -> KvFeed:
        return KvFeed(
            node,
            f"tcp://127.0.0.1:{self.pub_port}",
            f"tcp://127.0.0.1:{self.replay_port}",
            **kw,
        )

    async def complete(self, tokens: list[int] | None = None, max_tokens: int = 2) -> None:
        body = {"model": "tao-sim", "prompt": tokens or prompt(), "max_tokens": max_tokens}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{self.url}/v1/completions", json=body) as r,
        ):
            assert r.status == 200, await r.text()

    async def post(self, path: str) -> aiohttp.ClientResponse:
        async with aiohttp.ClientSession() as http, http.post(f"{self.url}{path}") as r:
            await r.read()
            return r


@contextlib.asynccontextmanager
async def sim_node(encoding: KVEncoding = "mapev", kv_hash: str = "int") -> AsyncIterator[Node]:
    """A sim node in this process, publishing KV events on fresh ports."""
    pub, replay = free_port(), free_port()
    config = SimNodeConfig(
        "sim1",
        time_scale=1000.0,
        kv_events=f"tcp://*:{pub}",
        kv_replay=f"tcp://*:{replay}",
        kv_encoding=encoding,
        kv_hash=kv_hash,  # type: ignore[arg-type]
    )
    runner = web.AppRunner(create_app(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Node(f"http://127.0.0.1:{port}", pub, replay)
    finally:
        await runner.cleanup()


async def join(reader: FeedReader, node: Node) -> int:
    """Send requests until the feed yields; from then on every batch is seen. Returns the last
    seq read (later batches of the joining requests may still follow it, in order)."""
    last = (await reader.join(node.complete)).seq
    for msg in reader.drain_nowait():
        last = msg.seq
    return last


def events_of(msgs: list[KvMessage]) -> list[Any]:
    return [e for m in msgs for e in decode_kv_batch(m.payload).events]


async def collect_until(reader: FeedReader, done: Any) -> list[KvMessage]:
    """Messages until ``done(messages)`` holds."""
    out: list[KvMessage] = []
    async with asyncio.timeout(WAIT_S):
        while not done(out):
            out.append(await reader.next())
    return out


class TestSimNodeStream:
    """The sim node's stream as a vLLM subscriber sees it."""

    @pytest.mark.parametrize(
        ("encoding", "kv_hash"), [("legacy", "int"), ("mapev", "bytes"), ("map", "int")]
    )
    async def test_stored_blocks_carry_token_ids(self, encoding: KVEncoding, kv_hash: str) -> None:
        """A request's prompt comes back as a BlockStored chain of its token ids."""
        async with sim_node(encoding, kv_hash) as node, reading(node.feed()) as reader:
            await join(reader, node)
            tokens = prompt(40)
            await node.complete(tokens)

            def has_prompt(msgs: list[KvMessage]) -> bool:
                return any(
                    isinstance(e, BlockStored) and e.token_ids[:32] == tokens[:32]
                    for e in events_of(msgs)
                )

            msgs = await collect_until(reader, has_prompt)
        stored = next(
            e
            for e in events_of(msgs)
            if isinstance(e, BlockStored) and e.token_ids[:32] == tokens[:32]
        )
        assert stored.parent_block_hash is None and stored.block_size == 16
        assert len(stored.token_ids) == 16 * len(stored.block_hashes)
        assert isinstance(stored.block_hashes[0], int if kv_hash == "int" else bytes)
        assert stored.medium == "GPU"
        assert (msgs[-1].payload[0] >> 4 == 0x8) == (encoding == "map")

    async def test_forced_gap_is_recovered_by_replay(self) -> None:
        """``POST /tao/debug/kv-drop`` hides a batch; the feed replays it, nothing twice."""
        async with sim_node() as node, reading(node.feed()) as reader:
            last = await join(reader, node)
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{node.url}/tao/debug/kv-drop?n=1") as r,
            ):
                assert r.status == 200
                dropped = (await r.json())["next_seq"]
            await node.complete()
            await node.complete()
            msgs = await collect_until(reader, lambda m: bool(m) and m[-1].seq > dropped)
            stats = reader.feed.stats
        seqs = [m.seq for m in msgs]
        assert seqs == list(range(last + 1, last + 1 + len(seqs)))  # contiguous, once each
        assert next(m for m in msgs if m.seq == dropped).replayed
        assert stats.replays >= 1 and stats.lost == 0

    async def test_bad_drop_count_is_refused(self) -> None:
        """The debug switch takes a count >= 0 and names a bad one."""
        async with sim_node() as node:
            r = await node.post("/tao/debug/kv-drop?n=-1")
        assert r.status == 400

    async def test_reset_prefix_cache_publishes_all_blocks_cleared(self) -> None:
        """``POST /reset_prefix_cache`` (vLLM's route) clears the cache: AllBlocksCleared."""
        async with sim_node() as node, reading(node.feed()) as reader:
            await join(reader, node)
            r = await node.post("/reset_prefix_cache")
            assert r.status == 200 and r.headers["Tao-Reset"] == "cleared"
            msgs = await collect_until(reader, lambda m: AllBlocksCleared() in events_of(m[-1:]))
        assert events_of(msgs[-1:]) == [AllBlocksCleared()]


def spawn_simnode(http: int, pub: int, replay: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "services.simnode", "--port", str(http), "--node-id", "sim1"]
    cmd += ["--time-scale", "1000", "--kv-events", f"tcp://*:{pub}", "--kv-replay"]
    cmd += [f"tcp://*:{replay}", "--kv-encoding", "legacy", "--kv-hash", "bytes"]
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)


START_S = 60.0
"""How long a sim node process may take to answer /health (imports on a busy machine)."""


async def healthy(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with asyncio.timeout(START_S), aiohttp.ClientSession() as http:
        while True:
            assert proc.poll() is None, "the sim node exited"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/health") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.05)


class TestSimNodeProcessRestart:
    """A real sim node process restarted on the same ports."""

    async def test_restart_is_seen_as_backwards_seq_from_zero(self, tmp_path: Path) -> None:
        """After a restart the feed yields seq 0 of the new process (replayed if missed)."""
        http, pub, replay = free_port(), free_port(), free_port()
        node = Node(f"http://127.0.0.1:{http}", pub, replay)
        log = tmp_path / "simnode.log"
        procs: list[subprocess.Popen[bytes]] = []
        tracker = SeqTracker()
        try:
            procs.append(spawn_simnode(http, pub, replay, log))
            await healthy(node.url, procs[-1])
            # a generous replay timeout: the DEALER must reconnect to the new process before
            # its request from 0 is taken, which a busy machine can make slow
            async with reading(node.feed(replay_timeout_s=15.0)) as reader:
                tracker.accept(await join(reader, node))
                for _ in range(40):  # far ahead of what the new process sends while joined
                    await node.complete()
                tracker.accept((await reader.next()).seq)
                stop_processes(procs)
                procs.append(spawn_simnode(http, pub, replay, log))
                await healthy(node.url, procs[-1])
                first = await self._first_after_restart(reader, node, tracker)
                before = tracker.last
                stats = reader.feed.stats
        finally:
            stop_processes(procs)
        assert before is not None and before > 0
        assert first.seq == 0 and stats.restarts == 1

    @staticmethod
    async def _first_after_restart(
        reader: FeedReader, node: Node, tracker: SeqTracker
    ) -> KvMessage:
        """The first message the tracker reads as a restart. The old process's last batches
        may still be queued: they are read first, without a request each (probing once per
        queued batch made this slow enough to time out on a busy machine)."""
        async with asyncio.timeout(WAIT_S):
            while True:
                for msg in reader.drain_nowait() or [await reader.join(node.complete)]:
                    if tracker.classify(msg.seq) == "restart":
                        return msg
                    tracker.accept(msg.seq)


# -- the bridge --------------------------------------------------------------------------------


@pytest.fixture
async def nats_bus(nats_url: str, namespace: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_url, name="kv-bridge-test", namespace=namespace)
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.drain()
        admin = await Bus.connect(nats_url, name="kv-bridge-cleanup", namespace=namespace)
        await admin.delete_streams()
        await admin.drain()


async def kv_on_nats(bus: Bus, node: str) -> asyncio.Queue[tuple[bytes, Delivery]]:
    """A queue of what arrives on ``subjects.kv_events(node)`` (JetStream, from the start)."""
    queue: asyncio.Queue[tuple[bytes, Delivery]] = asyncio.Queue()

    async def handler(data: bytes, delivery: Delivery) -> None:
        await queue.put((data, delivery))

    await bus.consume(
        subjects.STREAM_KV,
        "kv-bridge-test",
        bytes,
        handler,
        filter_subject=subjects.kv_events(node),
        ephemeral=True,
    )
    return queue


PROBE = KVEventBatch(ts=0.0, events=[AllBlocksCleared()], data_parallel_rank=0)


async def joined(
    queue: asyncio.Queue[tuple[bytes, Delivery]], probe: Any
) -> tuple[bytes, Delivery]:
    """Probe until the bridge has forwarded something (the ZMQ subscription is in place)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            probe()
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(queue.get(), PROBE_EVERY_S * 5)


class TestBridge:
    """``tao kv-bridge``: ZMQ → NATS, payloads unchanged, gaps filled, seq in a header."""

    async def test_round_trip_with_gap(self, nats_bus: Bus, namespace: str) -> None:
        """Every batch reaches NATS once, in order, byte for byte, with seq and receive time."""
        pub_port, replay_port = free_port(), free_port()
        pub = KvPublisher(f"tcp://*:{pub_port}", f"tcp://*:{replay_port}", encoding="map")
        pub.start()
        feed = KvFeed("n1", f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
        ctx = ServiceContext("kv-bridge", Settings(), nats_bus, None, get_logger("test"))
        queue = await kv_on_nats(nats_bus, "n1")
        # An anyio cancel scope, as the service runner uses: its cancellation is re-delivered
        # at every await, so one swallowed by a library (asyncio.wait_for in Python 3.11 can
        # lose a cancel that races a result) cannot leave the bridge running.
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(bridge, feed, ctx)
                got, base, sent = await self._round_trip(pub, queue)
                tg.cancel_scope.cancel()
        finally:
            await pub.close()
        seqs = sorted(s for s in got if s >= base)
        assert seqs == list(range(base, base + 5))
        for seq in seqs:
            data, delivery = got[seq]
            assert len(decode_kv_batch(data).events) == sent[seq] + 1
            assert float(delivery.headers[KV_RECEIVED_AT_HEADER]) > 0
            assert delivery.subject == subjects.kv_events("n1")
        assert feed.stats.replays >= 1 and not feed.connected

    @staticmethod
    async def _round_trip(
        pub: KvPublisher, queue: asyncio.Queue[tuple[bytes, Delivery]]
    ) -> tuple[dict[int, tuple[bytes, Delivery]], int, dict[int, int]]:
        """Join, hide two batches, send five; what NATS got (by seq), the first seq, the sent."""
        await joined(queue, lambda: pub.publish_batch(PROBE))
        base = pub.next_seq
        pub.drop_next(2)
        sent: dict[int, int] = {}
        for i in range(5):
            batch = KVEventBatch(ts=float(i), events=[AllBlocksCleared()] * (i + 1))
            sent[pub.publish_batch(batch)] = i
        got: dict[int, tuple[bytes, Delivery]] = {}
        async with asyncio.timeout(WAIT_S):
            while base + 4 not in got:
                data, delivery = await queue.get()
                seq = int(delivery.headers[KV_SEQ_HEADER])
                assert seq not in got or seq < base  # nothing twice
                got[seq] = (data, delivery)
        return got, base, sent

    async def test_cli_forwards_and_stops_on_sigterm(self, nats_url: str, nats_bus: Bus) -> None:
        """The ``tao kv-bridge`` process forwards batches and exits 0 on SIGTERM."""
        pub_port, replay_port = free_port(), free_port()
        pub = KvPublisher(f"tcp://*:{pub_port}", f"tcp://*:{replay_port}")
        pub.start()
        queue = await kv_on_nats(nats_bus, "n2")
        env = {**os.environ, "TAO_NAMESPACE": nats_bus.namespace, "TAO_LOG_LEVEL": "warning"}
        env.pop("TAO_NODES_FILE", None)
        cmd = [sys.executable, "-m", "shared.cli.main", "kv-bridge", "--node", "n2"]
        cmd += ["--kv-events", f"tcp://127.0.0.1:{pub_port}"]
        cmd += ["--kv-replay", f"tcp://127.0.0.1:{replay_port}", "--nats", nats_url]
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
        try:

            def probe() -> None:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                pub.publish_batch(PROBE)

            data, delivery = await joined(queue, probe)
            assert decode_kv_batch(data).events == [AllBlocksCleared()]
            assert int(delivery.headers[KV_SEQ_HEADER]) >= 0
            proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(proc.wait, WAIT_S)
        finally:
            stop_processes([proc])
            await pub.close()
        assert code == 0


# -- end to end: sim node → telemetry (KvResidency) → inspect ------------------------------------


async def eventually(check: Any, what: str, probe: Any = None) -> Any:
    """Poll ``check()`` (async) until it returns something truthy; fail after ``WAIT_S``.
    ``probe()`` (async), when given, runs before each check (a request that makes the node
    publish, for a subscriber that may not have joined yet)."""
    last: Any = None
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                if probe is not None:
                    await probe()
                last = await check()
                if last:
                    return last
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what}: still {last!r} after {WAIT_S} s") from None


class TestTelemetryEndToEnd:
    """Sim node process → ZMQ → telemetry's KV index, read back with ``tao inspect``."""

    async def test_gap_restart_and_clear_reach_inspect(
        self, nats_url: str, redis_url: str, namespace: str, tmp_path: Path
    ) -> None:
        """A hidden batch is replayed into the index, AllBlocksCleared empties the node, and a
        restarted engine bumps the incarnation; ``tao inspect`` reports each."""
        import uuid

        import redis.asyncio as aioredis

        from services.telemetry import app as telemetry_app
        from shared.contracts.inspect import (
            NodeInspect,
            NodeQuery,
            PrefixInspect,
            PrefixQuery,
            decode_reply,
            encode_body,
        )
        from shared.infra import NodeSpec
        from shared.infra.runner import run_service_async
        from shared.infra.store import Store

        http, pub, replay = free_port(), free_port(), free_port()
        node = Node(f"http://127.0.0.1:{http}", pub, replay)
        log = tmp_path / "simnode.log"
        spec = NodeSpec(
            "sim1",
            node.url,
            kv_events=f"tcp://127.0.0.1:{pub}",
            kv_replay=f"tcp://127.0.0.1:{replay}",
        )
        settings = Settings(
            nats_url=nats_url,
            redis_url=redis_url,
            namespace=namespace,
            domain="d" + uuid.uuid4().hex[:12],
            nodes=(spec,),
            scrape_s=0.2,
            log_level="warning",
        )
        bus = await Bus.connect(nats_url, name="test", namespace=namespace)
        await bus.ensure_streams()
        client = aioredis.Redis.from_url(redis_url)

        async def node_view() -> NodeInspect:
            body = encode_body(NodeQuery("sim1"))
            return decode_reply(await bus.request(subjects.inspect("node"), body, 5), NodeInspect)

        async def prefix(tokens: list[int]) -> int:
            body = encode_body(PrefixQuery("sim1", tokens))
            reply = await bus.request(subjects.inspect("prefix"), body, 5)
            return decode_reply(reply, PrefixInspect).resident_prefix_tokens

        procs = [spawn_simnode(http, pub, replay, log)]
        telemetry = asyncio.create_task(
            run_service_async("telemetry", telemetry_app.main, settings=settings, needs_redis=True)
        )
        try:
            await healthy(node.url, procs[-1])
            # Telemetry's SUB joins some time after the node binds, and its catch-up replay may
            # already have shown what came before: probe until a batch newer than the catch-up
            # arrives (that takes a live one); from then on every batch arrives or is replayed.
            heard = await eventually(
                lambda: _when(node_view(), lambda v: v.seq is not None), "heard", node.complete
            )
            await eventually(
                lambda: _when(node_view(), lambda v: v.seq > heard.seq), "joined", node.complete
            )
            p1 = prompt(64)
            await node.complete(p1)
            await eventually(lambda: _equals(prefix(p1), 64), "p1 resident")
            before = await node_view()
            assert before.blocks >= 4 and before.resident_tokens == 16 * before.blocks

            # a batch hidden from the live stream reaches the index through the replay
            r = await node.post("/tao/debug/kv-drop?n=1")
            assert r.status == 200
            p2, p3 = prompt(64), prompt(64)
            await node.complete(p2)
            await node.complete(p3)
            await eventually(lambda: _equals(prefix(p3), 64), "p3 resident")
            assert await prefix(p2) == 64  # only the replay carried it
            mid = await node_view()
            assert mid.incarnation == before.incarnation and mid.seq is not None

            # vLLM's reset route: AllBlocksCleared empties the node
            r = await node.post("/reset_prefix_cache")
            assert r.headers["Tao-Reset"] == "cleared"
            cleared = await eventually(
                lambda: _when(node_view(), lambda v: v.blocks == 0), "node cleared"
            )
            assert cleared.resident_tokens == 0 and await prefix(p1) == 0

            # a restarted engine numbers from 0 again: a new incarnation
            p_old = prompt(64)
            await node.complete(p_old)
            await eventually(lambda: _equals(prefix(p_old), 64), "refilled")
            for _ in range(30):  # number far past what the restarted node sends while joining
                await node.complete()
            stop_processes(procs)
            procs.append(spawn_simnode(http, pub, replay, log))
            await healthy(node.url, procs[-1])
            after = await eventually(
                lambda: _when(node_view(), lambda v: v.incarnation == before.incarnation + 1),
                "incarnation bumped",
                node.complete,
            )
            p4 = prompt(64)
            await node.complete(p4)
            await eventually(lambda: _equals(prefix(p4), 64), "p4 resident")
            assert await prefix(p_old) == 0  # the old incarnation's blocks are gone
            assert after.node == "sim1"

            # the documented command, as an operator runs it
            env = {**os.environ, "TAO_NATS_URL": nats_url, "TAO_NAMESPACE": namespace}
            cmd = [sys.executable, "-m", "shared.cli.main", "inspect", "node", "sim1", "--json"]
            done = await asyncio.to_thread(
                subprocess.run, cmd, cwd=ROOT, env=env, capture_output=True, timeout=60
            )
            assert done.returncode == 0, done.stderr.decode()
            shown = msgspec.json.decode(done.stdout)
            assert set(shown) == set(NODE_KEYS)
            assert shown["incarnation"] == before.incarnation + 1 and shown["blocks"] > 0
        finally:
            telemetry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await telemetry
            stop_processes(procs)
            await bus.delete_streams()
            await bus.drain()
            await Store(client, settings.domain).clear()
            await client.aclose()


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _when(value: Any, predicate: Any) -> Any:
    got = await value
    return got if predicate(got) else None
