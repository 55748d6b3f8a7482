"""Bus semantics, one test body for both buses (FakeBus and real NATS + JetStream)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.contracts import (
    DeadLetter,
    NodeStatus,
    Placement,
    ToolEvent,
    ToolStart,
    decode,
    decode_tool_event,
    encode,
    subjects,
)
from shared.infra import Delivery, MessageBus, Subscription
from shared.infra.busapi import MSG_ID_HEADER
from shared.infra.errors import BusError
from tests.integration.collect import Collector, dead_letter_reader

TIMEOUT_S = 10.0


def tool_start(session: str, call: str = "c1") -> ToolStart:
    return ToolStart(session_id=session, call_id=call, tool="bash", started_at=1.0)


async def dead_letters(bus: MessageBus, service: str, n: int) -> list[DeadLetter]:
    """The first ``n`` dead letters of ``service``, read with a consumer of the DLQ stream."""
    got = await dead_letter_reader(bus, service, TIMEOUT_S)
    return [letter for letter, _ in await got.wait(n)]


class TestRoundTrip:
    async def test_published_messages_arrive_in_order_with_their_delivery(
        self, bus: MessageBus
    ) -> None:
        """Messages published on a stream reach a consumer in order, first delivery, seq rising."""
        got = Collector()
        await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, got)
        sent = [tool_start(f"s{i}") for i in range(3)]
        for msg in sent:
            await bus.publish_msg(msg, headers={"x-trace": "abc"})
        items = await got.wait(3)
        assert [v for v, _ in items] == sent
        assert [d.subject for _, d in items] == [subjects.tool_event(f"s{i}") for i in range(3)]
        assert all(d.num_delivered == 1 for _, d in items)
        assert all(d.headers.get("x-trace") == "abc" for _, d in items)
        seqs = [d.stream_seq for _, d in items]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3

    async def test_the_same_message_published_twice_is_stored_once(self, bus: MessageBus) -> None:
        """A publish retried after its ack was lost (NATS down) is a JetStream duplicate: the
        consumer sees it once; a message that differs in any byte or header is not one."""
        got = Collector()
        await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, got)
        msg = tool_start("s1")
        await bus.publish_msg(msg)
        await bus.publish_msg(msg)  # the retry
        await bus.publish_msg(msg, headers={"x-trace": "other"})  # not the same publish
        await bus.publish_msg(tool_start("s2"))
        items = await got.wait(3)
        await asyncio.sleep(0.3)  # nothing more comes (a bound, not synchronisation)
        assert [v.session_id for v, _ in got.items] == ["s1", "s1", "s2"]
        assert [d.headers.get("x-trace") for _, d in items] == [None, "other", None]
        assert all(d.headers.get(MSG_ID_HEADER) for _, d in items)

    async def test_a_message_over_the_max_payload_is_refused_with_bus_error(
        self, bus: MessageBus
    ) -> None:
        """Both buses know the server's limit (1 MiB by default) and refuse a larger publish
        with BusError, on a stream subject and on a core one; one at the limit goes."""
        assert bus.max_payload >= 1024 * 1024
        big = b"x" * (bus.max_payload + 1)
        for subject in (subjects.tool_event("s1"), subjects.valuation_snapshot()):
            with pytest.raises(BusError, match="maximum payload exceeded"):
                await bus.publish(subject, big)
        await bus.publish(subjects.valuation_snapshot(), b"x" * (bus.max_payload - 1024))

    async def test_core_subscriber_receives_node_status(self, bus: MessageBus) -> None:
        """A core-NATS subscriber gets messages on subjects no stream captures."""
        got = Collector()
        await bus.subscribe(
            subjects.node_statuses(), "valuation", lambda b: decode(b, NodeStatus), got
        )
        status = NodeStatus(node_id="n1", ts=5.0, capacity_tokens=1000)
        await bus.publish_msg(status)
        ((value, delivery),) = await got.wait(1)
        assert value == status
        assert delivery.subject == subjects.node_status("n1")
        assert delivery.stream_seq is None


class TestDurableResume:
    async def test_restarted_consumer_gets_the_rest_exactly_once(self, bus: MessageBus) -> None:
        """A consumer stops after 40 of 100; a new one on its durable gets the other 60."""
        for i in range(100):
            await bus.publish_msg(tool_start("s", call=f"c{i:03d}"))
        first: list[str] = []
        stopped = asyncio.Event()
        holder: list[Subscription] = []

        async def take_forty(value: ToolEvent, delivery: Delivery) -> None:
            first.append(value.call_id)
            if len(first) == 40:
                await holder[0].stop()  # from inside the handler: stops after this message
                stopped.set()

        holder.append(
            await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, take_forty)
        )
        async with asyncio.timeout(TIMEOUT_S):
            await stopped.wait()
        second = Collector()
        await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, second)
        rest = [v.call_id for v, _ in await second.wait(60)]
        assert first == [f"c{i:03d}" for i in range(40)]
        assert sorted(rest) == [f"c{i:03d}" for i in range(40, 100)]
        assert len(second.items) == 60
        # Set aside until the server had the unsubscribe, each came back exactly once more: a
        # nak sent before would bounce straight back to the stopping consumer, every bounce a
        # delivery counted towards the dead-letter limit.
        assert {d.num_delivered for _, d in second.items} <= {1, 2}


class TestDeadLetters:
    async def test_malformed_payload_is_dead_lettered_and_consumer_goes_on(
        self, bus: MessageBus
    ) -> None:
        """An undecodable payload goes to tao.v1.dlq.<service>; later messages still arrive."""
        got = Collector()
        await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, got)
        bad_subject = subjects.tool_event("bad")
        await bus.publish(bad_subject, b'{"type":"ToolStart","session_id":1}', {"x-id": "7"})
        await bus.publish_msg(tool_start("good"))
        ((value, _),) = await got.wait(1)
        assert value == tool_start("good")
        (letter,) = await dead_letters(bus, "tools", 1)
        assert letter.subject == bad_subject
        assert letter.service == "tools"
        assert letter.error_type == "DecodeError"
        assert "cannot decode ToolEvent" in letter.reason
        assert letter.payload == b'{"type":"ToolStart","session_id":1}'
        assert letter.headers.get("x-id") == "7"

    async def test_failing_handler_is_retried_then_dead_lettered(self, bus: MessageBus) -> None:
        """An always-failing handler sees deliveries 1..max_deliver, then the message is dead."""
        seen: list[int] = []

        async def always_fail(value: ToolEvent, delivery: Delivery) -> None:
            seen.append(delivery.num_delivered)
            raise RuntimeError("store unavailable")

        await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, always_fail)
        await bus.publish_msg(tool_start("poison"))
        (letter,) = await dead_letters(bus, "tools", 1)
        assert seen == [1, 2, 3]
        assert letter.error_type == "RuntimeError"
        assert "handler failed on delivery 3" in letter.reason
        assert "store unavailable" in letter.reason
        assert letter.payload == encode(tool_start("poison"))

    async def test_handler_that_recovers_is_not_dead_lettered(self, bus: MessageBus) -> None:
        """A handler failing once gets the message again (num_delivered 2) and it is handled."""
        attempts: list[int] = []
        done = Collector()

        async def fail_once(value: ToolEvent, delivery: Delivery) -> None:
            attempts.append(delivery.num_delivered)
            if delivery.num_delivered == 1:
                raise RuntimeError("transient")
            await done(value, delivery)

        await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, fail_once)
        await bus.publish_msg(tool_start("flaky"))
        await bus.publish_msg(tool_start("after"))
        items = await done.wait(2)
        assert sorted(v.session_id for v, _ in items) == ["after", "flaky"]
        assert attempts.count(1) == 2 and attempts.count(2) == 2

    async def test_bad_core_payload_is_dead_lettered(self, bus: MessageBus) -> None:
        """A core-NATS subscriber dead-letters a bad payload and keeps receiving."""
        got = Collector()
        await bus.subscribe(
            subjects.node_statuses(), "valuation", lambda b: decode(b, NodeStatus), got
        )
        await bus.publish(subjects.node_status("n1"), b"not json")
        await bus.publish_msg(NodeStatus(node_id="n2", ts=1.0))
        ((value, _),) = await got.wait(1)
        assert value.node_id == "n2"
        (letter,) = await dead_letters(bus, "valuation", 1)
        assert letter.subject == subjects.node_status("n1")
        assert letter.payload == b"not json"


class TestFreshPlacements:
    async def test_gateway_consumer_sees_only_new_placements_for_itself(
        self, bus: MessageBus
    ) -> None:
        """An ephemeral deliver-new consumer filtered on one gateway skips old and foreign ones."""

        def placement(gw: str, session: str) -> Placement:
            return Placement(kind="admit", session_id=session, version=1, tick=1, gateway_id=gw)

        await bus.publish_msg(placement("gwA", "old"))
        got = Collector()
        await bus.consume(
            subjects.STREAM_PLACEMENT,
            "gateway",
            lambda b: decode(b, Placement),
            got,
            filter_subject=subjects.placement("gwA"),
            ephemeral=True,
            deliver="new",
        )
        await bus.publish_msg(placement("gwB", "other"))
        await bus.publish_msg(placement("gwA", "fresh"))
        await bus.publish_msg(placement("gwA", "fresher"))
        items = await got.wait(2)
        assert [v.session_id for v, _ in items] == ["fresh", "fresher"]


class TestQueueGroups:
    async def test_queue_group_members_share_messages(self, bus: MessageBus) -> None:
        """Two core subscribers in one queue group get each message once between them."""
        both = Collector()
        members: list[str] = []

        def member(tag: str) -> Any:
            async def handle(value: NodeStatus, delivery: Delivery) -> None:
                members.append(tag)
                await both(value, delivery)

            return handle

        for tag in ("a", "b"):
            await bus.subscribe(
                subjects.node_statuses(),
                "valuation",
                lambda data: decode(data, NodeStatus),
                member(tag),
                queue="q",
            )
        for i in range(20):
            await bus.publish_msg(NodeStatus(node_id=f"n{i}", ts=1.0))
        items = await both.wait(20)
        assert sorted(v.node_id for v, _ in items) == sorted(f"n{i}" for i in range(20))
        assert len(members) == 20


class TestBatches:
    async def test_batch_consumer_gets_every_message_once(self, bus: MessageBus) -> None:
        """A batch consumer sees all 300 stored messages once, in lists no longer than max_batch."""
        for i in range(300):
            await bus.publish_msg(tool_start("s", call=f"c{i:03d}"))
        sizes: list[int] = []
        got = Collector()

        async def handle(items: list[tuple[ToolEvent, Delivery]]) -> None:
            sizes.append(len(items))
            for value, delivery in items:
                await got(value, delivery)

        await bus.consume_batch(
            subjects.STREAM_TOOL, "tools", decode_tool_event, handle, max_batch=64
        )
        items = await got.wait(300)
        assert sorted(v.call_id for v, _ in items) == [f"c{i:03d}" for i in range(300)]
        assert max(sizes) <= 64 and sum(sizes) == 300

    async def test_one_bad_message_does_not_sink_its_batch(self, bus: MessageBus) -> None:
        """When a batch fails, messages are retried alone: the good ones are handled, the bad
        one alone is dead-lettered."""
        for i in range(10):
            await bus.publish_msg(tool_start("poison" if i == 4 else f"s{i}"))
        handled: set[str] = set()
        failed_sizes: list[int] = []
        done = asyncio.Event()

        async def handle(items: list[tuple[ToolEvent, Delivery]]) -> None:
            if any(v.session_id == "poison" for v, _ in items):
                failed_sizes.append(len(items))
                raise ValueError("cannot store poison")
            handled.update(v.session_id for v, _ in items)
            if len(handled) == 9:
                done.set()

        await bus.consume_batch(subjects.STREAM_TOOL, "tools", decode_tool_event, handle)
        (letter,) = await dead_letters(bus, "tools", 1)
        async with asyncio.timeout(TIMEOUT_S):
            await done.wait()
        assert handled == {f"s{i}" for i in range(10) if i != 4}
        assert max(failed_sizes) > 1  # the poison did arrive inside a larger batch
        assert letter.subject == subjects.tool_event("poison")
        assert letter.error_type == "ValueError"
