"""KV events over real ZMQ sockets: the sim node's publisher (vLLM's wire) → :class:`KvFeed`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from services.simnode.__main__ import parse_config
from services.simnode.kvpub import KvPublisher, binds
from shared.contracts.frames import encode_seq, replay_request
from shared.contracts.kv import (
    KV_ENCODINGS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEncoding,
    KVEventBatch,
    decode_kv_batch,
    encode_kv_batch,
)
from shared.core.blockkeys import chain_keys
from shared.core.engine import DEFAULT_PROFILE, PROFILES, Engine, EngineRequest
from shared.core.kvseq import SeqTracker
from shared.infra.embedded import free_port
from shared.infra.kvzmq import DRAIN_MAX, KvFeed, KvMessage, KvReplayError, bridge_headers
from tests.kvzmq_util import FeedReader, reading

PROFILE = PROFILES[DEFAULT_PROFILE]
PROBE = KVEventBatch(ts=0.0, events=[AllBlocksCleared()], data_parallel_rank=0)


def store(tokens: list[int], h: int = 1, parent: int | None = None) -> BlockStored:
    return BlockStored([h], parent, tokens, len(tokens), None, "GPU")


class Ports:
    def __init__(self) -> None:
        self.pub = free_port()
        self.replay = free_port()

    def publisher(self, **kw: object) -> KvPublisher:
        return KvPublisher(f"tcp://*:{self.pub}", f"tcp://*:{self.replay}", **kw)  # type: ignore[arg-type]

    def feed(self, *, replay: bool = True, **kw: object) -> KvFeed:
        return KvFeed(
            "n1",
            f"tcp://127.0.0.1:{self.pub}",
            f"tcp://127.0.0.1:{self.replay}" if replay else None,
            **kw,  # type: ignore[arg-type]
        )


@pytest.fixture
def ports() -> Ports:
    return Ports()


@pytest.fixture
async def pub(ports: Ports) -> AsyncIterator[KvPublisher]:
    p = ports.publisher()
    p.start()
    yield p
    await p.close()


async def joined(reader: FeedReader, pub: KvPublisher) -> int:
    """Join the stream; the seq from which every publication is seen."""
    await reader.join(lambda: pub.publish_batch(PROBE))
    return pub.next_seq


def engine_events(engine: Engine, prompt_tokens: int, rid: str = "r1") -> list[object]:
    prompt = [(i * 7 + 3) % 5000 for i in range(prompt_tokens)]
    engine.submit(EngineRequest(rid, "s1", prompt, 4, None), 0.0)
    engine.advance(float("inf"))
    return list(engine.drain_kv_events())


class TestPublisherWire:
    """The publisher speaks vLLM's format: hashes, merged stores, encodings, bind rule."""

    def test_binds_like_vllm(self) -> None:
        """A wildcard, IPv6 or ipc/inproc endpoint is bound; a host endpoint is connected."""
        assert binds("tcp://*:5557") and binds("ipc:///tmp/x") and binds("tcp://[::]:1")
        assert not binds("tcp://127.0.0.1:5557")

    @pytest.mark.parametrize("kind", ["int", "bytes"])
    def test_hashes_are_seeded_and_not_tao_keys(self, kind: str) -> None:
        """Published hashes depend on the per-process seed and are not TAO's block keys."""
        a = KvPublisher("tcp://*:1", hash_kind=kind)  # type: ignore[arg-type]
        b = KvPublisher("tcp://*:1", hash_kind=kind)  # type: ignore[arg-type]
        h = a.wire_hash(12345)
        assert h == a.wire_hash(12345) != b.wire_hash(12345)
        if kind == "int":
            assert isinstance(h, int) and 0 <= h < 2**64
        else:
            assert isinstance(h, bytes) and len(h) == 32
        assert h not in chain_keys(list(range(16)), 16)

    def test_chained_stores_merge_into_one_event(self) -> None:
        """The engine's per-block stores of one chain become one BlockStored, as vLLM sends."""
        engine = Engine("n", PROFILE, emit_kv_events=True)
        bs = engine.block_size
        events = engine_events(engine, 3 * bs + 1)
        p = KvPublisher("tcp://*:1", seed=b"s")
        wire = p.to_wire(events)  # type: ignore[arg-type]
        stores = [e for e in wire if isinstance(e, BlockStored)]
        assert stores and stores[0].parent_block_hash is None
        first = stores[0]
        assert len(first.block_hashes) >= 3
        assert len(first.token_ids) == len(first.block_hashes) * bs
        assert first.medium == "GPU" and first.group_idx == 0
        assert first.kv_cache_spec_kind == "full_attention"

    def test_removed_and_cleared(self) -> None:
        """Removals carry the published hash of the stored block; a clear stays a clear."""
        p = KvPublisher("tcp://*:1", encoding="legacy", seed=b"s")
        wire = p.to_wire([store([1, 2], h=7), BlockRemoved([7], "GPU"), AllBlocksCleared()])
        assert isinstance(wire[1], BlockRemoved)
        assert wire[1].block_hashes == wire[0].block_hashes  # type: ignore[union-attr]
        assert wire[1].group_idx is None  # legacy vLLM had no groups
        assert wire[2] == AllBlocksCleared()

    def test_reset_prefix_cache_emits_all_blocks_cleared(self) -> None:
        """The engine's reset drops every cached block and reports one AllBlocksCleared."""
        engine = Engine("n", PROFILE, emit_kv_events=True)
        engine_events(engine, 4 * engine.block_size)
        cached, mark = engine.kv_cached_blocks, engine.evicted_blocks
        assert cached > 0
        assert engine.reset_prefix_cache(1e9)
        assert engine.kv_cached_blocks == 0
        assert engine.drain_kv_events() == [AllBlocksCleared()]
        gone = engine.evicted_since(mark)  # callers' resident-prefix shortcuts see the reset
        assert gone is not None and len(gone) == cached
        engine.pool.check()

    def test_reset_is_refused_while_blocks_are_held(self) -> None:
        """A running request holds blocks: the reset is refused and nothing is emitted."""
        engine = Engine("n", PROFILE, emit_kv_events=True)
        engine.submit(EngineRequest("r", "s", list(range(64)), 500, None), 0.0)
        engine.advance(1e-3)
        engine.drain_kv_events()
        assert engine.running == 1
        assert not engine.reset_prefix_cache(1e-3)
        assert AllBlocksCleared() not in engine.drain_kv_events()


class TestFeedOrder:
    """Live batches arrive in order, once, with seq, payload and receive time."""

    async def test_ordered_delivery(self, ports: Ports, pub: KvPublisher) -> None:
        """Twenty published batches are yielded in seq order with their exact payloads."""
        async with reading(ports.feed()) as reader:
            base = await joined(reader, pub)
            sent = {pub.publish([store([i] * 4, h=i)]): i for i in range(20)}
            got = [m for m in await reader.until(base + 19) if m.seq >= base]
            assert reader.feed.connected
        assert not reader.feed.connected  # cancelling the iteration closed the sockets
        assert [m.seq for m in got] == sorted(sent)
        assert not any(m.replayed for m in got)
        for m in got:
            batch = decode_kv_batch(m.payload)
            event = batch.events[0]
            assert isinstance(event, BlockStored) and event.token_ids == [sent[m.seq]] * 4
            assert m.node == "n1" and m.received_at > 0

    async def test_pre_encoded_batches_go_out_as_they_are(
        self, ports: Ports, pub: KvPublisher
    ) -> None:
        """publish_payload numbers and sends an encoded batch byte for byte (what
        benchmarks/telemetry_throughput.py sends), in order with publish_batch's."""
        payloads = [encode_kv_batch(KVEventBatch(ts=float(i), events=[]), "mapev") for i in (1, 2)]
        async with reading(ports.feed()) as reader:
            base = await joined(reader, pub)
            seqs = [pub.publish_payload(payloads[0]), pub.publish_batch(PROBE)]
            seqs.append(pub.publish_payload(payloads[1]))
            got = [m for m in await reader.until(base + 2) if m.seq >= base]
        assert seqs == [base, base + 1, base + 2]
        assert [m.payload for m in got] == [payloads[0], got[1].payload, payloads[1]]
        assert decode_kv_batch(got[1].payload) == PROBE

    async def test_a_burst_is_read_in_order_past_the_drain(
        self, ports: Ports, pub: KvPublisher
    ) -> None:
        """More batches at once than one awaited read drains (DRAIN_MAX) come out in order,
        each once, none replayed, with receive times that never go back."""
        n = DRAIN_MAX * 2 + 7
        async with reading(ports.feed()) as reader:
            base = await joined(reader, pub)
            for i in range(n):
                pub.publish([store([i % 50] * 4, h=i + 1)])
            got = [m for m in await reader.until(base + n - 1) if m.seq >= base]
            stats = reader.feed.stats
        assert [m.seq for m in got] == list(range(base, base + n))
        assert not any(m.replayed for m in got) and stats.duplicates == 0
        times = [m.received_at for m in got]
        assert times == sorted(times)

    async def test_bridge_headers(self) -> None:
        """The bridge's headers carry seq and receive time as text."""
        headers = bridge_headers(KvMessage("n", 42, b"x", 1.5, False))
        assert headers == {"Tao-KV-Seq": "42", "Tao-Received-At": "1.5"}


class TestGapReplay:
    """A gap is filled from the replay socket; overlap with live is dropped."""

    async def test_forced_gap_recovered_by_replay(self, ports: Ports, pub: KvPublisher) -> None:
        """Three batches not sent live come back replayed, in order, with no duplicates."""
        async with reading(ports.feed()) as reader:
            base = await joined(reader, pub)
            pub.drop_next(3)
            for i in range(6):
                pub.publish([store([i] * 4, h=i)])
            got = [m for m in await reader.until(base + 5) if m.seq >= base]
            stats = reader.feed.stats
        assert [m.seq for m in got] == list(range(base, base + 6))
        assert [m.replayed for m in got[:3]] == [True, True, True]
        assert stats.replays == 1 and stats.unrecovered_gaps == 0 and stats.lost == 0
        assert stats.duplicates >= 1  # at least the live message that showed the gap

    async def test_gap_without_replay_socket_goes_on(self, ports: Ports, pub: KvPublisher) -> None:
        """With no replay endpoint the gap is counted as lost and the stream goes on."""
        async with reading(ports.feed(replay=False)) as reader:
            base = await joined(reader, pub)
            pub.drop_next(2)
            for i in range(3):
                pub.publish([store([i] * 4, h=i)])
            got = [m for m in await reader.until(base + 2) if m.seq >= base]
            stats = reader.feed.stats
        assert [m.seq for m in got] == [base + 2]
        assert stats.unrecovered_gaps == 1 and stats.lost == 2

    async def test_replay_that_never_answers_goes_on(self, ports: Ports) -> None:
        """A replay endpoint nobody serves times out; the gap is lost, the stream goes on."""
        p = KvPublisher(f"tcp://*:{ports.pub}")  # no replay socket
        p.start()
        try:
            async with reading(ports.feed(replay_timeout_s=0.2)) as reader:
                base = await joined(reader, p)
                p.drop_next(1)
                p.publish([store([1] * 4)])
                p.publish([store([2] * 4)])
                got = [m for m in await reader.until(base + 1) if m.seq >= base]
                stats = reader.feed.stats
        finally:
            await p.close()
        assert [m.seq for m in got] == [base + 1]
        assert stats.unrecovered_gaps == 1 and stats.lost == 1 and stats.reconnects == 1

    async def test_buffer_too_short_loses_the_oldest(self, ports: Ports) -> None:
        """A replay buffer that no longer reaches back returns what it has; the rest is lost."""
        p = ports.publisher(buffer_steps=2)
        p.start()
        try:
            async with reading(ports.feed()) as reader:
                base = await joined(reader, p)
                p.drop_next(4)
                for i in range(5):
                    p.publish([store([i] * 4, h=i)])
                got = [m for m in await reader.until(base + 4) if m.seq >= base]
                stats = reader.feed.stats
        finally:
            await p.close()
        assert [m.seq for m in got] == [base + 3, base + 4]
        assert got[0].replayed
        assert stats.unrecovered_gaps == 1 and stats.lost == 3

    async def test_replay_from_zero(self, ports: Ports, pub: KvPublisher) -> None:
        """replay_from(0) returns every buffered batch, marked replayed."""
        for i in range(5):
            pub.publish([store([i] * 4, h=i)])
        feed = ports.feed()
        try:
            got = await feed.replay_from(0)
            tail = await feed.replay_from(3)
        finally:
            feed.close()
        assert [m.seq for m in got] == [0, 1, 2, 3, 4] and all(m.replayed for m in got)
        assert [m.seq for m in tail] == [3, 4]

    async def test_truncated_replay_is_asked_again(self, ports: Ports) -> None:
        """An answer that stops without its end marker (a ROUTER drops what does not fit in
        the pipe) is asked for again from after its last batch, until the marker comes. The
        answers here have the older three-frame shape (no topic), which is still read."""
        router = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        router.bind(f"tcp://*:{ports.replay}")
        payload = b"\x93\xcb?\xf0\x00\x00\x00\x00\x00\x00\x90\x00"
        starts: list[int] = []

        async def serve() -> None:  # at most 3 batches per answer; the end marker only at 6
            while True:
                client, _, start = await router.recv_multipart()
                first = int.from_bytes(start, "big")
                starts.append(first)
                for seq in range(first, min(first + 3, 6)):
                    await router.send_multipart([client, b"", encode_seq(seq), payload])
                if first + 3 >= 6:
                    await router.send_multipart([client, b"", encode_seq(-1), b""])

        task = asyncio.create_task(serve())
        feed = ports.feed()
        try:
            got = await feed.replay_from(0)
        finally:
            feed.close()
            task.cancel()
            router.close(linger=0)
        assert [m.seq for m in got] == [0, 1, 2, 3, 4, 5]
        assert starts == [0, 3] and feed.stats.truncated_replays == 1

    async def test_replay_from_without_endpoint_raises(self, ports: Ports) -> None:
        """Without a replay endpoint replay_from says so."""
        with pytest.raises(KvReplayError, match="no replay endpoint"):
            await ports.feed(replay=False).replay_from(0)

    async def test_catch_up_replays_history_first(self, ports: Ports, pub: KvPublisher) -> None:
        """catch_up yields what the publisher buffered before the feed started, then live."""
        for i in range(4):
            pub.publish([store([i] * 4, h=i)])
        async with reading(ports.feed(catch_up=True)) as reader:
            first = [await reader.next() for _ in range(4)]
            await reader.join(lambda: pub.publish_batch(PROBE))
            base = pub.next_seq
            pub.publish([store([9] * 4, h=9)])
            rest = await reader.until(base)
        assert [m.seq for m in first] == [0, 1, 2, 3] and all(m.replayed for m in first)
        seqs = [m.seq for m in first + rest]
        assert seqs == sorted(set(seqs))  # in order, nothing twice


class TestRestart:
    """A new publisher on the same ports numbers from 0 again: seq goes backwards."""

    @pytest.mark.parametrize("with_replay", [True, False])
    async def test_restart_is_yielded_as_backwards_seq(
        self, ports: Ports, with_replay: bool
    ) -> None:
        """After a restart the feed yields the new incarnation's batches (from 0 with replay)."""
        old = ports.publisher()
        old.start()
        feed = ports.feed(replay=with_replay)
        tracker = SeqTracker()
        async with reading(feed) as reader:
            await reader.join(lambda: old.publish_batch(PROBE))
            for _ in range(200):  # far ahead of what the new one sends while it is joined
                old.publish_batch(PROBE)
            for m in await reader.until(old.next_seq - 1):
                tracker.accept(m.seq)
            await old.close()
            new = ports.publisher()
            new.start()
            try:
                first = await reader.join(lambda: new.publish([store([5] * 4)]))
            finally:
                await new.close()
        assert tracker.classify(first.seq) == "restart"
        assert feed.stats.restarts == 1
        if with_replay:
            assert first.seq == 0  # what the slow joiner missed was replayed from 0

    async def test_restart_numbered_past_last_is_recognised(self, ports: Ports) -> None:
        """A new publisher already past the old seq reads as a gap, but its batch at the old
        seq differs: the feed treats it as a restart and yields the new one from 0."""
        old = ports.publisher()
        old.start()
        feed = ports.feed()
        async with reading(feed) as reader:
            await reader.join(lambda: old.publish_batch(PROBE))
            for i in range(3):
                old.publish_batch(KVEventBatch(ts=float(i), events=[]))
            last = (await reader.until(old.next_seq - 1))[-1].seq
            await old.close()
            new = ports.publisher()
            new.start()
            try:
                for i in range(last + 50):  # sent before the feed has reconnected: lost
                    new.publish_batch(KVEventBatch(ts=1000.0 + i, events=[]))
                first = await reader.join(lambda: new.publish_batch(PROBE))
            finally:
                await new.close()
        assert first.seq == 0 and first.replayed
        assert feed.stats.restarts == 1


class TestBadFrames:
    """Malformed messages are skipped and counted with a reason; the stream goes on."""

    async def test_bad_frames_skipped(self, ports: Ports) -> None:
        """Wrong frame count, short seq and empty payload are skipped; a good one follows."""
        ctx = zmq.asyncio.Context.instance()
        raw = ctx.socket(zmq.PUB)
        raw.bind(f"tcp://*:{ports.pub}")
        good = [b"", encode_seq(0), b"\x93\xcb?\xf0\x00\x00\x00\x00\x00\x00\x90\x00"]
        try:
            async with reading(ports.feed(replay=False)) as reader:
                await reader.join(lambda: raw.send_multipart(good))
                await raw.send_multipart([b"", encode_seq(1)])
                await raw.send_multipart([b"", b"\x00\x01", b"x"])
                await raw.send_multipart([b"", encode_seq(1), b""])
                await raw.send_multipart([b"", encode_seq(1), good[2]])
                msg = await reader.until(1)
                stats = reader.feed.stats
        finally:
            raw.close(linger=0)
        assert msg[-1].seq == 1
        assert stats.bad_frames == 3 and len(stats.bad_frame_reasons) == 3

    async def test_bad_replay_request_is_ignored(self, ports: Ports, pub: KvPublisher) -> None:
        """The replay ROUTER ignores a request of the wrong shape and answers the next one."""
        pub.publish_batch(PROBE)
        dealer = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{ports.replay}")
        try:
            await dealer.send_multipart([b"", b"a", b"b"])
            await dealer.send_multipart(replay_request(0))
            frames = await asyncio.wait_for(dealer.recv_multipart(), 10)
            end = await asyncio.wait_for(dealer.recv_multipart(), 10)
        finally:
            dealer.close(linger=0)
        assert frames[:3] == [b"", pub.topic, encode_seq(0)]  # vLLM 0.32: the topic frame
        assert end == [b"", b"", b"\xff" * 8, b""]


class TestEncodings:
    """Each of vLLM's three encodings, with int or bytes hashes, decodes on the other side."""

    @pytest.mark.parametrize("encoding", KV_ENCODINGS)
    @pytest.mark.parametrize("kind", ["int", "bytes"])
    async def test_engine_events_decode(
        self, ports: Ports, encoding: KVEncoding, kind: str
    ) -> None:
        """Engine stores and a clear, published in ``encoding``, decode to the same events."""
        p = ports.publisher(encoding=encoding, hash_kind=kind)
        p.start()
        engine = Engine("n", PROFILE, emit_kv_events=True)
        events = engine_events(engine, 2 * engine.block_size)
        try:
            async with reading(ports.feed()) as reader:
                base = await joined(reader, p)
                p.publish(events)  # type: ignore[arg-type]
                p.publish([AllBlocksCleared()])
                got = [m for m in await reader.until(base + 1) if m.seq >= base]
        finally:
            await p.close()
        stored = decode_kv_batch(got[0].payload)
        head = got[0].payload[0]
        assert (head >> 4 == 0x8) == (encoding == "map")
        ev = stored.events[0]
        assert isinstance(ev, BlockStored)
        assert isinstance(ev.block_hashes[0], int if kind == "int" else bytes)
        tokens = [t for e in events if isinstance(e, BlockStored) for t in e.token_ids]
        assert ev.token_ids == tokens
        assert decode_kv_batch(got[1].payload).events == [AllBlocksCleared()]


class TestSimNodeArguments:
    """The sim node's KV options: each encoding and hash kind, and one-line refusals."""

    @pytest.mark.parametrize("encoding", KV_ENCODINGS)
    def test_every_encoding_is_offered(self, encoding: str) -> None:
        """--kv-encoding accepts each of vLLM's three encodings."""
        argv = ["--port", "1", "--node-id", "n", "--kv-events", "tcp://*:1"]
        config, _, _ = parse_config([*argv, "--kv-encoding", encoding, "--kv-hash", "bytes"])
        assert (config.kv_encoding, config.kv_hash) == (encoding, "bytes")

    @pytest.mark.parametrize(
        ("extra", "says"),
        [
            (["--kv-replay", "tcp://*:2"], "--kv-replay: needs --kv-events"),
            (["--kv-events", "5557"], "--kv-events: must be a ZMQ endpoint"),
            (["--kv-events", "tcp://*:1", "--kv-buffer-steps", "0"], "--kv-buffer-steps"),
            (["--host-kv", "-2"], "--host-kv: host KV factor: must be finite and >= 0"),
            (["--host-kv", "nan"], "--host-kv: host KV factor"),
        ],
    )
    def test_bad_options(
        self, extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A bad KV option exits 2 with one line naming it."""
        with pytest.raises(SystemExit) as exc:
            parse_config(["--port", "1", "--node-id", "n", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and len(err) == 1 and says in err[0]
