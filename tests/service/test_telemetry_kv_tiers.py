"""Telemetry's residency per KV tier (services/telemetry): vLLM's host-tier events (``medium=
"CPU"``, the OffloadingConnector's; docs/kv-tier.md §4) written beside the GPU residency, served
to the valuation (``host_residency``) and to ``tao inspect``, across clears, restarts and a
restarted telemetry's replay. FakeBus + FakeStore; payloads in vLLM's wire format."""

from __future__ import annotations

import orjson

from services.telemetry.inspect import Inspector
from shared.contracts import subjects
from shared.contracts.kv import AllBlocksCleared, BlockHash, BlockRemoved, BlockStored
from shared.infra.fake_store import FakeStore
from shared.infra.settings import NodeSpec
from tests.service.test_telemetry_kv import BS, KEYS, TOKENS, TS, Rig, payload, response, stored


def host(h: BlockHash) -> BlockStored:
    """vLLM 0.32's default host store (oevents:337-357): one hash, no tokens, block_size 0."""
    return BlockStored([h], None, [], 0, None, "CPU", None)


async def tiers(rig: Rig, sid: str = "s1") -> tuple[dict[str, int], dict[str, int]]:
    """Flush, then ``sid``'s GPU tokens and host tokens per node, as the store serves them."""
    await rig.bus.settle()
    assert await rig.kv.flush()
    gpu = {node: k0 for node, (k0, _) in (await rig.store.residency([sid]))[sid].items()}
    return gpu, (await rig.store.host_residency([sid])).get(sid, {})


class TestHostResidency:
    async def test_host_events_are_stored_beside_the_gpu_residency(self) -> None:
        """A session's run in the host tier is written with its GPU run; after the GPU evicts
        the blocks the pair keeps its host tokens only (the GPU map leaves it out)."""
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        batch = [stored([1, 2, 3], None, TOKENS[: 3 * BS]), host(1), host(2)]
        await rig.bridged("n1", 0, payload(*batch))
        assert await tiers(rig) == ({"n1": 3 * BS}, {"n1": 2 * BS})
        await rig.bridged("n1", 1, payload(BlockRemoved([1, 2, 3], "GPU"), ts=TS + 1))
        assert await tiers(rig) == ({}, {"n1": 2 * BS})
        await rig.bridged("n1", 2, payload(BlockRemoved([2], "CPU"), ts=TS + 2))
        assert await tiers(rig) == ({}, {"n1": BS})
        assert rig.kv.counts["host_blocks_stored"] == 2
        assert rig.kv.counts["host_blocks_removed"] == 1
        await rig.bus.drain()

    async def test_a_clear_and_a_restart_drop_both_tiers(self) -> None:
        rig = await Rig().start()
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        await rig.bridged("n1", 0, payload(stored([1], None, TOKENS[:BS]), host(1)))
        await rig.bridged("n2", 0, payload(stored([1], None, TOKENS[:BS]), host(1)))
        assert await tiers(rig) == ({"n1": BS, "n2": BS}, {"n1": BS, "n2": BS})
        await rig.bridged("n1", 1, payload(AllBlocksCleared()))
        assert await tiers(rig) == ({"n2": BS}, {"n2": BS})
        await rig.bridged("n2", 0, payload())  # seq back to 0: the engine restarted
        assert await tiers(rig) == ({}, {})
        await rig.bus.drain()

    async def test_storage_media_are_skipped_and_counted(self) -> None:
        rig = await Rig().start()
        disk = BlockStored([1], None, TOKENS[:BS], BS, None, "STORAGE", None)
        await rig.bridged("n1", 0, payload(disk))
        await rig.bus.publish_msg(response("s1", "n1", keys=KEYS))
        assert await tiers(rig) == ({}, {})
        assert rig.kv.counts["other_media"] == 1
        await rig.bus.drain()

    async def test_a_restarted_telemetry_rebuilds_the_host_tier_from_the_replay(self) -> None:
        """The stored chain and the replayed stream give the session its host run again."""
        store = FakeStore()
        first = await Rig(store=store).start()
        await first.bus.publish_msg(response("s1", "n1", keys=KEYS))
        batches = [
            payload(stored([1, 2], None, TOKENS[: 2 * BS]), host(1), host(2)),
            payload(BlockRemoved([1, 2], "GPU"), ts=TS + 1),
        ]
        for seq, data in enumerate(batches):
            await first.bridged("n1", seq, data)
        assert await tiers(first) == ({}, {"n1": 2 * BS})
        await first.bus.drain()

        second = await Rig(store=store).start()
        for seq, data in enumerate(batches):
            await second.bridged("n1", seq, data)
        assert await tiers(second) == ({}, {"n1": 2 * BS})
        await second.bus.drain()


class TestInspectTiers:
    async def test_node_and_prefix_replies_show_the_host_tier(self) -> None:
        spec = NodeSpec("n1", "http://n1")
        rig = await Rig([spec]).start()
        await Inspector(rig.kv.index, rig.store, [spec]).start(rig.bus, "telemetry")
        batch = [stored([1, 2, 3], None, TOKENS[: 3 * BS]), host(1), host(2), host(3)]
        await rig.bridged("n1", 0, payload(*batch))
        await rig.bridged("n1", 1, payload(BlockRemoved([2, 3], "GPU"), BlockRemoved([3], "CPU")))
        await rig.settle()
        node = orjson.loads(await rig.bus.request(subjects.inspect("node"), b'{"node":"n1"}', 1.0))
        assert (node["blocks"], node["resident_tokens"]) == (1, BS)
        assert (node["host_blocks"], node["host_resident_tokens"]) == (2, 2 * BS)
        ask = orjson.dumps({"node": "n1", "tokens": TOKENS})
        prefix = orjson.loads(await rig.bus.request(subjects.inspect("prefix"), ask, 1.0))
        assert prefix == {"resident_prefix_tokens": BS, "host_prefix_tokens": 2 * BS}
        await rig.bus.drain()
