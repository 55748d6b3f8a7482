"""``FakeBus``: the :class:`~shared.infra.busapi.MessageBus` in memory, for service tests.

It keeps only storage and consumer positions: each subscription feeds in-memory messages to the
real :class:`shared.infra.receiver.Receiver`, the one receive path of :class:`shared.infra.bus.
Bus` too (decode, handler, ack or nak with backoff, dead letters, batches), so the fake cannot
drift from the real rules. As on the server: streams keep every message; a durable consumer
keeps its position, so a consumer started again with the same durable name resumes where the
last one stopped; ``deliver="new"`` skips what was stored before the consumer was created; a
nak'ed message comes back after its delay with ``num_delivered`` counting up; dead letters
land in the DLQ stream as :class:`~shared.contracts.DeadLetter`. Core subscribers get messages
published after they subscribed; in a queue group one member gets each message. Handlers run
one at a time per subscription.

Test helpers beyond the Protocol: :attr:`FakeBus.published`, :meth:`FakeBus.stream_messages`
and :meth:`FakeBus.settle` (returns when every subscription is idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from collections import OrderedDict
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shared.contracts import Message, encode, subjects
from shared.contracts.subjects import Stream

from .busapi import (
    DEDUP_IDS,
    DEFAULT_MAX_PAYLOAD,
    MSG_ID_HEADER,
    BatchHandler,
    Decoder,
    Deliver,
    Handler,
    Responder,
    check_namespace,
    dead_letter_for,
    publish_id,
    stream_for_subject,
    subject_matches,
)
from .errors import BusError, RequestError
from .lease import LeaseTable, MemoryLeaseTable
from .logging import get_logger
from .receiver import Receiver

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
        self._subs: list[_FakeSub] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._responders: list[_FakeResponder] = []
        self._closed = False
        self.max_payload = DEFAULT_MAX_PAYLOAD
        """As a server's: a larger publish raises :class:`BusError` (nats-py raises
        ``MaxPayloadError``)."""
        self._lease: MemoryLeaseTable | None = None

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
        for sub in list(self._subs):
            group = sub.queue
            if group is not None and sub.state is None:
                # a queue group: one member gets each message (the first that matches)
                if group in served_groups or not subject_matches(sub.name, subject):
                    continue
                served_groups.add(group)
                self._subs.remove(sub)  # rotate, so members take turns
                self._subs.append(sub)
            sub.offer(stream, subject, bytes(data), hdrs)
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
    ) -> Receiver[T]:
        """Start a consumer on ``stream`` (a durable resumes from its stored position)."""
        name, state = self._state(stream, service, filter_subject, durable, ephemeral, deliver)
        receiver = Receiver(self, service, decode, handler, name, jetstream=True)
        return self._start(receiver, state)

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
    ) -> Receiver[T]:
        """Like :meth:`consume`, handing the handler lists of up to ``max_batch`` messages."""
        name, state = self._state(stream, service, filter_subject, durable, ephemeral, deliver)
        receiver = Receiver(
            self,
            service,
            decode,
            None,
            name,
            jetstream=True,
            batch_handler=handler,
            max_batch=max_batch,
        )
        return self._start(receiver, state)

    def _start(
        self, receiver: Receiver[T], state: _ConsumerState | None, queue: str | None = None
    ) -> Receiver[T]:
        sub = _FakeSub(self, receiver, state)
        sub.queue = queue
        receiver.sub = sub
        self._subs.append(sub)
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
    ) -> Receiver[T]:
        """Subscribe to ``subject`` (wildcards allowed); sees messages published from now on."""
        subjects.check_name(service, "service")
        receiver = Receiver(self, service, decode, handler, subject, jetstream=False)
        return self._start(receiver, None, queue)

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        """Ask one responder of each queue group serving ``subject`` (a group's members take
        turns) and return the first reply; one that answers ``None`` or fails sends none (when
        none replies, the fake says so at once where NATS would wait out the timeout)."""
        if self._closed:
            raise RuntimeError("FakeBus is closed")
        chosen: dict[str, _FakeResponder] = {}
        for responder in list(self._responders):
            if subject_matches(responder.subject, subject) and responder.service not in chosen:
                chosen[responder.service] = responder
                self._responders.remove(responder)
                self._responders.append(responder)
        if not chosen:
            raise RequestError(subject, "no responders")
        pending = {asyncio.ensure_future(r.respond(bytes(data))): r for r in chosen.values()}
        try:
            async with asyncio.timeout(timeout):
                while pending:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        responder = pending.pop(task)
                        if task.exception() is not None:
                            _log.warning(
                                "responder_failed",
                                service=responder.service,
                                subject=subject,
                                error=f"{type(task.exception()).__name__}: {task.exception()}",
                            )
                        elif (reply := task.result()) is not None:
                            return reply
        except TimeoutError:
            pass
        finally:
            for task in pending:
                task.cancel()
        raise RequestError(subject, f"no reply within {timeout:g} s")

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
        headers: Mapping[str, str] | None,
        error: BaseException | str,
        received_at: float,
        error_type: str | None = None,
    ) -> bool:
        """Store a DeadLetter on ``tao.v1.dlq.<service>`` and log one warning; False (logged)
        if it could not be stored."""
        letter = dead_letter_for(
            service, subject, data, headers, error, received_at=received_at, error_type=error_type
        )
        _log.warning("dead_lettered", service=service, subject=subject, reason=letter.reason)
        try:
            await self.publish_msg(letter)
        except (BusError, RuntimeError) as exc:  # too large, or the bus is closed
            _log.error("dead_letter_failed", service=service, subject=subject, error=str(exc))
            return False
        return True

    # -- what a Receiver needs of its bus (shared.infra.receiver.ReceiverHost) ---------------

    def plain_subject(self, subject: str) -> str:
        """Subjects are stored without the namespace prefix: as given."""
        return subject

    def forget(self, receiver: Receiver[Any]) -> None:
        """Stop offering messages to a stopping receiver."""
        self._subs = [sub for sub in self._subs if sub.receiver is not receiver]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task that :meth:`settle` and :meth:`drain` wait for."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Return once every subscription has nothing left to deliver now."""
        while True:
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            busy = [sub for sub in self._subs if not sub.idle.is_set()]
            if not busy:
                await asyncio.sleep(0)
                if not self._tasks and all(sub.idle.is_set() for sub in self._subs):
                    return
                continue
            await asyncio.gather(*(sub.idle.wait() for sub in busy))

    async def lease_table(self, ttl_s: float, *, replicas: int = 1) -> LeaseTable:
        """One in-memory lease table per bus (every service on it shares it), as the bucket."""
        if self._lease is None:
            self._lease = MemoryLeaseTable(ttl_s)
        elif self._lease.ttl_s != ttl_s:
            raise BusError(f"lease table has TTL {self._lease.ttl_s:g} s, asked for {ttl_s:g} s")
        return self._lease

    async def drain(self) -> None:
        """Stop every subscription and close."""
        for sub in list(self._subs):
            await sub.receiver.stop()
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
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


class _FakeMsg:
    """One delivery as the real :class:`~shared.infra.receiver.Receiver` sees a nats-py ``Msg``:
    a JetStream message's reply subject carries its delivery count and stream sequence in the
    server's ack layout, and its ack or nak goes back to the :class:`_FakeSub` that sent it."""

    __slots__ = ("_seq", "_sub", "data", "headers", "reply", "subject")

    def __init__(
        self, sub: _FakeSub, seq: int | None, subject: str, data: bytes, hdrs: dict[str, str]
    ) -> None:
        self._sub, self._seq = sub, seq
        self.subject, self.data, self.headers = subject, data, hdrs
        self.reply = ""
        if seq is not None:
            st = sub.state
            assert st is not None
            num = st.delivered[seq]
            self.reply = f"$JS.ACK.{st.stream}.{sub.name}.{num}.{seq}.{seq}.{time.time_ns()}.0"

    async def ack(self) -> None:
        if self._seq is not None and self._sub.state is not None:
            self._sub.state.delivered.pop(self._seq, None)

    async def nak(self, delay: float | None = None) -> None:
        if self._seq is not None:
            self._sub.redeliver(self._seq, delay or 0.0)


class _FakeSub:
    """One in-memory subscription feeding the real :class:`~shared.infra.receiver.Receiver`:
    it keeps only the consumer's position (``state``; None for a core subscriber) and hands the
    receiver one message at a time, as nats-py's subscription callback does."""

    def __init__(self, bus: FakeBus, receiver: Receiver[Any], state: _ConsumerState | None) -> None:
        self.bus = bus
        self.receiver = receiver
        self.state = state
        self.name = receiver.name
        self.batch = receiver.max_batch if receiver.batch_handler is not None else 1
        self.core_queue: list[tuple[str, bytes, dict[str, str]]] = []
        self.queue: str | None = None  # core queue group
        self.pending_msgs = 0
        """Messages of this pass still to come after the one being handled (nats-py's
        ``Subscription.pending_msgs``: the receiver flushes a batch when it reaches 0)."""
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.stopping = False
        self.task = asyncio.create_task(self._run(), name=f"fake-{self.name}")

    def offer(self, stream: Stream | None, subject: str, data: bytes, hdrs: dict[str, str]) -> None:
        if self.state is None:
            if subject_matches(self.name, subject):
                self.core_queue.append((subject, data, hdrs))
                self._poke()
        elif stream is not None and stream.name == self.state.stream:
            self._poke()

    def redeliver(self, seq: int, delay_s: float) -> None:
        assert self.state is not None
        heapq.heappush(self.state.redeliver, (time.monotonic() + delay_s, seq))
        for sub in self.bus._subs:  # a durable's next consumer, when this one is stopping
            if sub.state is self.state:
                sub._poke()

    def _poke(self) -> None:
        self.idle.clear()
        self.wake.set()

    async def drain(self) -> None:
        """Stop after the in-flight handler (the receiver's unsubscribe)."""
        self.stopping = True
        self.wake.set()
        self.idle.set()
        if asyncio.current_task() is not self.task:
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
                self.pending_msgs = len(self.core_queue)
                await self.receiver.on_msg(_FakeMsg(self, None, subject, data, hdrs))
                continue
            seqs: list[int] = []
            wait_s: float | None = None
            while len(seqs) < self.batch:
                seq, wait_s = self._next()
                if seq is None:
                    break
                seqs.append(seq)
            if not seqs:
                await self._wait(wait_s)
                continue
            await self._deliver(self.state, seqs)
        self.idle.set()

    async def _wait(self, timeout: float | None) -> None:
        if timeout is None:
            self.idle.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)

    async def _deliver(self, st: _ConsumerState, seqs: list[int]) -> None:
        """Hand stored messages ``seqs`` to the receiver in order; those a stop cut off go back
        to the consumer undelivered."""
        for i, seq in enumerate(seqs):
            if self.stopping:
                for rest in seqs[i:]:
                    self.redeliver(rest, 0.0)
                return
            st.delivered[seq] = st.delivered.get(seq, 0) + 1
            m = self.bus._streams[st.stream][seq - 1]
            self.pending_msgs = len(seqs) - i - 1
            await self.receiver.on_msg(_FakeMsg(self, seq, m.subject, m.data, m.headers))
