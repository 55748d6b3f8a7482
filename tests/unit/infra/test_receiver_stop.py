"""Receiver.stop's ordering contract, with a stand-in subscription whose drain behaves as
nats-py's (UNSUB, flush, then the queued messages through the callback) or fails midway.

The real-NATS side (no message comes back more than once after a stop) is
tests/integration/test_bus_semantics.py::TestDurableResume; these cover what a live server
cannot be made to do on cue: a drain whose flush times out."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import nats.errors

from shared.infra.receiver import Receiver


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []


class StubMsg:
    reply = "$JS.ACK.STREAM.durable.1.7.7.0.0"  # delivery 1, stream seq 7
    subject = "tao.v1.tool.start"
    headers = None

    def __init__(self, log: Log, name: str) -> None:
        self.log, self.name = log, name
        self.data = name.encode()

    async def nak(self, delay: float | None = None) -> None:
        self.log.events.append(f"nak {self.name}")

    async def ack(self) -> None:
        self.log.events.append(f"ack {self.name}")


class StubSub:
    """Drains like nats-py: UNSUB + flush, then the queued messages run through on_msg."""

    def __init__(self, log: Log, queued: list[StubMsg], *, flush_fails: bool = False) -> None:
        self.log, self.queued, self.flush_fails = log, queued, flush_fails
        self.receiver: Receiver[Any] | None = None
        self.pending_msgs = 0

    async def drain(self) -> None:
        self.log.events.append("unsub")
        if self.flush_fails:
            raise nats.errors.FlushTimeoutError
        self.log.events.append("flushed")
        assert self.receiver is not None
        for msg in self.queued:
            await self.receiver.on_msg(msg)  # type: ignore[arg-type]


class StubBus:
    max_deliver = 5

    def __init__(self) -> None:
        self.spawned: list[Coroutine[Any, Any, None]] = []

    def forget(self, receiver: object) -> None:
        pass

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self.spawned.append(coro)  # run by the test, when it chooses

    def plain_subject(self, subject: str) -> str:
        return subject


def receiver(sub: StubSub, handler: Any = None) -> tuple[Receiver[Any], StubBus]:
    async def refuse(value: Any, delivery: Any) -> None:
        raise AssertionError("no message is handled while stopping")

    bus = StubBus()
    r: Receiver[Any] = Receiver(
        bus,  # type: ignore[arg-type]
        "svc",
        lambda b: b,
        handler or refuse,
        "svc-durable",
        jetstream=True,
    )
    r.sub = sub
    sub.receiver = r
    return r, bus


async def test_stopped_from_its_handler_the_next_message_waits_for_the_unsubscribe() -> None:
    """The handler stops its own subscription; the message queued behind it reaches on_msg
    before the (spawned) drain has run. Nak'ed then, the server would hand it straight back to
    this consumer; it is held until the UNSUB is through."""
    log = Log()
    sub = StubSub(log, [])
    holder: list[Receiver[Any]] = []

    async def stop_after_first(value: Any, delivery: Any) -> None:
        log.events.append(f"handled {value.decode()}")
        await holder[0].stop()

    r, bus = receiver(sub, stop_after_first)
    holder.append(r)
    await r.on_msg(StubMsg(log, "first"))  # type: ignore[arg-type]
    await r.on_msg(StubMsg(log, "queued"))  # type: ignore[arg-type]
    assert log.events == ["handled first", "ack first"]
    (drain,) = bus.spawned
    await drain
    assert log.events == ["handled first", "ack first", "unsub", "flushed", "nak queued"]


async def test_queued_messages_are_nakd_only_after_the_server_has_the_unsubscribe() -> None:
    log = Log()
    sub = StubSub(log, [StubMsg(log, "a"), StubMsg(log, "b")])
    await receiver(sub)[0].stop()
    assert log.events == ["unsub", "flushed", "nak a", "nak b"]


async def test_after_a_drain_that_failed_midway_late_messages_are_nakd_at_once() -> None:
    """The flush timed out: the subscription may still deliver; nothing may wait in a list
    that is never sent back."""
    log = Log()
    sub = StubSub(log, [], flush_fails=True)
    r, _ = receiver(sub)
    await r.stop()
    await r.on_msg(StubMsg(log, "late"))  # type: ignore[arg-type]
    assert log.events == ["unsub", "nak late"]
