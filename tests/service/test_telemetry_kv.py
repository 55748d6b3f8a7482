"""Telemetry's KV-event residency (KvResidency) and inspection responder on FakeBus + FakeStore,
fed vLLM payloads built with encode_kv_batch."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

import anyio
import orjson

from services.telemetry.inspect import Inspector
from services.telemetry.kvresidency import KV_RECEIVED_AT_HEADER, KV_SEQ_HEADER, KvResidency
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.deadletter import DeadLetter
from shared.contracts.kv import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEncoding,
    KVEvent,
    KVEventBatch,
    encode_kv_batch,
)
from shared.contracts.session import SessionEnd, SessionResponse, Usage
from shared.core.blockkeys import chain_keys
from shared.infra.busapi import Delivery
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.settings import NodeSpec
from shared.infra.store_types import NodeUpdate
from tests.inspect_contract import NODE_KEYS

BS = 16
TOKENS = list(range(1000, 1000 + 4 * BS))  # 4 blocks
KEYS = chain_keys(TOKENS, BS)
TS = 1_000.0


def stored(hashes: list[BlockHash], parent: BlockHash | None, tokens: list[int]) -> BlockStored:
    return BlockStored(hashes, parent, tokens, BS, None, "GPU", None)


def payload(*events: KVEvent, ts: float = TS, encoding: KVEncoding = "mapev") -> bytes:
    return encode_kv_batch(KVEventBatch(ts=ts, events=list(events), data_parallel_rank=0), encoding)


def response(
    sid: str, node: str, *, keys: list[int] | None, finished_at: float = TS
) -> SessionResponse:
    return SessionResponse(
        session_id=sid,
        request_id="r1",
        node_id=node,
        gateway_id="gw",
        finished_at=finished_at,
        usage=Usage(prompt_tokens=100, completion_tokens=20, total_tokens=120),
        block_size=None if keys is None else BS,
        block_keys=keys,
    )


class Rig:
    """A started KvResidency on a FakeBus and FakeStore, with helpers to feed it."""

    def __init__(self, nodes: list[NodeSpec] | None = None, store: FakeStore | None = None) -> None:
        self.store = store or FakeStore()
        self.bus = FakeBus()
        self.kv = KvResidency(self.store, get_logger("test"), nodes or [], feeds=None)

    async def start(self) -> Rig:
        await self.kv.start(self.bus, "telemetry")
        return self

    async def bridged(self, node: str, seq: int, data: bytes, received_at: float = TS) -> None:
        headers = {KV_SEQ_HEADER: str(seq), KV_RECEIVED_AT_HEADER: repr(received_at)}
        await self.bus.publish(subjects.kv_events(node), data, headers)

    async def settle(self) -> dict[str, dict[str, tuple[int, float]]]:
        """Deliver everything, flush, and return the residency of sessions s1..s3."""
        await self.bus.settle()
        assert await self.kv.flush()
        return await self.store.residency(["s1", "s2", "s3"])


class TestBridgedPath:
    async def test_stores_make_a_registered_chain_resident(self) -> None:
        """Blocks stored on the bridged stream become the session's k0, stamped with ts."""
        rig = await Rig().start()
        await rig.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS])))
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        assert await rig.settle() == {"s1": {"n1": (2 * BS, TS)}, "s2": {}, "s3": {}}
        await rig.bridged("n1", 1, payload(stored([3], 2, TOKENS[2 * BS : 3 * BS]), ts=TS + 1))
        assert (await rig.settle())["s1"] == {"n1": (3 * BS, TS + 1)}
        await rig.bus.drain()

    async def test_gap_cannot_be_replayed_and_is_counted(self) -> None:
        """A missing seq on the NATS path is logged and counted; later batches still apply."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS])))
        await rig.bridged("n1", 2, payload(stored([2], 1, TOKENS[BS : 2 * BS])))
        assert (await rig.settle())["s1"] == {"n1": (2 * BS, TS)}
        assert rig.kv.counts["gaps_nats"] == 1
        stats = rig.kv.index.stats("n1")
        assert stats is not None and stats.seq == 2
        await rig.bus.drain()

    async def test_restart_clears_the_node_and_bumps_the_incarnation(self) -> None:
        """seq going backwards: the node's residency is dropped and a new incarnation starts."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS])))
        await rig.bridged("n2", 0, payload(stored([1], None, TOKENS[:BS])))
        assert (await rig.settle())["s1"] == {"n1": (2 * BS, TS), "n2": (BS, TS)}
        await rig.bridged("n1", 0, payload(stored([9], None, list(range(BS)))))
        assert (await rig.settle())["s1"] == {"n2": (BS, TS)}
        stats = rig.kv.index.stats("n1")
        assert stats is not None and (stats.incarnation, stats.seq, stats.blocks) == (1, 0, 1)
        assert rig.kv.counts["restarts"] == 1
        await rig.bus.drain()

    async def test_scraped_restart_clears_an_engine_that_never_published(self) -> None:
        """An engine restarted without publishing since (the scraper saw it) has no seq reset
        to notice: :meth:`KvResidency.engine_restarted` clears the node and starts a new
        incarnation, and the new engine's first batch (seq 0) is the next, not another reset."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS])))
        await rig.bridged("n1", 1, payload(stored([3], 2, TOKENS[2 * BS : 3 * BS])))
        await rig.bridged("n2", 0, payload(stored([1], None, TOKENS[:BS])))
        assert (await rig.settle())["s1"] == {"n1": (3 * BS, TS), "n2": (BS, TS)}
        assert await rig.kv.engine_restarted("n1", TS + 5, "counters went back")
        assert (await rig.settle())["s1"] == {"n2": (BS, TS)}
        stats = rig.kv.index.stats("n1")
        assert stats is not None and (stats.incarnation, stats.blocks) == (1, 0)
        await rig.bridged("n1", 0, payload(stored([7], None, TOKENS[:BS]), ts=TS + 60), TS + 60)
        assert (await rig.settle())["s1"] == {"n1": (BS, TS + 60), "n2": (BS, TS)}
        stats = rig.kv.index.stats("n1")
        assert stats is not None and (stats.incarnation, stats.seq) == (1, 0)
        assert (rig.kv.counts["restarts_scraped"], rig.kv.counts["restarts"]) == (1, 0)
        await rig.bus.drain()

    async def test_scraped_restart_after_a_seq_reset_keeps_the_new_engines_blocks(self) -> None:
        """A batch of the new engine (seq reset) received after the old engine's last good
        scrape already cleared the node: the scraper's report of the same restart clears
        nothing more, so the new engine's blocks stay."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS])), TS)
        await rig.bridged("n1", 1, payload(stored([3], 2, TOKENS[2 * BS : 3 * BS])), TS)
        await rig.bridged("n1", 0, payload(stored([5], None, TOKENS[:BS])), TS + 50)
        assert (await rig.settle())["s1"] == {"n1": (BS, TS + 50)}
        assert not await rig.kv.engine_restarted("n1", TS + 10, "start time changed")
        assert (await rig.settle())["s1"] == {"n1": (BS, TS + 50)}
        stats = rig.kv.index.stats("n1")
        assert stats is not None and stats.incarnation == 1
        # A later restart (reported after that reset) clears again.
        assert await rig.kv.engine_restarted("n1", TS + 60, "start time changed")
        assert (await rig.settle())["s1"] == {}
        await rig.bus.drain()

    async def test_all_blocks_cleared_drops_the_node(self) -> None:
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS])))
        assert (await rig.settle())["s1"] == {"n1": (2 * BS, TS)}
        await rig.bridged("n1", 1, payload(AllBlocksCleared()))
        assert (await rig.settle())["s1"] == {}
        stats = rig.kv.index.stats("n1")
        assert stats is not None and stats.blocks == 0 and stats.incarnation == 0
        await rig.bus.drain()

    async def test_bad_payload_is_dead_lettered_and_the_stream_goes_on(self) -> None:
        """A payload that is not a KVEventBatch goes to the DLQ with the decoder's reason."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, b"\xc1not msgpack")
        await rig.bridged("n1", 1, payload(stored([1], None, TOKENS[:BS])))
        assert (await rig.settle())["s1"] == {"n1": (BS, TS)}
        letters = [
            decode(d, DeadLetter)
            for s, d, _ in rig.bus.stream_messages(subjects.STREAM_DLQ)
            if s == subjects.dead_letter("telemetry")
        ]
        assert len(letters) == 1 and "vLLM KVEventBatch" in letters[0].reason
        await rig.bus.drain()

    async def test_missing_seq_header_is_counted_and_skipped(self) -> None:
        rig = await Rig().start()
        await rig.bus.publish(subjects.kv_events("n1"), payload(stored([1], None, TOKENS[:BS])))
        await rig.settle()
        assert rig.kv.counts["bad_seq"] == 1 and not rig.kv.index.has_node("n1")
        await rig.bus.drain()

    async def test_redelivered_old_seq_is_a_duplicate_not_a_restart(self) -> None:
        rig = Rig()
        batch = KVEventBatch(ts=TS, events=[stored([1], None, TOKENS[:BS])])
        for seq, num in ((0, 1), (1, 1), (1, 2)):
            d = Delivery(subjects.kv_events("n1"), {KV_SEQ_HEADER: str(seq)}, num, seq + 1, TS)
            await rig.kv.on_bridged([(batch, d)])
        stats = rig.kv.index.stats("n1")
        assert stats is not None and stats.incarnation == 0 and stats.blocks == 1
        assert rig.kv.counts["duplicates"] == 1

    async def test_engine_clock_far_off_uses_the_receive_time(self) -> None:
        """t_obs is the batch ts unless it is more than skew_s from the receive time."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS]), ts=TS - 3600), TS)
        assert (await rig.settle())["s1"] == {"n1": (BS, TS)}
        await rig.bridged("n1", 1, payload(stored([2], 1, TOKENS[BS : 2 * BS]), ts=TS + 2), TS)
        assert (await rig.settle())["s1"] == {"n1": (2 * BS, TS + 2)}
        await rig.bus.drain()


class TestUsageFallback:
    async def test_response_without_block_keys_uses_usage(self) -> None:
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=None))
        assert (await rig.settle())["s1"] == {"n1": (120, TS)}
        await rig.bus.drain()

    async def test_node_without_kv_events_uses_usage_and_other_nodes_use_the_chain(self) -> None:
        """Served on n2 (no KV events): usage there; the chain still matches on n1."""
        rig = await Rig().start()
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS])))
        await rig.bus.publish_msg(response("s1", "n2", keys=KEYS))
        assert (await rig.settle())["s1"] == {"n1": (BS, TS), "n2": (120, TS)}
        await rig.bus.drain()

    async def test_session_end_forgets_the_chain(self) -> None:
        """After SessionEnd the chain no longer follows the node's stores."""
        rig = await Rig().start()
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS])))
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        assert (await rig.settle())["s1"] == {"n1": (BS, TS)}
        await rig.bus.publish_msg(SessionEnd(session_id="s1", ended_at=TS))
        await rig.bridged("n1", 1, payload(stored([2], 1, TOKENS[BS : 2 * BS])))
        assert (await rig.settle())["s1"] == {"n1": (BS, TS)}
        assert rig.kv.index.sessions() == 0
        await rig.bus.drain()


class FlakyStore(FakeStore):
    """A FakeStore whose chain writes fail while ``down`` is set."""

    down = False

    async def put_chains(self, items: Iterable[tuple[str, int, Sequence[int], float]]) -> None:
        if self.down:
            raise ConnectionError("store down")
        await super().put_chains(items)


class TestChainsAcrossRestarts:
    async def test_a_restarted_telemetry_matches_stored_chains_without_a_new_response(
        self,
    ) -> None:
        """The chain outlives the process: after a restart the replayed KV stream makes the
        session resident again, though no response has arrived since."""
        store = FakeStore()
        first = await Rig(store=store).start()
        await first.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await first.settle()
        assert (await store.chains()).chains == [("s1", BS, KEYS, TS)]
        await first.bus.drain()

        second = await Rig(store=store).start()
        assert second.kv.counts["chains_restored"] == 1
        await second.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS]), ts=TS + 5))
        assert (await second.settle())["s1"] == {"n1": (2 * BS, TS + 5)}
        await second.bus.drain()

    async def test_without_the_stored_chain_a_restart_knows_nothing(self) -> None:
        """The control: the same replay on a store without the chain makes nothing resident."""
        second = await Rig().start()
        await second.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS]), ts=TS + 5))
        assert (await second.settle())["s1"] == {}
        await second.bus.drain()

    async def test_session_end_drops_the_stored_chain(self) -> None:
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bus.publish_msg(response("s2", "n1", keys=KEYS[:2]))
        await rig.settle()
        await rig.bus.publish_msg(SessionEnd(session_id="s1", ended_at=TS + 1))
        await rig.settle()
        assert [sid for sid, *_ in (await rig.store.chains()).chains] == ["s2"]
        await rig.bus.drain()

    async def test_an_older_response_does_not_replace_the_chain(self) -> None:
        """A redelivered response older than the chain held changes neither index nor store."""
        rig = await Rig().start()
        await rig.bridged("n1", 0, payload(stored([1, 2], None, TOKENS[: 2 * BS])))
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS, finished_at=TS + 2))
        assert (await rig.settle())["s1"] == {"n1": (2 * BS, TS + 2)}
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS[:1], finished_at=TS + 1))
        assert (await rig.settle())["s1"] == {"n1": (2 * BS, TS + 2)}
        assert rig.kv.counts["stale_chains"] == 1
        assert (await rig.store.chains()).chains == [("s1", BS, KEYS, TS + 2)]
        await rig.bus.drain()

    async def test_a_failed_chain_write_is_written_on_the_next_flush(self) -> None:
        """Store down for chains: the residency still lands; the chain waits and lands next."""
        store = FlakyStore()
        rig = await Rig(store=store).start()
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS])))
        store.down = True
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bus.settle()
        assert not await rig.kv.flush()
        assert (await store.residency(["s1"]))["s1"] == {"n1": (BS, TS)}
        assert (await store.chains()).chains == []
        store.down = False
        assert await rig.kv.flush()
        assert (await store.chains()).chains == [("s1", BS, KEYS, TS)]
        assert rig.kv.counts["chain_flush_failures"] == 1
        await rig.bus.drain()

    async def test_out_of_range_keys_fall_back_to_usage_and_block_nothing(self) -> None:
        """Keys a store cannot hold (negative, past 64 bits) are refused at the door: usage
        residency for that response, and other sessions' chains still get written."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=[1, -1]))
        await rig.bus.publish_msg(response("s2", "n1", keys=[2**64]))
        await rig.bus.publish_msg(response("s3", "n1", keys=KEYS))
        got = await rig.settle()
        assert got["s1"] == got["s2"] == {"n1": (120, TS)}
        assert rig.kv.counts["bad_chains"] == 2
        assert [sid for sid, *_ in (await rig.store.chains()).chains] == ["s3"]
        await rig.bus.drain()

    async def test_a_response_processed_after_the_end_does_not_bring_the_chain_back(
        self,
    ) -> None:
        """Ends and responses come on separate consumers: a response of before the end that
        is handled after it is ignored; a later response (the id used again) is not."""
        rig = await Rig().start()
        await rig.bus.publish_msg(SessionEnd(session_id="s1", ended_at=TS + 5))
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS, finished_at=TS + 4))
        await rig.settle()
        assert rig.kv.counts["after_end"] == 1
        assert (await rig.store.chains()).chains == []
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS, finished_at=TS + 6))
        await rig.settle()
        assert (await rig.store.chains()).chains == [("s1", BS, KEYS, TS + 6)]
        await rig.bus.drain()

    async def test_a_failed_chain_write_is_kept_and_newer_news_wins(self) -> None:
        """Store down: the chains stay queued; a newer chain and an end that came meanwhile win
        over what the failed flush held."""
        store = FlakyStore()
        rig = await Rig(store=store).start()
        store.down = True
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS[:2]))
        await rig.bus.publish_msg(response("s2", "n1", keys=KEYS))
        await rig.bus.settle()
        assert not await rig.kv.flush()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS, finished_at=TS + 1))
        await rig.bus.publish_msg(SessionEnd(session_id="s2", ended_at=TS + 1))
        await rig.bus.settle()
        store.down = False
        assert await rig.kv.flush()
        assert (await store.chains()).chains == [("s1", BS, KEYS, TS + 1)]
        await rig.bus.drain()


@dataclass(frozen=True)
class Msg:
    node: str
    seq: int
    payload: bytes
    received_at: float
    replayed: bool = False


class TestZmqPath:
    async def test_feed_messages_are_applied_and_a_bad_payload_advances_the_seq(self) -> None:
        """The ZMQ feed path: a bad payload is counted (not a gap), the stream goes on."""
        done = asyncio.Event()
        msgs = [
            Msg("n1", 0, payload(stored([1], None, TOKENS[:BS]), encoding="legacy"), TS),
            Msg("n1", 1, b"\x92\x01", TS),  # an array, but not a batch
            Msg("n1", 2, payload(stored([2], 1, TOKENS[BS : 2 * BS]), encoding="map"), TS),
        ]

        async def feed(spec: NodeSpec) -> AsyncIterator[Msg]:
            for m in msgs:
                yield m
            done.set()
            await anyio.sleep_forever()

        store, bus = FakeStore(), FakeBus()
        nodes = [NodeSpec("n1", "http://n1", kv_events="tcp://127.0.0.1:1")]
        kv = KvResidency(store, get_logger("test"), nodes, feeds=feed)  # type: ignore[arg-type]
        await kv.start(bus, "telemetry")
        await bus.publish_msg(response("s1", "n1", keys=KEYS))
        await bus.settle()
        async with anyio.create_task_group() as tg:
            tg.start_soon(kv.run)
            await done.wait()
            tg.cancel_scope.cancel()
        assert await kv.flush()
        assert await store.residency(["s1"]) == {"s1": {"n1": (2 * BS, TS)}}
        assert kv.counts["bad_payloads"] == 1 and kv.counts["gaps_zmq"] == 0
        await bus.drain()

    async def test_a_node_claimed_by_zmq_ignores_the_bridge(self) -> None:
        """Both paths carry the same seq: while ZMQ is live, bridged copies are ignored."""
        now = [0.0]
        rig = Rig()
        rig.kv.monotonic = lambda: now[0]
        await rig.kv.start(rig.bus, "telemetry")
        rig.kv.on_zmq(Msg("n1", 0, payload(stored([1], None, TOKENS[:BS])), TS))
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS])))
        await rig.settle()
        assert rig.kv.counts["ignored_nats"] == 1 and rig.kv.index.resident("n1", KEYS[0]) == 1
        now[0] = 10.0  # ZMQ silent past path_idle_s: the bridge takes over, same sequence
        await rig.bridged("n1", 1, payload(stored([2], 1, TOKENS[BS : 2 * BS])))
        await rig.settle()
        assert rig.kv.counts["path_switches"] == 1 and rig.kv.index.walk("n1", KEYS) == 2
        await rig.bus.drain()


class TestEvidence:
    """Each configured node's KV-event evidence in its record: ``kv_since`` (complete since)
    and ``kv_until`` (its latest batch), what the valuation confirms credit by."""

    async def _rig(self) -> tuple[Rig, list[float]]:
        now = [0.0]
        rig = Rig([NodeSpec("n1", "http://n1")])
        rig.kv.monotonic = lambda: now[0]
        await rig.start()
        return rig, now

    async def _evidence(self, rig: Rig) -> tuple[float | None, float | None]:
        rec = await rig.store.get_node("n1")
        assert rec is not None
        return rec.kv_since, rec.kv_until

    async def test_a_healthy_stream_writes_its_latest_batch(self) -> None:
        """The first batch writes both; later ones move kv_until, at most every evidence_s
        (the flush after it writes the held-back one); an unconfigured node gets none."""
        rig, now = await self._rig()
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS]), ts=TS))
        await rig.bridged("n9", 0, payload(stored([1], None, TOKENS[:BS]), ts=TS))
        await rig.settle()
        assert await self._evidence(rig) == (TS, TS)
        assert await rig.store.get_node("n9") is None
        await rig.bridged("n1", 1, payload(ts=TS + 1))
        await rig.settle()
        assert await self._evidence(rig) == (TS, TS)  # written 0 s ago: held back
        assert rig.kv._evidence_pending()
        now[0] += rig.kv.evidence_s
        await rig.settle()
        assert await self._evidence(rig) == (TS, TS + 1)
        assert not rig.kv._evidence_pending()
        await rig.bus.drain()

    async def test_a_gap_moves_kv_since_at_once(self) -> None:
        rig, _ = await self._rig()
        await rig.bridged("n1", 0, payload(ts=TS))
        await rig.bridged("n1", 3, payload(ts=TS + 2))  # 1 and 2 lost
        await rig.settle()
        assert await self._evidence(rig) == (TS + 2, TS + 2)
        await rig.bus.drain()

    async def test_a_usage_observation_is_not_confirmed(self) -> None:
        """A response on n1 without block keys is written from usage: kv_since moves past it,
        so the stream never confirms it; the next batch confirms what comes after."""
        rig, now = await self._rig()
        await rig.bridged("n1", 0, payload(ts=TS))
        await rig.bus.publish_msg(response("s1", "n1", keys=None, finished_at=TS + 1))
        assert (await rig.settle())["s1"] == {"n1": (120, TS + 1)}
        since, until = await self._evidence(rig)
        assert since is not None and until == TS and TS + 1 < since < TS + 1.001
        await rig.bridged("n1", 1, payload(ts=TS + 5))
        now[0] += rig.kv.evidence_s
        await rig.settle()
        assert await self._evidence(rig) == (since, TS + 5)
        await rig.bus.drain()

    async def test_a_failed_request_keeps_the_evidence(self) -> None:
        """An error response on n1 writes no residency, so it leaves n1's evidence alone (it
        used to move kv_since past it, unconfirming every session on the node)."""
        import msgspec

        rig, _ = await self._rig()
        await rig.bridged("n1", 0, payload(ts=TS))
        failed = msgspec.structs.replace(
            response("s1", "n1", keys=None, finished_at=TS + 1), error="node_error"
        )
        await rig.bus.publish_msg(failed)
        assert not (await rig.settle()).get("s1")
        assert await self._evidence(rig) == (TS, TS)
        await rig.bus.drain()

    async def test_the_flusher_writes_a_held_back_kv_until(self) -> None:
        """No batch after the one held back: the flusher still writes it once it is due."""
        rig = Rig([NodeSpec("n1", "http://n1")])
        rig.kv.evidence_s = 0.05
        await rig.start()
        async with anyio.create_task_group() as tg:
            tg.start_soon(rig.kv.run)
            await rig.bridged("n1", 0, payload(ts=TS))
            await rig.bridged("n1", 1, payload(ts=TS + 1))
            await rig.bus.settle()
            with anyio.fail_after(5):
                while True:
                    rec = await rig.store.get_node("n1")
                    if rec is not None and (rec.kv_since, rec.kv_until) == (TS, TS + 1):
                        break
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        await rig.bus.drain()


class TestInspector:
    async def test_node_and_prefix_replies(self) -> None:
        """inspect.node has exactly the documented keys; inspect.prefix walks the tokens."""
        rig = await Rig([NodeSpec("n1", "http://n1", capacity_tokens=4096)]).start()
        await Inspector(
            rig.kv.index, rig.store, [NodeSpec("n1", "http://n1", capacity_tokens=4096)]
        ).start(rig.bus, "telemetry")
        await rig.store.put_node_status("n1", NodeUpdate(healthy=True, capacity_tokens=16_000))
        await rig.bridged("n1", 0, payload(stored([1, 2, 3], None, TOKENS[: 3 * BS])))
        await rig.bridged("n1", 1, payload(BlockRemoved([3], "GPU")))
        await rig.settle()
        node = orjson.loads(await rig.bus.request(subjects.inspect("node"), b'{"node":"n1"}', 1.0))
        assert node == {
            "node": "n1",
            "blocks": 2,
            "resident_tokens": 2 * BS,
            "seq": 1,
            "incarnation": 0,
            "healthy": True,
            "capacity_tokens": 4096,
            "host_blocks": 0,
            "host_resident_tokens": 0,
        }
        assert list(node) == NODE_KEYS
        ask = orjson.dumps({"node": "n1", "tokens": [*TOKENS, 1, 2, 3]})
        prefix = orjson.loads(await rig.bus.request(subjects.inspect("prefix"), ask, 1.0))
        assert prefix == {"resident_prefix_tokens": 2 * BS, "host_prefix_tokens": 0}
        await rig.bus.drain()

    async def test_unknown_node_and_bad_request_get_an_error_reply(self) -> None:
        rig = await Rig().start()
        await Inspector(rig.kv.index, rig.store, []).start(rig.bus, "telemetry")
        reply = orjson.loads(await rig.bus.request(subjects.inspect("node"), b'{"node":"zz"}', 1.0))
        assert reply == {"error": "unknown node 'zz'"}
        bad = orjson.loads(await rig.bus.request(subjects.inspect("prefix"), b'{"node":1}', 1.0))
        assert "error" in bad and "PrefixQuery" in bad["error"]
        await rig.bus.drain()
