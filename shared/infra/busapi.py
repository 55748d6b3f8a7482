"""The message-bus boundary: the ``MessageBus`` Protocol, deliveries, and what both buses share.

Two implementations keep the same semantics: :class:`shared.infra.bus.Bus` (NATS + JetStream)
and :class:`shared.infra.fakes.FakeBus` (in memory, for service tests). The rules they share:

* ``decode(data)`` raising :class:`~shared.contracts.errors.ContractError` dead-letters the
  message at once (a bad payload never gets better by retrying);
* a handler exception naks the message with exponential backoff; after ``max_deliver``
  deliveries it is dead-lettered with the handler's error as the reason;
* a dead letter is a :class:`~shared.contracts.DeadLetter` on ``tao.v1.dlq.<service>``, one
  warning is logged, and the original is acked; the subscriber goes on with the next message;
* a publish to a stream carries ``Nats-Msg-Id`` = :func:`publish_id` (unless the caller set
  one), so the same message published again — a retry after an ack that was lost while NATS
  was down, a hook's spooled payload sent twice — is stored once (JetStream's duplicate
  window, 2 minutes by default; the fake bus remembers the last :data:`DEDUP_IDS` ids).

Namespaces. A non-empty namespace ``ns`` prefixes every subject with ``ns.`` and every stream
name with ``ns_``; callers always pass and receive the plain ``tao.v1…`` subjects. Tests use a
fresh namespace each, so they never collide on a shared server; two deployments can share one.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeVar

from shared.contracts import DeadLetter, Message, subjects
from shared.contracts.subjects import Stream

from .lease import LeaseTable

__all__ = [
    "DEDUP_IDS",
    "DEFAULT_MAX_PAYLOAD",
    "MSG_ID_HEADER",
    "BatchHandler",
    "Decoder",
    "Deliver",
    "Delivery",
    "Handler",
    "MessageBus",
    "Responder",
    "Subscription",
    "backoff_delay",
    "check_namespace",
    "dead_letter_for",
    "publish_id",
    "received_at",
    "stream_for_subject",
    "subject_matches",
]

T = TypeVar("T")
Decoder = Callable[[bytes], T]
"""Turns payload bytes into a value; raises ``ContractError`` for a payload it cannot read."""

Deliver = Literal["all", "new"]
"""Where a newly created consumer starts: the whole stream, or only messages published later."""

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_-]{0,64}")


@dataclass(frozen=True, slots=True)
class Delivery:
    """How a message arrived: plain subject, headers, delivery count, stream sequence, time."""

    subject: str
    headers: Mapping[str, str]
    num_delivered: int
    stream_seq: int | None
    received_at: float


_MAX_EPOCH_S = 1.0e11  # the year 5138; NaN and inf compare false


def received_at(d: Delivery) -> float:
    """The time in ``d``'s :data:`~shared.contracts.subjects.RECEIVED_AT_HEADER`, else when the
    bus delivered the message (``d.received_at``).

    A header that is not a plausible epoch time (not a number, not finite, not positive, or past
    the year 5000, such as a forged ``1e308``) is not believed: the delivery time is used."""
    raw = d.headers.get(subjects.RECEIVED_AT_HEADER)
    try:
        at = float(raw) if raw is not None else math.nan
    except ValueError:
        at = math.nan
    return at if 0.0 < at < _MAX_EPOCH_S else d.received_at


Responder = Callable[[bytes], Awaitable[bytes | None]]
"""``async def respond(request_body) -> reply_body`` for :meth:`MessageBus.serve`; ``None``
sends no reply (the request is another shard's to answer)."""

Handler = Callable[[T, Delivery], Awaitable[None]]
"""``async def handler(value, delivery) -> None``; raise to have the message retried."""

BatchHandler = Callable[[list[tuple[T, Delivery]]], Awaitable[None]]
"""``async def handler(items) -> None`` for :meth:`MessageBus.consume_batch`; must be idempotent."""


class Subscription(Protocol):
    """A running consumer or subscriber."""

    @property
    def name(self) -> str:
        """The durable name (JetStream) or the subject (core NATS)."""
        ...

    async def stop(self) -> None:
        """Stop receiving; the in-flight handler finishes, undelivered messages go back.

        Called from inside this subscription's own handler, it returns at once and the
        subscription stops after that handler returns. A durable consumer keeps its position.
        """
        ...


DEFAULT_MAX_PAYLOAD: Final = 1024 * 1024
"""nats-server's default ``max_payload`` (1 MiB): the largest message a client may publish."""


class MessageBus(Protocol):
    """What services need from the bus; :class:`Bus` and :class:`FakeBus` both provide it."""

    @property
    def namespace(self) -> str:
        """The subject/stream prefix ('' for none)."""
        ...

    @property
    def max_payload(self) -> int:
        """The largest message body (with its headers) the server takes, in bytes."""
        ...

    async def ensure_streams(self) -> None:
        """Create or update every stream in ``subjects.ALL_STREAMS``."""
        ...

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Publish ``data``; JetStream (ack awaited) when a stream captures ``subject``."""
        ...

    async def publish_msg(self, msg: Message, headers: Mapping[str, str] | None = None) -> None:
        """Encode ``msg`` and publish it on ``subjects.subject_for(msg)``."""
        ...

    async def consume(
        self,
        stream: Stream,
        service: str,
        decode: Decoder[T],
        handler: Handler[T],
        *,
        filter_subject: str | None = None,
        durable: str | None = None,
        ephemeral: bool = False,
        deliver: Deliver = "all",
        batch: int = 256,
    ) -> Subscription:
        """Start a JetStream consumer on ``stream``; returns once it is receiving."""
        ...

    async def consume_batch(
        self,
        stream: Stream,
        service: str,
        decode: Decoder[T],
        handler: BatchHandler[T],
        *,
        filter_subject: str | None = None,
        durable: str | None = None,
        ephemeral: bool = False,
        deliver: Deliver = "all",
        max_batch: int = 256,
    ) -> Subscription:
        """Like :meth:`consume`, with lists of what is already buffered (up to ``max_batch``)."""
        ...

    async def subscribe(
        self,
        subject: str,
        service: str,
        decode: Decoder[T],
        handler: Handler[T],
        *,
        queue: str | None = None,
    ) -> Subscription:
        """Subscribe to ``subject`` (wildcards allowed) over core NATS."""
        ...

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        """Send ``data`` on ``subject`` (core NATS) and return the first reply's body.

        Raises :class:`~shared.infra.errors.RequestError` when nobody serves ``subject`` or no
        reply came within ``timeout`` seconds.
        """
        ...

    async def serve(self, subject: str, service: str, respond: Responder) -> Subscription:
        """Answer requests on ``subject`` with ``await respond(body)`` (queue group
        ``service``, so one replica answers each; every queue group gets each request, and
        the requester takes the first reply). A ``respond`` that returns ``None`` sends no
        reply; one that raises is logged and sends none either (the requester times out)."""
        ...

    async def lease_table(self, ttl_s: float, *, replicas: int = 1) -> LeaseTable:
        """The leader-election bucket (:mod:`shared.infra.lease`), created if absent with TTL
        ``ttl_s`` and ``replicas`` copies; BusError if it exists with another TTL."""
        ...

    async def drain(self) -> None:
        """Stop every subscription, deliver what was published, and close."""
        ...


# --- helpers shared by Bus and FakeBus ------------------------------------------------------


MSG_ID_HEADER = "Nats-Msg-Id"
DEDUP_IDS = 65_536


def publish_id(subject: str, data: bytes, headers: Mapping[str, str] | None) -> str:
    """The JetStream message id of a publish: a digest of its subject, bytes and headers, so
    that publishing the very same message again is a duplicate and any other message is not
    (every event carries its own times and ids; a hook payload its receive time)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(subject.encode())
    h.update(b"\0")
    h.update(data)
    for k, v in sorted((headers or {}).items()):
        if k != MSG_ID_HEADER:
            h.update(b"\0" + k.encode() + b"\0" + v.encode())
    return h.hexdigest()


def check_namespace(namespace: str) -> str:
    """Return ``namespace`` if it is usable as a subject token and stream prefix, else raise."""
    if not _NAMESPACE_RE.fullmatch(namespace):
        raise ValueError(f"namespace must match [A-Za-z0-9_-]{{0,64}}, got {namespace!r}")
    return namespace


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` matches the NATS ``pattern`` (``*`` one token, ``>`` the rest)."""
    pt = pattern.split(".")
    st = subject.split(".")
    for i, p in enumerate(pt):
        if p == ">":
            return len(st) > i
        if i >= len(st) or (p != "*" and p != st[i]):
            return False
    return len(pt) == len(st)


def stream_for_subject(
    subject: str, streams: tuple[Stream, ...] = subjects.ALL_STREAMS
) -> Stream | None:
    """The stream whose subjects capture the plain ``subject``, if any."""
    for stream in streams:
        if any(subject_matches(p, subject) for p in stream.subjects):
            return stream
    return None


def backoff_delay(num_delivered: int, base_s: float, cap_s: float) -> float:
    """Nak delay after failed delivery ``num_delivered`` (1-based): base · 2^(n-1), capped."""
    if base_s <= 0:
        return 0.0
    return min(cap_s, base_s * (2.0 ** max(0, num_delivered - 1)))


def dead_letter_for(
    service: str,
    subject: str,
    data: bytes,
    headers: Mapping[str, str] | None,
    error: BaseException | str,
    *,
    received_at: float | None = None,
    error_type: str | None = None,
) -> DeadLetter:
    """The :class:`DeadLetter` recording that ``service`` rejected ``data`` on ``subject``.

    ``error`` is the exception (its message is the reason, its class the error type) or a
    reason string, with ``error_type`` naming the exception behind it.
    """
    if isinstance(error, BaseException):
        reason = str(error) or type(error).__name__
        error_type = error_type or type(error).__name__
    else:
        reason = error
    return DeadLetter(
        subject=subject,
        reason=reason,
        payload=bytes(data),
        received_at=time.time() if received_at is None else received_at,
        service=service,
        error_type=error_type,
        headers=dict(headers or {}),
    )
