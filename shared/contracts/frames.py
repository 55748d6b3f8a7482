"""ZMQ framing of vLLM KV events (DESIGN §5): sequence numbers, messages and replay.

Live messages come from the engine's PUB socket as ``[topic, seq, payload]``. Missed batches are
fetched from its ROUTER replay socket: a DEALER sends :func:`replay_request` (``[b"", seq]``) and
receives one answer per buffered batch from ``seq`` on, then an end marker with ``seq = -1`` and
an empty payload. The answer has two shapes, and :func:`parse_replay_answer` reads both:

* ``[b"", topic, seq, payload]``, ended by ``[b"", b"", -1, b""]``: vLLM 0.32 (and the releases
  since the topic frame was added to ``ZmqEventPublisher._service_replay`` in
  ``vllm/distributed/kv_events.py``, which sends ``(client_id, b"", topic, seq, buf)`` and
  ``(client_id, b"", b"", END_SEQ, b"")``; the DEALER drops ``client_id``);
* ``[b"", seq, payload]``, ended by ``[b"", -1, b""]``: older releases.

Live and replayed messages parse with :func:`parse_kv_frames`.

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
    "parse_replay_answer",
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


def parse_replay_answer(
    frames: Sequence[bytes | bytearray | memoryview],
) -> tuple[bytes, int, bytes | bytearray | memoryview]:
    """``(topic, seq, payload)`` of one answer a DEALER received from the replay socket, in
    either shape of the module docstring (``topic`` is ``b""`` in the older one and on the end
    marker). Raises :class:`FrameError` naming what is wrong: the frame count, a non-empty
    delimiter, a bad ``seq``, or a payload on the end marker."""
    if len(frames) == 4:
        delimiter, topic, seq_frame, payload = frames
    elif len(frames) == 3:
        delimiter, seq_frame, payload = frames
        topic = b""
    else:
        raise FrameError(
            f"replay answer must be [b'', topic, seq, payload] or [b'', seq, payload], "
            f"got {len(frames)} frames"
        )
    if len(delimiter):
        raise FrameError(f"replay answer's first frame must be empty, got {len(delimiter)} bytes")
    seq = parse_seq(seq_frame)
    if seq == REPLAY_END_SEQ and len(payload):
        raise FrameError(f"replay end marker (seq -1) carries {len(payload)} payload bytes")
    return bytes(topic), seq, payload


def parse_kv_frames(frames: Sequence[bytes | bytearray | memoryview]) -> KVFrame:
    """Parse ``[topic, seq, payload]`` from the PUB socket, or a replay answer in either shape
    (:func:`parse_replay_answer`; four frames, or three with an empty first frame).

    Raises :class:`FrameError` for a wrong frame count, a bad ``seq`` or a payload on the end
    marker, and :class:`~shared.contracts.errors.DecodeError` for a payload that is not a batch.
    """
    if len(frames) == 4:
        topic, seq, payload = parse_replay_answer(frames)
    elif len(frames) == 3:
        topic_frame, seq_frame, payload = frames
        topic = bytes(topic_frame)
        seq = parse_seq(seq_frame)
        if seq == REPLAY_END_SEQ and len(payload):
            raise FrameError(f"replay end marker (seq -1) carries {len(payload)} payload bytes")
    else:
        raise FrameError(
            f"expected 3 frames [topic, seq, payload] (or a 4-frame replay answer), "
            f"got {len(frames)}"
        )
    if seq == REPLAY_END_SEQ:
        return KVFrame(topic, seq, None)
    return KVFrame(topic, seq, decode_kv_batch(payload))
