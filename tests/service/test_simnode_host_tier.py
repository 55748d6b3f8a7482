"""A simnode with a host KV tier publishes what telemetry's index reads: the engine model's host
events (vLLM 0.32's OffloadingConnector semantics) through the simnode's publisher, in vLLM's
wire format, decoded and applied to a :class:`KvIndex` give the same residency per tier as the
engine holds, through a prefix pushed out of GPU memory and reused (docs/kv-tier.md §1-§4)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from services.simnode.__main__ import parse_config
from services.simnode.kvpub import KvPublisher
from shared.contracts.kv import BlockStored, KVEncoding, KVEventBatch, decode_kv_batch
from shared.contracts.kv import encode_kv_batch as encode
from shared.core.blockkeys import chain_keys
from shared.core.engine import PROFILES, ROOT_HASH, Engine, EngineRequest, chain_hash
from shared.core.kvindex import KvIndex
from shared.core.tiers import CPU, GPU

QWEN = PROFILES["qwen3-32b-tp2"]
BS = QWEN.block_size


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 1_000_003 + 7 * i) % 50_000 for i in range(n)]


def _hashes(tokens: list[int]) -> list[int]:
    out, parent = [], ROOT_HASH
    for j in range(len(tokens) // BS):
        parent = chain_hash(parent, tokens[j * BS : (j + 1) * BS])
        out.append(parent)
    return out


class Node:
    """An engine with a host tier, its publisher, and an index fed what it publishes."""

    def __init__(self, encoding: KVEncoding, hash_kind: str) -> None:
        profile = dataclasses.replace(QWEN, kv_tokens=48 * BS)
        self.engine = Engine("n", profile, emit_kv_events=True, host=profile.host_link(4.0))
        self.pub = KvPublisher("tcp://*:1", encoding=encoding, hash_kind=hash_kind, seed=b"s")  # type: ignore[arg-type]
        self.index = KvIndex()
        self.seq = 0
        self.t = 0.0

    def run(self, rid: str, prompt: list[int]) -> int:
        """Serve one request to its end; publish and apply every batch; its cached tokens."""
        self.engine.submit(EngineRequest(rid, "s", prompt, 4), self.t)
        done = self.engine.advance(math.inf)
        self.t = max(c.finished_at for c in done) + 1.0
        self.engine.advance(self.t)  # stores still in flight complete
        self.flush()
        return next(c.cached_tokens for c in done if c.request_id == rid)

    def flush(self) -> None:
        events = self.engine.drain_kv_events()
        if not events:
            return
        wire = encode(KVEventBatch(ts=self.t, events=self.pub.to_wire(events)), self.pub.encoding)
        self.index.apply("n", self.seq, decode_kv_batch(wire), self.t)
        self.seq += 1


@pytest.mark.parametrize(("encoding", "hash_kind"), [("mapev", "int"), ("legacy", "bytes")])
def test_the_index_follows_the_engine_per_tier(encoding: KVEncoding, hash_kind: str) -> None:
    node = Node(encoding, hash_kind)
    prefix = _prompt(1, 20 * BS)
    keys = chain_keys(prefix, BS)
    hashes = _hashes(prefix)
    node.index.register("s", keys, BS, 0.0)
    node.run("a", [*prefix, 7])

    def agree() -> tuple[int, int]:
        gpu = node.engine.resident_blocks(hashes, len(hashes))
        host = node.engine.host_resident_blocks(hashes, len(hashes))
        assert node.index.prefix_blocks("s", "n", GPU) == gpu
        assert node.index.prefix_blocks("s", "n", CPU) == host
        return gpu, host

    assert agree() == (20, 20)
    for i in range(2, 6):  # other prompts push the prefix out of GPU memory
        node.run(f"f{i}", _prompt(i, 40 * BS))
    gpu, host = agree()
    assert gpu == 0 and host == 20
    cached = node.run("b", [*prefix, 9])  # reused: loaded back from the host tier
    assert cached == 20 * BS  # host-loaded tokens count as cached (docs/kv-tier.md §3)
    assert agree() == (20, 20)
    stats = node.index.stats("n")
    assert stats is not None and stats.host_unresolved == 0 and stats.unknown_removals == 0


def test_host_placeholders_go_out_as_vllm_sends_them() -> None:
    """One placeholder per block: the GPU event's published hash, no tokens, no parent,
    block_size 0, the group but no kind (oevents:337-357), after the GPU events."""
    node = Node("mapev", "int")
    node.engine.submit(EngineRequest("a", "s", _prompt(1, 3 * BS + 1), 2), 0.0)
    node.engine.advance(math.inf)
    node.engine.advance(10.0)
    wire = node.pub.to_wire(node.engine.drain_kv_events())
    gpu = [e for e in wire if isinstance(e, BlockStored) and e.medium == "GPU"]
    cpu = [e for e in wire if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert [e.block_hashes for e in cpu] == [[h] for h in gpu[0].block_hashes]
    for e in cpu:
        assert (e.parent_block_hash, e.token_ids, e.block_size, e.lora_id) == (None, [], 0, None)
        assert (e.group_idx, e.kv_cache_spec_kind) == (0, None)
    assert wire.index(cpu[0]) > wire.index(gpu[0])


def test_simnode_host_kv_option_gives_the_engine_a_host_tier() -> None:
    config, _, _ = parse_config(["--port", "1", "--node-id", "n", "--host-kv", "2"])
    link = config.host_link()
    assert link is not None and link.blocks == 2 * config.engine_profile().num_gpu_blocks
    assert parse_config(["--port", "1", "--node-id", "n"])[0].host_link() is None
