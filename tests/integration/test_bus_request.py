"""Request/reply on the bus (``serve`` / ``request``), one body for FakeBus and real NATS, and
telemetry's inspection responder answering over it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson
import pytest

from services.telemetry.inspect import Inspector
from shared.contracts import subjects
from shared.contracts.inspect import NodeInspect, NodeQuery, decode_reply, encode_body
from shared.contracts.kv import BlockStored, KVEventBatch
from shared.core.kvindex import KvIndex
from shared.infra import Bus, MessageBus
from shared.infra.errors import RequestError
from shared.infra.fake_store import FakeStore
from shared.infra.settings import NodeSpec
from shared.infra.store_types import NodeUpdate
from tests.inspect_contract import NODE_KEYS

TIMEOUT_S = 5.0


async def upper(body: bytes) -> bytes:
    return body.upper()


class TestRequestReply:
    async def test_request_gets_the_responders_reply(self, bus: MessageBus) -> None:
        await bus.serve(subjects.inspect("echo"), "svc", upper)
        assert await bus.request(subjects.inspect("echo"), b"hello", TIMEOUT_S) == b"HELLO"

    async def test_no_responder_is_a_request_error(self, bus: MessageBus) -> None:
        with pytest.raises(RequestError) as info:
            await bus.request(subjects.inspect("nobody"), b"{}", 0.5)
        assert info.value.subject == subjects.inspect("nobody")

    async def test_a_failing_responder_leaves_the_request_unanswered(self, bus: MessageBus) -> None:
        async def broken(body: bytes) -> bytes:
            raise RuntimeError("boom")

        await bus.serve(subjects.inspect("broken"), "svc", broken)
        with pytest.raises(RequestError):
            await bus.request(subjects.inspect("broken"), b"{}", 0.5)

    async def test_only_the_group_that_owns_the_request_replies(self, bus: MessageBus) -> None:
        """Every queue group gets each request; a responder answering ``None`` sends nothing,
        so the one group that owns the key answers (telemetry shards by node)."""

        def shard(mine: bytes) -> Callable[[bytes], Awaitable[bytes | None]]:
            async def respond(body: bytes) -> bytes | None:
                return b"from " + mine if body == mine else None

            return respond

        await bus.serve(subjects.inspect("own"), "svc-0of2", shard(b"a"))
        await bus.serve(subjects.inspect("own"), "svc-1of2", shard(b"b"))
        for _ in range(3):  # whichever group is asked first
            assert await bus.request(subjects.inspect("own"), b"a", TIMEOUT_S) == b"from a"
            assert await bus.request(subjects.inspect("own"), b"b", TIMEOUT_S) == b"from b"
        with pytest.raises(RequestError):
            await bus.request(subjects.inspect("own"), b"c", 0.5)

    async def test_stopped_responder_no_longer_answers(self, bus: MessageBus) -> None:
        sub = await bus.serve(subjects.inspect("echo"), "svc", upper)
        await sub.stop()
        with pytest.raises(RequestError):
            await bus.request(subjects.inspect("echo"), b"x", 0.5)


class TestNamespaces:
    async def test_a_request_reaches_only_its_own_namespace(
        self, nats_url: str, namespace: str
    ) -> None:
        """Two buses on one server with different namespaces do not answer each other."""
        a = await Bus.connect(nats_url, name="a", namespace=namespace + "a")
        b = await Bus.connect(nats_url, name="b", namespace=namespace + "b")
        try:
            await b.serve(subjects.inspect("echo"), "svc", upper)
            with pytest.raises(RequestError):
                await a.request(subjects.inspect("echo"), b"x", 0.5)
            assert await b.request(subjects.inspect("echo"), b"x", TIMEOUT_S) == b"X"
        finally:
            await a.drain()
            await b.drain()


class TestInspectorOverTheBus:
    async def test_node_reply_over_the_bus(self, bus: MessageBus) -> None:
        """The responder answers a NodeQuery with the exact inspect-node object."""
        index = KvIndex()
        stored = BlockStored([1, 2], None, list(range(32)), 16, None, "GPU", None)
        index.apply("n1", 7, KVEventBatch(ts=1.0, events=[stored]), 1.0)
        store = FakeStore()
        await store.put_node_status("n1", NodeUpdate(healthy=True, capacity_tokens=2048))
        await Inspector(index, store, [NodeSpec("n1", "http://n1")]).start(bus, "telemetry")
        raw = await bus.request(subjects.inspect("node"), encode_body(NodeQuery("n1")), TIMEOUT_S)
        assert decode_reply(raw, NodeInspect) == NodeInspect("n1", 2, 32, 7, 0, True, 2048)
        assert list(orjson.loads(raw)) == NODE_KEYS
