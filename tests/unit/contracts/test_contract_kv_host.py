"""vLLM 0.32's host-tier KV events (the OffloadingConnector's, ``medium="CPU"``) in its msgpack
wire format: decoded by shared/contracts/kv.py as vLLM sends them and applied to the KV index.

The payloads (tests/fixtures/vllm/batch-cpu-*.msgpack) are encoded from structs declared as
``vllm/distributed/kv_events.py:31-142@0.32`` declares vLLM's (see
tests/fixtures/vllm/make_host_batches.py; no CUDA vLLM runs here to capture them). Short names
as in docs/kv-tier.md: oevents = ``distributed/kv_transfer/kv_connector/v1/offloading/
events.py@0.32``, cpumgr = ``v1/kv_offload/cpu/manager.py@0.32``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.kv import BlockRemoved, BlockStored, KVEventBatch, decode_kv_batch
from shared.core.blockkeys import chain_keys
from shared.core.kvindex import KvIndex
from shared.core.tiers import CPU, GPU
from tests.fixtures.vllm import make_host_batches as made

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
NAMES = ("cpu-store", "cpu-evict", "cpu-selfdescribing")
KEYS = chain_keys(made.TOKENS, made.BLOCK_SIZE)


def batch(name: str) -> KVEventBatch:
    return decode_kv_batch((FIXTURES / f"batch-{name}.msgpack").read_bytes())


class TestFixtures:
    @pytest.mark.parametrize("name", NAMES)
    def test_the_files_are_what_the_script_writes(self, name: str) -> None:
        """The committed payloads and their .json twins match make_host_batches.py."""
        data = (FIXTURES / f"batch-{name}.msgpack").read_bytes()
        assert data == made.payloads()[name]

        def hook(obj: dict[str, Any]) -> Any:
            return bytes.fromhex(obj["bytes_hex"]) if set(obj) == {"bytes_hex"} else obj

        twin = json.loads((FIXTURES / f"batch-{name}.json").read_text(), object_hook=hook)
        assert twin[0] == decode_kv_batch(data).ts and len(twin[1]) == len(batch(name).events)


class TestShapes:
    def test_a_default_host_store_is_a_placeholder(self) -> None:
        """oevents:337-357: one hash (the GPU event's hash of the block, 32 bytes by default),
        parent None, no tokens, block_size 0, no LoRA, medium "CPU", the offload key's group,
        no spec kind; after the GPU pool's events of the same batch (scheduler.py:2370-2385)."""
        b = batch("cpu-store")
        gpu, *cpu = b.events
        assert isinstance(gpu, BlockStored) and gpu.medium == "GPU"
        assert gpu.block_hashes == made.BYTES
        for ev, h in zip(cpu, made.BYTES, strict=False):
            assert isinstance(ev, BlockStored)
            assert ev.block_hashes == [h]
            assert (ev.parent_block_hash, ev.token_ids, ev.block_size) == (None, [], 0)
            assert (ev.lora_id, ev.lora_name, ev.medium) == (None, None, "CPU")
            assert (ev.group_idx, ev.kv_cache_spec_kind, ev.extra_keys) == (0, None, None)
        assert b.unknown_events == 0

    def test_a_host_eviction_names_the_evicted_hashes(self) -> None:
        """oevents:407-440: one BlockRemoved per group, medium "CPU"; a GPU eviction is a
        GPU BlockRemoved only (the host copy stays: cpumgr reacts to no GPU eviction)."""
        removed = [e for e in batch("cpu-evict").events if isinstance(e, BlockRemoved)]
        assert [(e.medium, e.block_hashes, e.group_idx) for e in removed] == [
            ("GPU", made.BYTES[::-1], 0),
            ("CPU", [made.BYTES[1]], 0),
        ]

    def test_a_self_describing_store_carries_its_payload(self) -> None:
        """oevents:383-405: the chunk's block hashes, its parent, its tokens, block_size and
        the group's spec kind; int hashes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES
        (kv_cache_utils.py:96-99)."""
        _, first, second, removed = batch("cpu-selfdescribing").events
        assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
        assert first.block_hashes == made.INTS[:2] and first.parent_block_hash is None
        assert len(first.token_ids) == 2 * first.block_size == 2 * made.BLOCK_SIZE
        assert second.parent_block_hash == made.INTS[1]
        assert first.kv_cache_spec_kind == "full_attention"
        assert isinstance(removed, BlockRemoved) and removed.block_hashes == made.INTS[:2]


class TestApplied:
    def test_placeholders_follow_the_gpu_hashes(self) -> None:
        """Stored: 3 blocks on the GPU, the first 2 in the host tier. Then the third host
        store completes, the GPU evicts all, the host evicts the second: GPU 0, host blocks
        1 and 3 (a leading run of 1)."""
        idx = KvIndex()
        idx.register("s", KEYS, made.BLOCK_SIZE, 0.0)
        idx.apply("n", 0, batch("cpu-store"), 1.0)
        assert (idx.walk("n", KEYS, GPU), idx.walk("n", KEYS, CPU)) == (3, 2)
        idx.apply("n", 1, batch("cpu-evict"), 2.0)
        assert (idx.walk("n", KEYS, GPU), idx.walk("n", KEYS, CPU)) == (0, 1)
        assert [idx.resident("n", k, CPU) for k in KEYS] == [1, 0, 1]
        assert idx.tiers("s") == {"n": {CPU: made.BLOCK_SIZE}}
        stats = idx.stats("n")
        assert stats is not None and (stats.host_unresolved, stats.unknown_removals) == (0, 0)

    def test_self_describing_stores_key_themselves(self) -> None:
        idx = KvIndex()
        idx.apply("n", 0, batch("cpu-selfdescribing"), 1.0)
        assert idx.walk("n", KEYS, GPU) == 3
        assert [idx.resident("n", k, CPU) for k in KEYS] == [0, 0, 1]  # the chunk was evicted
