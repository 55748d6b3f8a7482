"""KvResidency: a reopened ZMQ feed is not an engine restart; a bad receive-time header is not
believed."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import pytest

from services.telemetry import kvresidency
from services.telemetry.kvresidency import KvResidency
from shared.contracts import subjects
from shared.contracts.kv import BlockStored, KVEventBatch, encode_kv_batch
from shared.core.blockkeys import chain_keys
from shared.core.tiers import CPU
from shared.infra.busapi import Delivery
from shared.infra.fake_store import FakeStore
from shared.infra.logging import get_logger
from shared.infra.settings import NodeSpec

BS = 16
TOKENS = list(range(1000, 1000 + 4 * BS))
KEYS = chain_keys(TOKENS, BS)
TS = 1_000.0
NODES = [NodeSpec("n1", "http://n1", kv_events="tcp://127.0.0.1:1")]


@dataclass(frozen=True)
class Msg:
    node: str
    seq: int
    payload: bytes
    received_at: float
    replayed: bool = False


def block(i: int, ts: float = TS, host: bool = False) -> bytes:
    """Batch storing block ``i`` (0-based) of TOKENS, child of block ``i - 1``; with ``host``
    its host-tier copy too, announced after it as vLLM 0.32 does (placeholder payload,
    docs/kv-tier.md §4)."""
    ev = BlockStored([i + 1], i or None, TOKENS[i * BS : (i + 1) * BS], BS, None, "GPU", None)
    events = [ev, BlockStored([i + 1], None, [], 0, None, "CPU", None)] if host else [ev]
    return encode_kv_batch(KVEventBatch(ts=ts, events=events, data_parallel_rank=0), "mapev")


async def follow(feeds: list[list[Msg]]) -> KvResidency:
    """Run KvResidency over one feed per list: each but the last fails after its messages."""
    opened = 0
    done = anyio.Event()

    async def feed(spec: NodeSpec) -> AsyncIterator[Msg]:
        nonlocal opened
        msgs = feeds[opened]
        opened += 1
        for m in msgs:
            yield m
        if opened < len(feeds):
            raise ConnectionError("socket closed")
        done.set()
        await anyio.sleep_forever()

    kv = KvResidency(FakeStore(), get_logger("test"), NODES, feeds=feed)
    async with anyio.create_task_group() as tg:
        tg.start_soon(kv.run)
        await done.wait()
        tg.cancel_scope.cancel()
    return kv


@pytest.fixture(autouse=True)
def _fast_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kvresidency, "_RETRY_S", 0.0)


@pytest.mark.parametrize("host", [False, True], ids=["gpu", "gpu+host"])
class TestReopenedFeed:
    """Each case with GPU blocks only and with their host-tier copies: both tiers survive a
    reopen of the same engine and are dropped by a restart."""

    async def test_replay_of_the_same_engine_keeps_the_index_and_the_incarnation(
        self, host: bool
    ) -> None:
        """The catch-up replay after a feed failure matches what was applied: no restart."""
        first = [Msg("n1", i, block(i, host=host), TS, replayed=True) for i in range(2)]
        second = [Msg("n1", i, block(i, TS, host), TS + 5, replayed=True) for i in range(3)]
        kv = await follow([first, second])
        stats = kv.index.stats("n1")
        assert stats is not None and stats.incarnation == 0 and stats.seq == 2
        assert kv.counts["restarts"] == 0 and kv.counts["clears"] == 0
        assert kv.counts["feed_failures"] == 1 and kv.index.walk("n1", KEYS) == 3
        assert kv.index.walk("n1", KEYS, CPU) == (3 if host else 0)

    async def test_engine_restarted_while_disconnected_is_a_restart(self, host: bool) -> None:
        """A replay whose batch at the last applied seq differs: clear, new incarnation."""
        first = [Msg("n1", i, block(i, host=host), TS) for i in range(3)]
        second = [Msg("n1", 0, block(0, TS + 60, host), TS + 60, replayed=True)]
        second += [Msg("n1", 1, block(1, TS + 61), TS + 61, replayed=True)]
        second += [Msg("n1", 2, block(3, TS + 62), TS + 62)]  # now block 3 at seq 2
        kv = await follow([first, second])
        stats = kv.index.stats("n1")
        assert stats is not None and stats.incarnation == 1 and stats.seq == 2
        assert kv.counts["restarts"] == 1
        assert kv.index.walk("n1", KEYS) == 2 and kv.index.resident("n1", KEYS[2]) == 0
        assert kv.index.walk("n1", KEYS, CPU) == (1 if host else 0)  # the new engine's only
        assert kv.index.resident("n1", KEYS[2], CPU) == 0

    async def test_live_batch_first_goes_through_the_sequence_rule(self, host: bool) -> None:
        """No replay after the reopen: a live seq past the last one is a gap, not a restart."""
        first = [Msg("n1", i, block(i, host=host), TS) for i in range(2)]
        kv = await follow([first, [Msg("n1", 5, block(2, host=host), TS)]])
        stats = kv.index.stats("n1")
        assert stats is not None and stats.incarnation == 0 and stats.seq == 5
        assert kv.counts["gaps_zmq"] == 1 and kv.index.walk("n1", KEYS) == 3
        assert kv.index.walk("n1", KEYS, CPU) == (3 if host else 0)


class TestReceivedAtHeader:
    @pytest.mark.parametrize("header", ["nan", "inf", "1e308", "-5"])
    async def test_implausible_header_uses_the_delivery_time(self, header: str) -> None:
        """t_obs stays finite: the bad header gives way to the delivery time."""
        kv = KvResidency(FakeStore(), get_logger("test"), [], feeds=None)
        headers = {subjects.KV_SEQ_HEADER: "0", subjects.RECEIVED_AT_HEADER: header}
        d = Delivery(subjects.kv_events("n1"), headers, 1, 1, TS + 1)
        batch = KVEventBatch(ts=TS, events=[], data_parallel_rank=0)
        await kv.on_bridged([(batch, d)])
        stats = kv.index.stats("n1")
        assert stats is not None and stats.last_t_obs == TS
        assert stats.last_t_obs is not None and math.isfinite(stats.last_t_obs)
