"""ZMQ framing of vLLM KV events: seq frames, live and replay messages, the end marker."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.contracts import (
    REPLAY_END_SEQ,
    DecodeError,
    FrameError,
    KVFrame,
    encode_seq,
    parse_kv_frames,
    parse_replay_answer,
    parse_seq,
    replay_request,
)

PAYLOAD = (
    Path(__file__).resolve().parents[2] / "fixtures" / "vllm" / "batch-map.msgpack"
).read_bytes()


class TestSeq:
    """seq is 8 bytes, big-endian, signed; -1 (eight 0xff) ends a replay."""

    @pytest.mark.parametrize(
        ("frame", "seq"),
        [
            (b"\x00" * 8, 0),
            (b"\x00" * 7 + b"\x2a", 42),
            (b"\x00\x00\x00\x01\x00\x00\x00\x00", 2**32),
            (b"\xff" * 8, REPLAY_END_SEQ),
            (b"\x7f" + b"\xff" * 7, 2**63 - 1),
        ],
    )
    def test_parse_and_encode(self, frame: bytes, seq: int) -> None:
        """parse_seq and encode_seq are inverse on known frames."""
        assert parse_seq(frame) == seq
        assert encode_seq(seq) == frame

    @pytest.mark.parametrize("frame", [b"", b"\x00" * 4, b"\x00" * 9])
    def test_wrong_length(self, frame: bytes) -> None:
        """A seq frame of any length but 8 is a FrameError naming the length."""
        with pytest.raises(FrameError, match=f"got {len(frame)}"):
            parse_seq(frame)

    def test_out_of_range(self) -> None:
        """encode_seq refuses values that do not fit in 8 signed bytes."""
        with pytest.raises(ValueError, match="8 signed bytes"):
            encode_seq(2**63)


class TestKVFrames:
    """[topic, seq, payload] from PUB and [b"", seq, payload] from replay parse alike."""

    def test_live_message(self) -> None:
        """A PUB message yields its topic, seq and decoded batch."""
        frame = parse_kv_frames([b"kv@node-a", encode_seq(7), PAYLOAD])
        assert (frame.topic, frame.seq, frame.is_replay_end) == (b"kv@node-a", 7, False)
        assert frame.batch is not None and frame.batch.ts == 1767225600.25

    def test_replay_end_marker(self) -> None:
        """seq -1 with an empty payload is the replay end: no batch."""
        frame = parse_kv_frames([b"", b"\xff" * 8, b""])
        assert frame == KVFrame(b"", REPLAY_END_SEQ, None)
        assert frame.is_replay_end

    def test_end_marker_with_payload(self) -> None:
        """An end marker carrying data is malformed."""
        with pytest.raises(FrameError, match="carries 3 payload bytes"):
            parse_kv_frames([b"", b"\xff" * 8, b"abc"])

    def test_replay_answer_with_topic(self) -> None:
        """vLLM 0.32's replay answer [b"", topic, seq, payload] parses like a live message,
        and its end marker [b"", b"", -1, b""] is the end."""
        frame = parse_kv_frames([b"", b"kv@node-a", encode_seq(7), PAYLOAD])
        assert (frame.topic, frame.seq, frame.is_replay_end) == (b"kv@node-a", 7, False)
        assert parse_kv_frames([b"", b"", b"\xff" * 8, b""]) == KVFrame(b"", REPLAY_END_SEQ, None)

    @pytest.mark.parametrize(
        ("frames", "expected"),
        [
            ([b"", b"t", encode_seq(3), b"p"], (b"t", 3, b"p")),  # vLLM 0.32
            ([b"", encode_seq(3), b"p"], (b"", 3, b"p")),  # older vLLM
            ([b"", b"", b"\xff" * 8, b""], (b"", REPLAY_END_SEQ, b"")),  # 0.32 end
            ([b"", b"\xff" * 8, b""], (b"", REPLAY_END_SEQ, b"")),  # older end
        ],
    )
    def test_replay_answer_shapes(self, frames: list[bytes], expected: tuple) -> None:
        """Both replay shapes give (topic, seq, payload)."""
        assert parse_replay_answer(frames) == expected

    @pytest.mark.parametrize(
        ("frames", "match"),
        [
            ([b"", encode_seq(3)], "got 2 frames"),
            ([b""] * 5, "got 5 frames"),
            ([b"x", encode_seq(3), b"p"], "first frame must be empty, got 1 bytes"),
            ([b"x", b"t", encode_seq(3), b"p"], "first frame must be empty"),
            ([b"", b"t", b"\x01", b"p"], "seq frame must be 8 bytes, got 1"),
            ([b"", b"", b"\xff" * 8, b"zz"], "carries 2 payload bytes"),
        ],
    )
    def test_bad_replay_answer(self, frames: list[bytes], match: str) -> None:
        """A malformed replay answer is a FrameError that says what is wrong."""
        with pytest.raises(FrameError, match=match):
            parse_replay_answer(frames)

    @pytest.mark.parametrize("count", [0, 2, 5])
    def test_wrong_frame_count(self, count: int) -> None:
        """Anything but three frames (or a four-frame replay answer) is a FrameError."""
        with pytest.raises(FrameError, match=f"got {count}"):
            parse_kv_frames([b""] * count)

    def test_bad_payload(self) -> None:
        """A garbage payload is a DecodeError from the batch decoder."""
        with pytest.raises(DecodeError, match="vLLM KVEventBatch"):
            parse_kv_frames([b"", encode_seq(1), b"\xc1"])

    def test_frame_error_is_a_decode_error(self) -> None:
        """Callers can catch every bad input with DecodeError."""
        assert issubclass(FrameError, DecodeError)

    def test_replay_request(self) -> None:
        """A DEALER asks for batches from seq n with [b"", n as 8 bytes]."""
        assert replay_request(5) == [b"", b"\x00" * 7 + b"\x05"]
        with pytest.raises(ValueError, match=">= 0"):
            replay_request(-1)
