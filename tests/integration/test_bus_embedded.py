"""Embedded servers start, answer, carry a JetStream round trip, and stop (runs everywhere)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.contracts import ToolEvent, ToolStart, decode_tool_event, subjects
from shared.infra import Bus, Delivery, EmbeddedServers, nats_answers, redis_answers


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
