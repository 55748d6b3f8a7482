"""``FakeBus``: the :class:`~shared.infra.busapi.MessageBus` in memory, for service tests.

Same semantics as :class:`shared.infra.bus.Bus`: streams keep every message; a durable
consumer keeps its position, so a consumer started again with the same durable name resumes
where the last one stopped; ``deliver="new"`` skips what was stored before the consumer was
created; a handler error naks (redelivered after the backoff, ``num_delivered`` counting up)
and dead-letters after ``max_deliver`` deliveries; a decode error dead-letters at once; dead
letters land in the DLQ stream as :class:`~shared.contracts.DeadLetter`. Core subscribers get
messages published after they subscribed; in a queue group one member gets each message.
Handlers run one at a time per subscription.

Test helpers beyond the Protocol: :attr:`FakeBus.published`, :meth:`FakeBus.stream_messages`
and :meth:`FakeBus.settle` (returns when every subscription is idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from shared.contracts import Message, encode, subjects
from shared.contracts.subjects import Stream

from .busapi import (
    DEDUP_IDS,
    DEFAULT_MAX_PAYLOAD,
    MSG_ID_HEADER,
    BatchHandler,
    Decoder,
    Deliver,
    Delivery,
    Handler,
    Responder,
    backoff_delay,
    check_namespace,
    dead_letter_for,
    publish_id,
    stream_for_subject,
    subject_matches,
)
from .errors import BusError, RequestError
from .logging import get_logger

__all__ = ["FakeBus"]

T = TypeVar("T")
_log = get_logger("shared.infra.fakes")


@dataclass(slots=True)
class _Stored:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]


@dataclass(slots=True)
class _ConsumerState:
    """A durable's position: next new sequence, deliveries per sequence, due redeliveries."""

    stream: str
    filter_subject: str
    next_seq: int
    delivered: dict[int, int] = field(default_factory=dict)
    redeliver: list[tuple[float, int]] = field(default_factory=list)  # heap of (due, seq)


class FakeBus:
    """An in-memory message bus with JetStream-like streams and durable consumers."""

    def __init__(
        self, namespace: str = "", *, max_deliver: int = 5, retry_backoff_s: float = 0.0
    ) -> None:
        if max_deliver < 1:
            raise ValueError(f"max_deliver must be >= 1, got {max_deliver}")
        self._namespace = check_namespace(namespace)
        self.max_deliver = max_deliver
        self.retry_backoff_s = retry_backoff_s
        self.max_backoff_s = 10.0
        self.published: list[tuple[str, bytes, dict[str, str]]] = []
        self._streams: dict[str, list[_Stored]] = {s.name: [] for s in subjects.ALL_STREAMS}
        self._msg_ids: dict[str, OrderedDict[str, None]] = {}
        self.duplicates = 0
        """Publishes not stored because their ``Nats-Msg-Id`` was seen (JetStream's dedup)."""
        self._durables: dict[str, _ConsumerState] = {}
        self._receivers: list[_FakeReceiver[Any]] = []
        self._responders: list[_FakeResponder] = []
        self._closed = False
        self.max_payload = DEFAULT_MAX_PAYLOAD
        """As a server's: a larger publish raises :class:`BusError` (nats-py raises
        ``MaxPayloadError``)."""

    @property
    def namespace(self) -> str:
        """The subject/stream prefix ('' for none); kept only for parity with :class:`Bus`."""
        return self._namespace

    @property
    def closed(self) -> bool:
        """Whether :meth:`drain` has run."""
        return self._closed

    async def ensure_streams(self) -> None:
        """Streams always exist in memory."""

    def stream_messages(self, stream: Stream) -> list[tuple[str, bytes, dict[str, str]]]:
        """Every message stored in ``stream``, in order."""
        return [(m.subject, m.data, m.headers) for m in self._streams[stream.name]]

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Store in the capturing stream (waking its consumers) or deliver to core subscribers."""
        if self._closed:
            raise RuntimeError("FakeBus is closed")
        if len(data) > self.max_payload:
            raise BusError(f"maximum payload exceeded: {len(data)} > {self.max_payload} bytes")
        hdrs = dict(headers or {})
        self.published.append((subject, bytes(data), hdrs))
        stream = stream_for_subject(subject)
        if stream is not None:
            msg_id = hdrs.setdefault(MSG_ID_HEADER, publish_id(subject, data, headers))
            seen = self._msg_ids.setdefault(stream.name, OrderedDict())
            if msg_id in seen:  # JetStream's duplicate window: stored once, acked again
                self.duplicates += 1
                await asyncio.sleep(0)
                return
            seen[msg_id] = None
            while len(seen) > DEDUP_IDS:
                seen.popitem(last=False)
            stored = self._streams[stream.name]
            stored.append(_Stored(len(stored) + 1, subject, bytes(data), hdrs))
        served_groups: set[str] = set()
        for receiver in list(self._receivers):
            group = receiver.queue
            if group is not None and receiver.state is None:
                # a queue group: one member gets each message (the first that matches)
                if group in served_groups or not subject_matches(receiver.name, subject):
                    continue
                served_groups.add(group)
                self._receivers.remove(receiver)  # rotate, so members take turns
                self._receivers.append(receiver)
            receiver.offer(stream, subject, bytes(data), hdrs)
        await asyncio.sleep(0)

    async def publish_msg(self, msg: Message, headers: Mapping[str, str] | None = None) -> None:
        """Encode ``msg`` and publish it on ``subjects.subject_for(msg)``."""
        await self.publish(subjects.subject_for(msg), encode(msg), headers)

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
    ) -> _FakeReceiver[T]:
        """Start a consumer on ``stream`` (a durable resumes from its stored position)."""
        name, state = self._state(stream, service, filter_subject, durable, ephemeral, deliver)
        receiver: _FakeReceiver[T] = _FakeReceiver(self, service, decode, handler, name, state)
        self._receivers.append(receiver)
        receiver.start()
        return receiver

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
    ) -> _FakeReceiver[T]:
        """Like :meth:`consume`, handing the handler lists of up to ``max_batch`` messages."""
        state = self._state(stream, service, filter_subject, durable, ephemeral, deliver)
        receiver: _FakeReceiver[T] = _FakeReceiver(
            self,
            service,
            decode,
            None,
            state[0],
            state[1],
            batch_handler=handler,
            max_batch=max_batch,
        )
        self._receivers.append(receiver)
        receiver.start()
        return receiver

    def _state(
        self,
        stream: Stream,
        service: str,
        filter_subject: str | None,
        durable: str | None,
        ephemeral: bool,
        deliver: Deliver,
    ) -> tuple[str, _ConsumerState]:
        subjects.check_name(service, "service")
        name = durable or subjects.durable_name(service, stream)
        start = len(self._streams[stream.name]) + 1 if deliver == "new" else 1
        fresh = _ConsumerState(stream.name, filter_subject or stream.subjects[0], start)
        return name, (fresh if ephemeral else self._durables.setdefault(name, fresh))

    async def subscribe(
        self,
        subject: str,
        service: str,
        decode: Decoder[T],
        handler: Handler[T],
        *,
        queue: str | None = None,
    ) -> _FakeReceiver[T]:
        """Subscribe to ``subject`` (wildcards allowed); sees messages published from now on."""
        subjects.check_name(service, "service")
        receiver: _FakeReceiver[T] = _FakeReceiver(self, service, decode, handler, subject, None)
        receiver.queue = queue
        self._receivers.append(receiver)
        receiver.start()
        return receiver

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        """Ask the first responder serving ``subject`` (they take turns, as a queue group)."""
        if self._closed:
            raise RuntimeError("FakeBus is closed")
        for responder in self._responders:
            if subject_matches(responder.subject, subject):
                self._responders.remove(responder)
                self._responders.append(responder)
                try:
                    return await asyncio.wait_for(responder.respond(bytes(data)), timeout)
                except TimeoutError:
                    raise RequestError(subject, f"no reply within {timeout:g} s") from None
                except Exception as exc:
                    _log.warning(
                        "responder_failed",
                        service=responder.service,
                        subject=subject,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    raise RequestError(subject, f"no reply within {timeout:g} s") from None
        raise RequestError(subject, "no responders")

    async def serve(self, subject: str, service: str, respond: Responder) -> _FakeResponder:
        """Answer requests on ``subject`` with ``respond``."""
        subjects.check_name(service, "service")
        responder = _FakeResponder(self, subject, service, respond)
        self._responders.append(responder)
        return responder

    async def dead_letter(
        self,
        service: str,
        subject: str,
        data: bytes,
        headers: Mapping[str, str],
        error: BaseException | str,
        received_at: float,
        error_type: str | None = None,
    ) -> None:
        """Store a DeadLetter on ``tao.v1.dlq.<service>`` and log one warning."""
        letter = dead_letter_for(
            service, subject, data, headers, error, received_at=received_at, error_type=error_type
        )
        _log.warning("dead_lettered", service=service, subject=subject, reason=letter.reason)
        await self.publish_msg(letter)

    async def settle(self) -> None:
        """Return once every subscription has nothing left to deliver now."""
        while True:
            busy = [r for r in self._receivers if not r.idle.is_set()]
            if not busy:
                await asyncio.sleep(0)
                if all(r.idle.is_set() for r in self._receivers):
                    return
                continue
            await asyncio.gather(*(r.idle.wait() for r in busy))

    async def drain(self) -> None:
        """Stop every subscription and close."""
        for receiver in list(self._receivers):
            await receiver.stop()
        self._responders.clear()
        self._closed = True


@dataclass(slots=True, eq=False)
class _FakeResponder:
    """One :meth:`FakeBus.serve` registration."""

    bus: FakeBus
    subject: str
    service: str
    respond: Responder

    @property
    def name(self) -> str:
        return self.subject

    async def stop(self) -> None:
        if self in self.bus._responders:
            self.bus._responders.remove(self)


class _FakeReceiver(Generic[T]):
    """One in-memory subscription; ``state`` is None for a core subscriber."""

    def __init__(
        self,
        bus: FakeBus,
        service: str,
        decode: Decoder[T],
        handler: Handler[T] | None,
        name: str,
        state: _ConsumerState | None,
        *,
        batch_handler: BatchHandler[T] | None = None,
        max_batch: int = 256,
    ) -> None:
        self.bus = bus
        self.service = service
        self.decode = decode
        self.handler = handler
        self.batch_handler = batch_handler
        self.max_batch = max(1, max_batch)
        self._name = name
        self.state = state
        self.core_queue: list[tuple[str, bytes, dict[str, str]]] = []
        self.queue: str | None = None  # core queue group
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.stopping = False
        self.task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        """The durable name or the subject."""
        return self._name

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"fake-{self._name}")

    def offer(self, stream: Stream | None, subject: str, data: bytes, hdrs: dict[str, str]) -> None:
        if self.state is None:
            if subject_matches(self._name, subject):
                self.core_queue.append((subject, data, hdrs))
                self._poke()
        elif stream is not None and stream.name == self.state.stream:
            self._poke()

    def _poke(self) -> None:
        self.idle.clear()
        self.wake.set()

    async def stop(self) -> None:
        """Stop after the in-flight handler; from inside our own handler, return at once."""
        if self.stopping:
            return
        self.stopping = True
        if self in self.bus._receivers:
            self.bus._receivers.remove(self)
        self.wake.set()
        self.idle.set()
        if self.task is not None and asyncio.current_task() is not self.task:
            await self.task

    def _next(self) -> tuple[int, float | None] | tuple[None, float | None]:
        """The next sequence to deliver, else the time of the next due redelivery."""
        st = self.state
        assert st is not None
        now = time.monotonic()
        if st.redeliver and st.redeliver[0][0] <= now:
            return heapq.heappop(st.redeliver)[1], None
        stored = self.bus._streams[st.stream]
        while st.next_seq <= len(stored):
            seq = st.next_seq
            st.next_seq += 1
            if subject_matches(st.filter_subject, stored[seq - 1].subject):
                return seq, None
        return None, (st.redeliver[0][0] - now if st.redeliver else None)

    async def _run(self) -> None:
        while not self.stopping:
            self.wake.clear()
            if self.state is None:
                if not self.core_queue:
                    await self._wait(None)
                    continue
                subject, data, hdrs = self.core_queue.pop(0)
                value = await self._decode(subject, data, hdrs)
                if value is not None:
                    d = Delivery(subject, hdrs, 1, None, time.time())
                    await self._handle_one(data, value[0], d)
                continue
            st = self.state
            seqs: list[int] = []
            wait_s: float | None = None
            while len(seqs) < (self.max_batch if self.batch_handler else 1):
                seq, wait_s = self._next()
                if seq is None:
                    break
                seqs.append(seq)
            if not seqs:
                await self._wait(wait_s)
                continue
            await self._deliver(st, seqs)
        self.idle.set()

    async def _wait(self, timeout: float | None) -> None:
        if timeout is None:
            self.idle.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    async def _decode(self, subject: str, data: bytes, hdrs: dict[str, str]) -> tuple[T] | None:
        """``(value,)``, or None after dead-lettering an undecodable payload."""
        try:
            return (self.decode(data),)
        except Exception as exc:
            await self.bus.dead_letter(self.service, subject, data, hdrs, exc, time.time())
            return None

    async def _deliver(self, st: _ConsumerState, seqs: list[int]) -> None:
        """Deliver stored messages ``seqs`` (one, or a batch); schedule redeliveries."""
        items: list[tuple[int, bytes, T, Delivery]] = []
        for seq in seqs:
            num = st.delivered[seq] = st.delivered.get(seq, 0) + 1
            m = self.bus._streams[st.stream][seq - 1]
            decoded = await self._decode(m.subject, m.data, m.headers)
            if decoded is not None:
                d = Delivery(m.subject, m.headers, num, seq, time.time())
                items.append((seq, m.data, decoded[0], d))
        if self.batch_handler is not None and len(items) > 1:
            try:
                await self.batch_handler([(v, dv) for _, _, v, dv in items])
                return
            except Exception:
                pass  # retry each alone, as the real bus does
        for seq, data, value, d in items:
            retry = await self._handle_one(data, value, d)
            if retry is not None:
                heapq.heappush(st.redeliver, (time.monotonic() + retry, seq))

    async def _handle_one(self, data: bytes, value: T, d: Delivery) -> float | None:
        """Run the handler on one message; returns a redelivery delay, or None when done."""
        try:
            if self.handler is not None:
                await self.handler(value, d)
            else:
                assert self.batch_handler is not None
                await self.batch_handler([(value, d)])
        except Exception as exc:
            num = d.num_delivered
            if d.stream_seq is None or num >= self.bus.max_deliver:
                error = f"handler failed on delivery {num}: {type(exc).__name__}: {exc}"
                await self.bus.dead_letter(
                    self.service,
                    d.subject,
                    data,
                    dict(d.headers),
                    error,
                    d.received_at,
                    type(exc).__name__,
                )
                return None
            return backoff_delay(num, self.bus.retry_backoff_s, self.bus.max_backoff_s)
        return None
