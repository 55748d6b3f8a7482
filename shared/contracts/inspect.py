"""``tao inspect`` request/reply bodies on ``tao.v1.inspect.<what>`` (core NATS, JSON).

Telemetry answers; ``tao inspect`` asks (and builds the same replies itself when it has to read
a node directly). The reply objects are printed by ``--json`` as they are, so their field names
and order are the CLI's documented output (issue 4, "Inspection"):

* ``inspect.node`` ← :class:`NodeQuery` → :class:`NodeInspect`
  ``{"node", "blocks", "resident_tokens", "seq", "incarnation", "healthy", "capacity_tokens",
  "host_blocks", "host_resident_tokens"}``
* ``inspect.prefix`` ← :class:`PrefixQuery` → :class:`PrefixInspect`
  ``{"resident_prefix_tokens", "host_prefix_tokens"}``

A request that cannot be answered gets :class:`InspectFailure` ``{"error": "..."}`` instead;
:func:`decode_reply` raises :class:`InspectRefused` with that text.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

from .errors import DecodeError

__all__ = [
    "InspectFailure",
    "InspectRefused",
    "NodeInspect",
    "NodeQuery",
    "PrefixInspect",
    "PrefixQuery",
    "decode_query",
    "decode_reply",
    "encode_body",
]

T = TypeVar("T", bound=msgspec.Struct)


class NodeQuery(msgspec.Struct, frozen=True):
    node: str


class PrefixQuery(msgspec.Struct, frozen=True):
    node: str
    tokens: list[int]


class NodeInspect(msgspec.Struct, frozen=True):
    """What TAO knows about one node's KV cache.

    ``blocks``: distinct resident blocks (full-attention group, GPU); ``resident_tokens``:
    ``blocks × block size``; ``seq``: the last applied KV-event batch (``None`` before any, or
    right after a restart was detected and before its first batch); ``incarnation``: engine
    restarts seen; ``healthy``: the scraper's verdict; ``capacity_tokens``: the nodes file's
    override, else the scraped capacity (``None`` when neither is known); ``host_blocks`` and
    ``host_resident_tokens``: the same counts for the node's host KV tier (vLLM's
    OffloadingConnector, ``medium="CPU"``; 0 without one).
    """

    node: str
    blocks: int
    resident_tokens: int
    seq: int | None
    incarnation: int
    healthy: bool
    capacity_tokens: int | None
    host_blocks: int = 0
    host_resident_tokens: int = 0


class PrefixInspect(msgspec.Struct, frozen=True):
    """How many leading tokens of the asked token ids are resident (whole blocks): in GPU
    memory, and in the node's host KV tier (0 without one)."""

    resident_prefix_tokens: int
    host_prefix_tokens: int = 0


class InspectFailure(msgspec.Struct, frozen=True):
    error: str


class InspectRefused(Exception):
    """The responder answered with an error (unknown node, bad request)."""


_ENCODER = msgspec.json.Encoder()


def encode_body(value: msgspec.Struct) -> bytes:
    return _ENCODER.encode(value)


def decode_query(data: bytes, type_: type[T]) -> T:
    """Decode a request body; :class:`DecodeError` naming what was wrong."""
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.DecodeError as exc:
        raise DecodeError(type_.__name__, str(exc)) from None


def decode_reply(data: bytes, type_: type[T]) -> T:
    """Decode a reply: the struct, or :class:`InspectRefused` for an ``{"error"}`` reply."""
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.DecodeError as exc:
        try:
            failure = msgspec.json.decode(data, type=InspectFailure)
        except msgspec.DecodeError:
            raise DecodeError(type_.__name__, str(exc)) from None
        raise InspectRefused(failure.error) from None
