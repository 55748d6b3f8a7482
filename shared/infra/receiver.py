"""The per-subscription message path of :class:`shared.infra.bus.Bus` and
:class:`shared.infra.fakes.FakeBus` (which feeds it in-memory messages): decode → handler → ack.

Rules (see :mod:`shared.infra.busapi`): a
decode failure dead-letters at once; a handler failure naks with backoff and dead-letters after
``max_deliver`` deliveries; a JetStream message delivered more than ``max_deliver`` times
without an ack (the process died in the handler) is dead-lettered on arrival. Core NATS has no
redelivery: a handler failure there dead-letters at once. This module never raises out of a
message callback, so the subscriber never dies on a bad message.

Batch mode (:meth:`Bus.consume_batch`) collects decoded messages while more are already
buffered by the client (up to ``max_batch``), calls the batch handler once, and acks them all.
If the batch handler fails, each message of the batch is handled again alone, so one bad
message cannot hold back, or dead-letter, the others; batch handlers must therefore be
idempotent (a message may be seen again after a failed batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Mapping
from typing import Any, Generic, Protocol, TypeVar

from .busapi import BatchHandler, Decoder, Delivery, Handler, backoff_delay
from .logging import get_logger

__all__ = ["InboundMsg", "Receiver", "ReceiverHost", "ack_fields"]


class InboundMsg(Protocol):
    """What a :class:`Receiver` reads of a message: nats-py's ``Msg``, or
    :class:`shared.infra.fakes.FakeBus`'s in-memory one. A JetStream message's ``reply`` is its
    ack subject (:func:`ack_fields`); a core NATS message is never acked."""

    @property
    def subject(self) -> str: ...

    @property
    def reply(self) -> str: ...

    @property
    def data(self) -> bytes: ...

    @property
    def headers(self) -> dict[str, str] | None: ...

    async def ack(self) -> None: ...

    async def nak(self, delay: float | None = None) -> None: ...


class ReceiverHost(Protocol):
    """What a :class:`Receiver` needs of the bus it belongs to (:class:`shared.infra.bus.Bus`):
    its delivery limits, subject names, dead letters, and a place to finish work after a
    subscription stops."""

    max_deliver: int
    retry_backoff_s: float
    max_backoff_s: float

    def plain_subject(self, subject: str) -> str: ...

    async def dead_letter(
        self,
        service: str,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        error: BaseException | str,
        received_at: float,
        error_type: str | None = None,
    ) -> bool: ...

    def forget(self, receiver: Receiver[Any]) -> None:
        """Drop a stopped receiver from the bus's list."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task the bus waits for when it drains."""
        ...


T = TypeVar("T")
_log = get_logger("shared.infra.bus")


def ack_fields(reply: str) -> tuple[int, int | None]:
    """(num_delivered, stream sequence) from a JetStream ack subject.

    Cheaper than nats-py's full ``Msg.metadata`` parse, the costliest step per message. Layouts
    (ADR-15, github.com/nats-io/nats-architecture-and-design):
    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` and
    ``$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.…`` (12+ tokens).
    """
    tokens = reply.split(".")
    try:
        if len(tokens) == 9:
            return int(tokens[4]), int(tokens[5])
        if len(tokens) >= 12:
            return int(tokens[6]), int(tokens[7])
    except ValueError:
        pass
    return 1, None


class Receiver(Generic[T]):
    """One subscription (JetStream consumer or core subscriber) with retries and dead letters."""

    def __init__(
        self,
        bus: ReceiverHost,
        service: str,
        decode: Decoder[T],
        handler: Handler[T] | None,
        name: str,
        *,
        jetstream: bool,
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
        self.jetstream = jetstream
        self.sub: Any = None
        self._stopping = False
        self._cb_task: asyncio.Task[Any] | None = None
        self._buffer: list[tuple[InboundMsg, T, Delivery]] = []
        self._returned: list[InboundMsg] = []
        self._drained = False

    @property
    def name(self) -> str:
        """The durable name (JetStream) or the subject (core NATS)."""
        return self._name

    async def stop(self) -> None:
        """Stop receiving (see :class:`shared.infra.busapi.Subscription`)."""
        if self._stopping or self.sub is None:
            return
        self._stopping = True
        self.bus.forget(self)
        if asyncio.current_task() is self._cb_task:
            self.bus.spawn(self._unsubscribe())  # our own handler: finish after it returns
            return
        await self._unsubscribe()

    async def _unsubscribe(self) -> None:
        try:
            # UNSUB and a flush (the server has it), then the queued messages run through
            # on_msg, which sets them aside: nak'ed before the server knew we left, they would
            # come straight back to us, each bounce one more delivery towards a dead letter.
            await self.sub.drain()
        except Exception as exc:  # closed already, or the flush timed out (reconnecting)
            _log.info("drain_incomplete", service=self.service, error=f"{type(exc).__name__}")
        self._drained = True  # from here on_msg naks at once (a drain that failed midway)
        returned = [msg for msg, _, _ in self._buffer] + self._returned
        self._buffer, self._returned = [], []
        for msg in returned:  # back to the stream now, for the next consumer
            with contextlib.suppress(Exception):
                await msg.nak()

    async def on_msg(self, msg: InboundMsg) -> None:
        """Handle one message; never raises."""
        self._cb_task = asyncio.current_task()
        if self._stopping:
            if not self.jetstream:
                return
            if self._drained:
                with contextlib.suppress(Exception):
                    await msg.nak()
            else:
                self._returned.append(msg)  # nak'ed once the unsubscribe is through
            return
        received_at = time.time()
        num, seq = ack_fields(msg.reply) if self.jetstream else (1, None)
        subject = self.bus.plain_subject(msg.subject)
        headers: Mapping[str, str] = msg.headers or {}
        if self.jetstream and num > self.bus.max_deliver:
            reason = f"not acknowledged after {num - 1} deliveries"
            await self._reject(msg, subject, headers, reason, received_at, num)
            return
        try:
            value = self.decode(msg.data)
        except Exception as exc:  # ContractError, or a decoder bug: retrying cannot help
            await self._reject(msg, subject, headers, exc, received_at, num)
            return
        delivery = Delivery(subject, headers, num, seq, received_at)
        if self.batch_handler is None:
            await self._handle_one(msg, value, delivery)
            return
        self._buffer.append((msg, value, delivery))
        if len(self._buffer) >= self.max_batch or not self.sub.pending_msgs:
            await self._flush()

    async def _flush(self) -> None:
        batch, self._buffer = self._buffer, []
        assert self.batch_handler is not None
        try:
            await self.batch_handler([(value, delivery) for _, value, delivery in batch])
        except Exception:
            if len(batch) > 1:
                _log.info("batch_failed_retrying_singly", service=self.service, size=len(batch))
            for msg, value, delivery in batch:  # isolate the bad one(s)
                await self._handle_one(msg, value, delivery)
            return
        for msg, _, _ in batch:
            await msg.ack()

    async def _handle_one(self, msg: InboundMsg, value: T, delivery: Delivery) -> None:
        try:
            if self.handler is not None:
                await self.handler(value, delivery)
            else:
                assert self.batch_handler is not None
                await self.batch_handler([(value, delivery)])
        except Exception as exc:
            await self._failed(msg, delivery, exc)
            return
        if self.jetstream:
            await msg.ack()

    async def _failed(self, msg: InboundMsg, d: Delivery, exc: Exception) -> None:
        num = d.num_delivered
        if not self.jetstream or num >= self.bus.max_deliver:
            error = f"handler failed on delivery {num}: {type(exc).__name__}: {exc}"
            await self._reject(msg, d.subject, d.headers, error, d.received_at, num, exc)
            return
        delay = backoff_delay(num, self.bus.retry_backoff_s, self.bus.max_backoff_s)
        _log.info(
            "handler_retry",
            service=self.service,
            subject=d.subject,
            delivery=num,
            delay_s=delay,
            error=f"{type(exc).__name__}: {exc}",
        )
        await msg.nak(delay=delay or None)

    async def _reject(
        self,
        msg: InboundMsg,
        subject: str,
        headers: Mapping[str, str],
        error: BaseException | str,
        received_at: float,
        num: int,
        cause: BaseException | None = None,
    ) -> None:
        error_type = type(cause).__name__ if cause is not None else None
        ok = await self.bus.dead_letter(
            self.service, subject, msg.data, headers, error, received_at, error_type
        )
        if not self.jetstream:
            return
        if ok:
            await msg.ack()
        else:  # keep it: the DLQ is unreachable, try again later
            await msg.nak(delay=backoff_delay(num, 1.0, self.bus.max_backoff_s))
