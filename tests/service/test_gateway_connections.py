"""Client connections at the gateway (issue 40, part 2): deadlines for headers, idle keep-alive
and slow bodies, and a cap on open connections that keeps ``/healthz`` reachable.

The gateway is served as in production (:func:`services.gateway.app.serve`) on a free port, and
raw sockets play the clients, so what is checked is what a client sees: an answer, or the
connection closed by the server (EOF). Deadlines are set to fractions of a second; each wait for
an EOF or an answer is bounded at :data:`WAIT_S`, many times the deadline, so a slow machine
never fails a test and a gateway without the deadline (which keeps a connection an hour) always
does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from services.gateway.app import RELAY, create_app, serve
from shared.infra import FakeBus, Settings

WAIT_S = 10.0
"""Longest a test waits for what a deadline of under a second must bring."""
ROOT = Path(__file__).parents[2]
HALF_OPEN = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"
"""A request line and one header: headers that never end."""


RUNNING: dict[int, web.AppRunner] = {}
"""The runner of each gateway a test started, by port."""


@contextlib.asynccontextmanager
async def gateway(**limits: Any) -> AsyncIterator[int]:
    """The port of a gateway with ``limits`` (settings fields) served."""
    settings = Settings(gateway_id="gw", **limits)
    app = create_app(settings, FakeBus(), node_urls={"n1": "http://127.0.0.1:9"})
    runner = await serve(app, "127.0.0.1", 0, settings)
    port = runner.addresses[0][1]
    RUNNING[port] = runner
    try:
        yield port
    finally:
        del RUNNING[port]
        await runner.cleanup()


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded by WAIT_S)."""
    return await asyncio.wait_for(reader.read(), WAIT_S)


async def answer_of(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response's head and body (by its Content-Length)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
    sizes = [ln for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
    body = await asyncio.wait_for(reader.readexactly(int(sizes[0].split(b":")[1])), WAIT_S)
    return head, body


async def get(port: int, path: str = "/healthz") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), WAIT_S)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


class TestDeadlines:
    """A connection is closed when its headers do not end in TAO_HEADER_TIMEOUT_S, when it
    idles past TAO_KEEPALIVE_S, and a body slower than TAO_BODY_MIN_RATE is answered 408."""

    async def test_headers_that_never_end_are_closed(self) -> None:
        async with gateway(header_timeout_s=0.3) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HALF_OPEN)
            assert await closed_by_server(reader) == b""
            writer.close()

    async def test_trickled_headers_are_closed_too(self) -> None:
        """A byte every 50 ms would keep an idle timer alive, not the header deadline."""
        async with gateway(header_timeout_s=0.3) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(HALF_OPEN)
            for _ in range(int(WAIT_S / 0.05)):
                if reader.at_eof():
                    break
                try:
                    writer.write(b"X")
                    await writer.drain()
                except ConnectionError:
                    break
                try:
                    await asyncio.wait_for(reader.read(1), 0.05)
                except TimeoutError:
                    continue
            assert await closed_by_server(reader) == b""
            writer.close()

    async def test_an_idle_keep_alive_connection_is_closed(self) -> None:
        async with gateway(keepalive_s=0.3) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
            head, _ = await answer_of(reader)
            assert head.startswith(b"HTTP/1.1 200")
            assert await closed_by_server(reader) == b""
            writer.close()

    async def test_a_body_that_stops_arriving_is_408_naming_the_rate(self) -> None:
        async with gateway(body_timeout_s=0.3, body_min_rate=1000.0) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Session-ID: s1\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"model":'
            )
            head, body = await answer_of(reader)
            assert head.startswith(b"HTTP/1.1 408"), head
            assert b"connection: close" in head.lower()
            assert "TAO_BODY_MIN_RATE" in orjson.loads(body)["error"]["message"]
            writer.close()


class TestConnectionCap:
    """At TAO_MAX_CONNECTIONS the oldest connection not serving a request gives way to a new
    one; when every one is serving, the new one is answered 503 and closed."""

    async def test_silent_connections_give_way_to_healthz(self) -> None:
        async with gateway(max_connections=4) as port:
            silent = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
            for _, writer in silent:
                writer.write(HALF_OPEN)
                await writer.drain()
            status, body = await get(port)
            assert status == 200 and orjson.loads(body)["status"] == "ok"
            oldest_reader, _ = silent[0]
            assert await closed_by_server(oldest_reader) == b""
            for _, writer in silent:
                writer.close()

    async def test_when_every_connection_serves_a_new_one_is_503(self) -> None:
        async with gateway(max_connections=2, hold_timeout_s=30.0) as port:
            held: list[Any] = []
            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            for sid in ("a", "b"):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(
                    f"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Session-ID: {sid}\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
                held.append((reader, writer))
            holds = RUNNING[port].app[RELAY].holds
            for _ in range(int(WAIT_S / 0.01)):  # until both requests are held (bounded)
                if holds.held() == 2:
                    break
                await asyncio.sleep(0.01)
            assert holds.held() == 2
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head, body = await answer_of(reader)
            assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
            assert b"too many open connections" in body
            assert await closed_by_server(reader) == b""
            writer.close()
            for _, writer in held:
                writer.close()


SERVE = """
import asyncio, sys
from services.gateway.app import RELAY, create_app, serve
from shared.infra import FakeBus, Settings

async def main() -> None:
    settings = Settings(gateway_id="gw")
    app = create_app(settings, FakeBus(), node_urls={"n1": "http://127.0.0.1:9"})
    runner = await serve(app, "127.0.0.1", 0, settings)
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


class TestFileLimit:
    """300 connections that send a request line and one header, against a file limit of 256,
    exhaust nothing: the gateway keeps under its limit and /healthz answers."""

    async def test_300_half_open_connections_under_ulimit_256(self) -> None:
        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=limit,
        )
        conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            port = int(line)
            for _ in range(300):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(HALF_OPEN)
                conns.append((reader, writer))
            await asyncio.gather(*(w.drain() for _, w in conns), return_exceptions=True)
            status, body = await get(port)
            assert status == 200 and orjson.loads(body)["status"] == "ok"
            assert proc.poll() is None
        finally:
            for _, writer in conns:
                writer.close()
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert b"Too many open files" not in err, err[-2000:]
