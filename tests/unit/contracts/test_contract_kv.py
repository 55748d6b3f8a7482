"""vLLM KV-event batches: the three wire encodings, tolerance rules and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from shared.contracts import (
    KV_ENCODINGS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    KVEventBatch,
    decode_kv_batch,
    encode_kv_batch,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
INT_HASHES = [1234605616436508552, 11072869122414935808]
BYTES_HASHES = [bytes(range(32)), bytes(range(32, 64))]
TOKENS = list(range(100, 132))


def payload(name: str) -> bytes:
    return (FIXTURES / f"batch-{name}.msgpack").read_bytes()


def generic(name: str) -> Any:
    """The fixture's .json twin, with ``{"bytes_hex": …}`` turned back into bytes."""

    def hook(obj: dict[str, Any]) -> Any:
        return bytes.fromhex(obj["bytes_hex"]) if set(obj) == {"bytes_hex"} else obj

    return json.loads((FIXTURES / f"batch-{name}.json").read_text(), object_hook=hook)


def pack(obj: object) -> bytes:
    return msgspec.msgpack.encode(obj)


STORED_ARRAY = ["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU", None]


class TestFixtures:
    """Each encoding vLLM has shipped decodes to the same typed batch."""

    @pytest.mark.parametrize(
        ("name", "hashes"),
        [("legacy", INT_HASHES), ("mapev", BYTES_HASHES), ("map", INT_HASHES)],
    )
    def test_decodes_concrete_values(self, name: str, hashes: list[int | bytes]) -> None:
        """ts, dp rank, event types, hashes (int or bytes as sent), tokens and block size."""
        batch = decode_kv_batch(payload(name))
        assert batch.ts == 1767225600.25
        assert batch.data_parallel_rank == 0
        assert batch.unknown_events == 0
        assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved, AllBlocksCleared]
        stored, removed, _ = batch.events
        assert isinstance(stored, BlockStored)
        assert isinstance(removed, BlockRemoved)
        assert stored.block_hashes == hashes
        assert all(type(h) is type(hashes[0]) for h in stored.block_hashes)
        assert stored.parent_block_hash is None
        assert stored.token_ids == TOKENS
        assert stored.block_size == 16
        assert len(stored.token_ids) == stored.block_size * len(stored.block_hashes)
        assert (stored.lora_id, stored.medium, stored.lora_name) == (None, "GPU", None)
        assert stored.group_idx is None
        assert removed.block_hashes == [hashes[1]]
        assert removed.medium == "GPU"

    def test_largest_int_hash_survives(self) -> None:
        """Unsigned 64-bit hashes above 2**63 keep their exact value."""
        stored = decode_kv_batch(payload("legacy")).events[0]
        assert isinstance(stored, BlockStored)
        top = stored.block_hashes[1]
        assert isinstance(top, int) and top == 11072869122414935808 > 2**63

    @pytest.mark.parametrize("name", ["legacy", "mapev", "map"])
    def test_matches_generic_json_twin(self, name: str) -> None:
        """The typed decode agrees with the fixture's generically decoded .json twin."""
        raw = generic(name)
        ts, events, rank = (
            (raw["ts"], raw["events"], raw["data_parallel_rank"]) if isinstance(raw, dict) else raw
        )
        batch = decode_kv_batch(payload(name))
        assert (batch.ts, batch.data_parallel_rank, len(batch.events)) == (ts, rank, len(events))
        first = events[0]
        hashes = first[1] if isinstance(first, list) else first["block_hashes"]
        stored = batch.events[0]
        assert isinstance(stored, BlockStored)
        assert stored.block_hashes == hashes

    @pytest.mark.parametrize("name", ["legacy", "mapev", "map"])
    def test_reencoding_reproduces_bytes(self, name: str) -> None:
        """encode_kv_batch in the fixture's own encoding gives back the exact bytes."""
        data = payload(name)
        assert encode_kv_batch(decode_kv_batch(data), name) == data  # type: ignore[arg-type]

    def test_all_encodings_agree(self) -> None:
        """A batch re-encoded in any encoding decodes to the same value."""
        batch = decode_kv_batch(payload("mapev"))
        for encoding in KV_ENCODINGS:
            assert decode_kv_batch(encode_kv_batch(batch, encoding)) == batch


class TestTolerance:
    """Older and newer vLLM shapes decode; what TAO does not know is skipped, not fatal."""

    def test_short_legacy_array_gets_defaults(self) -> None:
        """An old positional BlockStored ending at lora_id gets None for later fields."""
        event = ["BlockStored", [7], 6, [1, 2, 3, 4], 4, None]
        stored = decode_kv_batch(pack([1.0, [event], 0])).events[0]
        assert stored == BlockStored([7], 6, [1, 2, 3, 4], 4)
        assert stored.medium is None

    def test_batch_without_dp_rank(self) -> None:
        """A two-item batch (pre data-parallel vLLM) has data_parallel_rank None."""
        assert decode_kv_batch(pack([2.5, []])).data_parallel_rank is None

    def test_extra_trailing_array_items_are_ignored(self) -> None:
        """Positional fields beyond the known ones (newer vLLM) are dropped."""
        event = [*STORED_ARRAY, None, 0, "full_attention", None, "LOCAL", "x", 99]
        stored = decode_kv_batch(pack([1.0, [event], 0, "extra"])).events[0]
        assert isinstance(stored, BlockStored)
        assert (stored.group_idx, stored.kv_cache_spec_kind) == (0, "full_attention")

    def test_unknown_map_keys_are_ignored(self) -> None:
        """Map events and map batches may carry keys this version does not know."""
        event = {"type": "BlockRemoved", "block_hashes": [b"\x01"], "locality": "LOCAL"}
        batch = decode_kv_batch(pack({"ts": 3.0, "events": [event], "new_field": 1}))
        assert batch.events == [BlockRemoved([b"\x01"])]

    def test_unknown_event_tag_is_skipped_and_counted(self) -> None:
        """An event type from a newer vLLM is counted in unknown_events, the rest decode."""
        events = [["BlockPinned", [1]], {"type": "BlockMoved"}, ["AllBlocksCleared"]]
        batch = decode_kv_batch(pack([1.0, events, 0]))
        assert batch.events == [AllBlocksCleared()]
        assert batch.unknown_events == 2

    def test_mixed_event_forms_in_one_batch(self) -> None:
        """Array and map events may be mixed in one batch."""
        events = [STORED_ARRAY, {"type": "BlockRemoved", "block_hashes": [2], "medium": "GPU"}]
        batch = decode_kv_batch(pack([1.0, events, 1]))
        assert [type(e) for e in batch.events] == [BlockStored, BlockRemoved]

    def test_integer_timestamp(self) -> None:
        """An integral ts decodes as a float."""
        assert decode_kv_batch(pack([5, [], 0])).ts == 5.0

    def test_newer_map_fields_are_written_only_when_set(self) -> None:
        """Map encoding omits newer fields left None and writes them when set."""
        plain = BlockStored([1], None, [0] * 16, 16)
        hybrid = BlockStored([1], None, [0] * 16, 16, group_idx=1, kv_cache_spec_kind="swa")
        for event, present in ((plain, False), (hybrid, True)):
            data = encode_kv_batch(KVEventBatch(ts=1.0, events=[event]), "map")
            written = msgspec.msgpack.decode(data)["events"][0]
            assert ("group_idx" in written) is present
            assert "lora_id" in written
            assert decode_kv_batch(data).events == [event]


class TestErrors:
    """Bad payloads raise DecodeError (a ContractError and ValueError) naming the problem."""

    @pytest.mark.parametrize(
        ("data", "fragment"),
        [
            (b"", "empty payload"),
            (b"\xc1garbage", "expected a msgpack array or map, got 0xc1"),
            (pack("not a batch"), "expected a msgpack array or map"),
            (payload("legacy")[:60], "truncated"),
            (payload("map")[:-5], "truncated"),
            (pack(["yesterday", [], 0]), "Expected `float`, got `str`"),
            (pack([1.0, "events", 0]), "Expected `array`, got `str`"),
            (pack([1.0, [], "zero"]), "Expected `int | null`, got `str`"),
            (pack({"events": []}), "missing required field `ts`"),
        ],
    )
    def test_bad_batch(self, data: bytes, fragment: str) -> None:
        """Empty, non-batch, truncated and wrongly typed batches name what is wrong."""
        with pytest.raises(DecodeError, match="vLLM KVEventBatch") as info:
            decode_kv_batch(data)
        assert fragment in str(info.value)
        assert isinstance(info.value, ValueError)

    @pytest.mark.parametrize(
        ("event", "fragment"),
        [
            (["BlockStored", [1], None, "tokens", 16], "events[1] ('BlockStored')"),
            (["BlockStored", [1.5], None, [], 16], "Expected `int | bytes`, got `float`"),
            ({"type": "BlockRemoved"}, "missing required field `block_hashes`"),
            (["BlockStored", [1]], "at least length 5, got 2"),
            (42, "events[1] is neither an array nor a map"),
            ([], "events[1]"),
        ],
    )
    def test_bad_event_names_its_index(self, event: object, fragment: str) -> None:
        """A malformed known event fails the batch with its index, tag and reason."""
        with pytest.raises(DecodeError) as info:
            decode_kv_batch(pack([1.0, [["AllBlocksCleared"], event], 0]))
        assert fragment in str(info.value)

    def test_unknown_encoding_is_rejected(self) -> None:
        """encode_kv_batch only writes the three known encodings."""
        with pytest.raises(ValueError, match="unknown KV encoding"):
            encode_kv_batch(KVEventBatch(ts=0.0, events=[]), "json")  # type: ignore[arg-type]
