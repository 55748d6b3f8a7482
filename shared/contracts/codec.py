"""JSON encoding and decoding of TAO messages, with errors that say what was wrong.

NATS payloads are JSON written by msgspec (compact, UTF-8, ``bytes`` as base64). vLLM KV events
are msgpack and have their own decoder (:func:`.kv.decode_kv_batch`). Decoders are built once
per target type and cached.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final, TypeVar, cast

import msgspec

from .base import Message
from .deadletter import DeadLetter
from .domain import DomainLoadReport
from .errors import DecodeError
from .node import NodeStatus
from .plan import Placement, Plan
from .session import SessionCancel, SessionEnd, SessionEvent, SessionRequest, SessionResponse
from .tool import ToolEnd, ToolEvent, ToolProgress, ToolStart
from .valuation import ValuationSnapshot
from .wake import Wake

__all__ = [
    "MESSAGE_TYPES",
    "AnyMessage",
    "decode",
    "decode_message",
    "decode_session_event",
    "decode_tool_event",
    "encode",
]

T = TypeVar("T")

AnyMessage = (
    SessionRequest
    | SessionResponse
    | SessionCancel
    | SessionEnd
    | ToolStart
    | ToolEnd
    | ToolProgress
    | NodeStatus
    | ValuationSnapshot
    | Plan
    | Placement
    | DeadLetter
    | Wake
    | DomainLoadReport
)
"""Every top-level TAO message, distinguished by its ``type`` tag."""

MESSAGE_TYPES: Final[tuple[type[Message], ...]] = (
    SessionRequest,
    SessionResponse,
    SessionCancel,
    SessionEnd,
    ToolStart,
    ToolEnd,
    ToolProgress,
    NodeStatus,
    ValuationSnapshot,
    Plan,
    Placement,
    DeadLetter,
    Wake,
    DomainLoadReport,
)

Buffer = bytes | bytearray | memoryview | str

_ENCODER: Final = msgspec.json.Encoder()


@cache
def _decoder(target: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(target)


def _name(target: Any) -> str:
    return getattr(target, "__name__", None) or str(target)


def _decode(data: Buffer, target: Any, name: str) -> Any:
    try:
        return _decoder(target).decode(data)
    except msgspec.DecodeError as exc:  # includes msgspec.ValidationError
        reason = str(exc) if len(data) else "empty payload"
        raise DecodeError(name, reason) from exc


def encode(msg: msgspec.Struct) -> bytes:
    """Encode a message (or any contracts Struct) as compact JSON bytes."""
    return _ENCODER.encode(msg)


def decode(data: Buffer, type_: type[T]) -> T:
    """Decode JSON ``data`` as ``type_``; raise :class:`DecodeError` naming the reason.

    Unknown fields are ignored; a ``type`` tag, when present, must match ``type_``.
    """
    return cast(T, _decode(data, type_, _name(type_)))


def decode_tool_event(data: Buffer) -> ToolEvent:
    """Decode a message from ``tao.v1.tool.*`` (ToolStart | ToolEnd | ToolProgress)."""
    return cast(ToolEvent, _decode(data, ToolEvent, "ToolEvent"))


def decode_session_event(data: Buffer) -> SessionEvent:
    """Decode a message from ``tao.v1.session.>`` (SessionRequest | SessionResponse |
    SessionCancel | SessionEnd)."""
    return cast(SessionEvent, _decode(data, SessionEvent, "SessionEvent"))


def decode_message(data: Buffer) -> AnyMessage:
    """Decode any TAO message by its ``type`` tag (tools, dead-letter replays, debugging)."""
    return cast(AnyMessage, _decode(data, AnyMessage, "TAO message"))
