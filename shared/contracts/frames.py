"""ZMQ framing of vLLM KV events (DESIGN §5): sequence numbers, messages and replay.

Live messages come from the engine's PUB socket as ``[topic, seq, payload]``. Missed batches are
fetched from its ROUTER replay socket: a DEALER sends :func:`replay_request` (``[b"", seq]``) and
receives one ``[b"", seq, payload]`` per buffered batch from ``seq`` on, then the end marker
``[b"", -1, b""]``. Both shapes parse with :func:`parse_kv_frames`.

``seq`` is an 8-byte big-endian signed integer. The subscriber's rules: a gap in ``seq`` → ask
for a replay; ``seq`` going backwards → the engine restarted, clear the node; ``-1`` (eight
``0xff`` bytes) with an empty payload → the replay is complete.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from .errors import FrameError
from .kv import KVEventBatch, decode_kv_batch

__all__ = [
    "REPLAY_END_SEQ",
    "SEQ_BYTES",
    "KVFrame",
    "encode_seq",
    "parse_kv_frames",
    "parse_seq",
    "replay_request",
]

SEQ_BYTES: Final = 8
REPLAY_END_SEQ: Final = -1
_SEQ_MIN: Final = -(2**63)
_SEQ_MAX: Final = 2**63 - 1


class KVFrame(NamedTuple):
    """One parsed message: its topic (``b""`` on the replay socket), ``seq`` and batch.

    ``batch`` is ``None`` exactly for the replay end marker (``seq == -1``, empty payload).
    """

    topic: bytes
    seq: int
    batch: KVEventBatch | None

    @property
    def is_replay_end(self) -> bool:
        return self.batch is None


def parse_seq(frame: bytes | bytearray | memoryview) -> int:
    """Read a ``seq`` frame: exactly 8 bytes, big-endian, signed (``-1`` ends a replay)."""
    if len(frame) != SEQ_BYTES:
        raise FrameError(f"seq frame must be {SEQ_BYTES} bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def encode_seq(seq: int) -> bytes:
    """Write ``seq`` as an 8-byte big-endian signed frame."""
    if not _SEQ_MIN <= seq <= _SEQ_MAX:
        raise ValueError(f"seq {seq} does not fit in 8 signed bytes")
    return seq.to_bytes(SEQ_BYTES, "big", signed=True)


def replay_request(start_seq: int) -> list[bytes]:
    """The frames a DEALER sends to ask the replay socket for every batch from ``start_seq``."""
    if start_seq < 0:
        raise ValueError(f"replay start seq must be >= 0, got {start_seq}")
    return [b"", encode_seq(start_seq)]


def parse_kv_frames(frames: Sequence[bytes | bytearray | memoryview]) -> KVFrame:
    """Parse ``[topic, seq, payload]`` from the PUB socket or ``[b"", seq, payload]`` from replay.

    Raises :class:`FrameError` for a wrong frame count, a bad ``seq`` or a payload on the end
    marker, and :class:`~shared.contracts.errors.DecodeError` for a payload that is not a batch.
    """
    if len(frames) != 3:
        raise FrameError(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
    topic, seq_frame, payload = frames
    seq = parse_seq(seq_frame)
    if seq == REPLAY_END_SEQ:
        if len(payload):
            raise FrameError(f"replay end marker (seq -1) carries {len(payload)} payload bytes")
        return KVFrame(bytes(topic), seq, None)
    return KVFrame(bytes(topic), seq, decode_kv_batch(payload))
