"""Embedded servers start, answer, carry a JetStream round trip, and stop (runs everywhere)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.contracts import ToolEvent, ToolStart, decode_tool_event, subjects
from shared.infra import Bus, Delivery, EmbeddedServers, embedded, nats_answers, redis_answers
from shared.infra.access import NATS_CONF, Access, write_access_dir
from shared.infra.embedded import free_port
from shared.infra.errors import EmbeddedServerError


class TestEmbeddedServers:
    async def test_start_answer_round_trip_and_stop(self, namespace: str) -> None:
        """Both servers answer on free ports, JetStream and Redis work, and both are gone after."""
        async with EmbeddedServers() as servers:
            assert servers.nats_url is not None and servers.redis_url is not None
            assert nats_answers(servers.nats_url) and redis_answers(servers.redis_url)

            bus = await Bus.connect(servers.nats_url, name="embedded-test", namespace=namespace)
            await bus.ensure_streams()
            got: asyncio.Queue[ToolEvent] = asyncio.Queue()

            async def handler(value: ToolEvent, delivery: Delivery) -> None:
                await got.put(value)

            await bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, handler)
            sent = ToolStart(session_id="s", call_id="c", tool="bash", started_at=1.0)
            await bus.publish_msg(sent)
            async with asyncio.timeout(10):
                assert await got.get() == sent
            await bus.drain()

            client = aioredis.Redis.from_url(servers.redis_url)
            await client.set(f"{namespace}:k", b"v")
            assert await client.get(f"{namespace}:k") == b"v"
            await client.aclose()
            urls = (servers.nats_url, servers.redis_url)
        assert not nats_answers(urls[0], timeout=0.2)
        assert not redis_answers(urls[1], timeout=0.2)


class TestStartFailures:
    @pytest.mark.parametrize("nats", [True, False])
    def test_a_port_taken_before_the_bind_is_drawn_again(
        self, nats: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Another process binds the drawn port first: the server exits ("address already in
        use") and is started on the next port drawn."""
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            held = taken.getsockname()[1]
            draws = iter([held])
            monkeypatch.setattr(embedded, "free_port", lambda: next(draws, None) or free_port())
            with EmbeddedServers(nats=nats, redis=not nats) as servers:
                url = servers.nats_url if nats else servers.redis_url
                assert url is not None and f":{held}" not in url
                assert (nats_answers if nats else redis_answers)(url)

    def test_a_server_that_exits_says_why(self, tmp_path: Path) -> None:
        """The error carries the server's own last words (its folder is gone by then)."""
        (tmp_path / NATS_CONF).write_text("listen: {{{ not a config\n")
        with pytest.raises(EmbeddedServerError, match=r"nats-server: exited with code \d+: .*\S"):
            EmbeddedServers(nats=True, redis=False, access_dir=tmp_path).start()

    def test_relative_folders_are_the_callers(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An access folder and a data folder named relative to the caller's working directory
        (the servers themselves run in the data folder)."""
        monkeypatch.chdir(tmp_path)
        write_access_dir(Access.new(namespaces=["rel"]), tmp_path / "access")
        with EmbeddedServers(access_dir="access", data_dir="data") as servers:
            assert servers.nats_url is not None and servers.redis_url is not None
            assert (tmp_path / "data" / "nats").is_dir()
