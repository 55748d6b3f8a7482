"""``Bus.connect`` options for short-lived clients (``tao inspect``), on real NATS."""

from __future__ import annotations

import asyncio

import pytest

from shared.contracts import subjects
from shared.infra import Bus
from shared.infra.embedded import free_port
from shared.infra.errors import BusError


async def upper(body: bytes) -> bytes:
    return body.upper()


class TestConnectOptions:
    async def test_default_client_reconnects_and_logs(self, nats_url: str, namespace: str) -> None:
        """A service's bus re-establishes a lost connection forever."""
        bus = await Bus.connect(nats_url, name="svc", namespace=namespace)
        try:
            opts = bus.nc.options
            assert opts["allow_reconnect"] is True and opts["max_reconnect_attempts"] == -1
        finally:
            await bus.drain()

    async def test_one_shot_client_does_not_reconnect_and_is_quiet(
        self, nats_url: str, namespace: str
    ) -> None:
        """allow_reconnect=False fails fast; quiet=True swaps the logging error callback; the
        bus still works in its namespace."""
        server = await Bus.connect(nats_url, name="svc", namespace=namespace)
        bus = await Bus.connect(
            nats_url, name="once", namespace=namespace, allow_reconnect=False, quiet=True
        )
        try:
            opts = bus.nc.options
            assert opts["allow_reconnect"] is False and opts["max_reconnect_attempts"] == 0
            assert bus.nc._error_cb is not server.nc._error_cb
            await server.serve(subjects.inspect("echo"), "svc", upper)
            assert await bus.request(subjects.inspect("echo"), b"hi", 5.0) == b"HI"
        finally:
            await bus.drain()
            await server.drain()

    @pytest.mark.parametrize("allow_reconnect", [False, True])
    async def test_refused_port_fails_within_the_timeout(self, allow_reconnect: bool) -> None:
        """A port nobody listens on is a BusError after ``connect_timeout_s`` (nats-py's own
        connect() retries it forever), for one-shot clients and services alike."""
        url = f"nats://127.0.0.1:{free_port()}"
        with pytest.raises(BusError, match=r"cannot connect to NATS at .*: no connection within"):
            await asyncio.wait_for(
                Bus.connect(
                    url,
                    name="x",
                    connect_timeout_s=1.0,
                    allow_reconnect=allow_reconnect,
                    quiet=True,
                ),
                30.0,  # the old behaviour: this would time out instead of raising BusError
            )


class TestBacklog:
    async def test_counts_the_undelivered_and_the_unacknowledged(
        self, nats_url: str, namespace: str
    ) -> None:
        """A durable's backlog is what it has not settled: 5 before it starts, still 5 while
        its handler holds the first one unacknowledged, 0 once all are acknowledged; an
        unknown durable is a BusError naming it."""
        from shared.contracts import ToolStart, decode_tool_event

        bus = await Bus.connect(nats_url, name="svc", namespace=namespace)
        durable = subjects.durable_name("tools", subjects.STREAM_TOOL)
        release = asyncio.Event()
        taken = asyncio.Event()
        held = 0

        async def hold(value: object, delivery: object) -> None:
            nonlocal held
            held += 1
            taken.set()
            await release.wait()

        try:
            await bus.ensure_streams()
            # a first consumer creates the durable; stopping it leaves the durable on the server
            # (its drain's UNSUB reaches the server before the drain returns: TestFlushOrder)
            sub = await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, hold)
            await sub.stop()
            for i in range(5):
                await bus.publish_msg(
                    ToolStart(session_id=f"s{i}", call_id="c", tool="bash", started_at=1.0)
                )
            assert await bus.backlog(subjects.STREAM_TOOL, durable) == 5
            await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, hold)
            async with asyncio.timeout(10.0):
                await taken.wait()
            assert await bus.backlog(subjects.STREAM_TOOL, durable) == 5
            release.set()
            async with asyncio.timeout(10.0):
                while await bus.backlog(subjects.STREAM_TOOL, durable):
                    await asyncio.sleep(0.05)
            assert held == 5
            with pytest.raises(BusError, match="nobody-TAO_V1_TOOL"):
                await bus.backlog(subjects.STREAM_TOOL, "nobody-TAO_V1_TOOL")
        finally:
            await bus.delete_streams()
            await bus.drain()


class _WireLog:
    """Every byte a bus's nats-py client hands its socket, in order."""

    def __init__(self, bus: Bus, monkeypatch: pytest.MonkeyPatch) -> None:
        self.chunks: list[bytes] = []
        transport = bus.nc._transport
        assert transport is not None
        write, writelines = transport.write, transport.writelines

        def on_write(data: bytes) -> None:
            self.chunks.append(bytes(data))
            write(data)

        def on_writelines(lines: list[bytes]) -> None:
            self.chunks.extend(bytes(line) for line in lines)
            writelines(lines)

        monkeypatch.setattr(transport, "write", on_write)
        monkeypatch.setattr(transport, "writelines", on_writelines)

    @property
    def wire(self) -> bytes:
        return b"".join(self.chunks)


class TestFlushOrder:
    """A flush's PING follows every command queued before it, so its PONG means the server has
    read them. nats-py writes the PING straight to the socket while those commands wait for its
    flusher task (``_Client`` in shared/infra/bus.py says how that failed); with nats-py's own
    client each check below sees the PING first."""

    async def test_serve_returns_once_the_server_has_the_subscription(
        self, nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        bus = await Bus.connect(nats_url, name="svc", namespace=namespace)
        other = await Bus.connect(nats_url, name="other", namespace=namespace)
        try:
            log = _WireLog(bus, monkeypatch)
            await bus.serve(subjects.inspect("echo"), "svc", upper)
            wire = log.wire
            sub = wire.index(b"SUB " + bus.wire_subject(subjects.inspect("echo")).encode())
            assert sub < wire.rindex(b"PING\r\n")
            # and so another connection's request finds it at once
            assert await other.request(subjects.inspect("echo"), b"hi", 5.0) == b"HI"
        finally:
            await other.drain()
            await bus.drain()

    async def test_a_stopped_consumer_has_left_the_server_when_stop_returns(
        self, nats_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The drain's UNSUB precedes its PING, so when ``stop`` returns the server has read
        it and delivers nothing more to the subscription the client drops."""
        bus = await Bus.connect(nats_url, name="svc", namespace=namespace)

        async def ignore(value: object, delivery: object) -> None:
            return None

        try:
            await bus.ensure_streams()
            sub = await bus.consume(subjects.STREAM_TOOL, "tools", bytes, ignore)
            log = _WireLog(bus, monkeypatch)
            await sub.stop()
            stopped = log.wire
            assert stopped.index(b"UNSUB ") < stopped.rindex(b"PING\r\n")
        finally:
            await bus.delete_streams()
            await bus.drain()


class TestCorePublishLeavesNow:
    async def test_the_message_is_on_the_socket_when_publish_returns(
        self, nats_url: str, namespace: str
    ) -> None:
        """nats-py queues a publish for its flusher task; the bus yields once so the flusher
        has written it by the time ``publish`` returns (a wake-up is not held back by the
        publisher's log line): nothing is left pending, and a subscriber gets it."""
        from shared.contracts import Wake, encode

        bus = await Bus.connect(nats_url, name="svc", namespace=namespace)
        got: asyncio.Queue[object] = asyncio.Queue()

        async def take(value: object, delivery: object) -> None:
            await got.put(value)

        try:
            await bus.subscribe(subjects.wake(), "valuation", lambda b: b, take)
            data = encode(Wake(reason="test", ts=1.0))
            for _ in range(3):
                await bus.publish(subjects.wake(), data)
                assert bus.nc._pending_data_size == 0
            async with asyncio.timeout(5.0):
                assert [await got.get() for _ in range(3)] == [data] * 3
        finally:
            await bus.drain()
