"""The runner and the durable position against the real servers (NATS + Redis)."""

from __future__ import annotations

import asyncio

from shared.contracts import ToolEvent, ToolStart, decode_tool_event, subjects
from shared.infra import Bus, Delivery, ServiceContext, Settings, Subscription
from shared.infra.runner import EXIT_OK, run_service_async


class TestRunnerWithRealServers:
    async def test_service_connects_publishes_and_exits_cleanly(
        self, nats_url: str, redis_url: str, namespace: str
    ) -> None:
        """run_service_async connects the bus (streams made) and Redis, runs main, exits 0."""
        settings = Settings(nats_url=nats_url, redis_url=redis_url, namespace=namespace)
        seen: list[bytes | None] = []

        async def main(s: Settings, ctx: ServiceContext) -> None:
            await ctx.require_bus().publish_msg(
                ToolStart(session_id="s", call_id="c", tool="bash", started_at=1.0)
            )
            await ctx.redis.set(f"{namespace}:probe", b"1")
            seen.append(await ctx.redis.get(f"{namespace}:probe"))
            await ctx.redis.delete(f"{namespace}:probe")

        code = await run_service_async("tools", main, settings=settings, needs_redis=True)
        assert code == EXIT_OK and seen == [b"1"]
        check = await Bus.connect(nats_url, name="check", namespace=namespace)
        info = await check.nc.jetstream().stream_info(check.stream_name(subjects.STREAM_TOOL))
        assert info.state.messages == 1  # the stream existed and got the publish
        await check.delete_streams()
        await check.drain()


class TestDurableAcrossConnections:
    async def test_new_connection_resumes_the_durable(self, nats_url: str, namespace: str) -> None:
        """A consumer that stops after 40 and closes its connection leaves the other 60 to a
        consumer on a new connection with the same durable, each exactly once."""
        # ack wait 2 s: messages in flight when the first consumer stops come back in time
        first_bus = await Bus.connect(nats_url, name="first", namespace=namespace, ack_wait_s=2.0)
        await first_bus.ensure_streams()
        for i in range(100):
            await first_bus.publish_msg(
                ToolStart(session_id="s", call_id=f"c{i:03d}", tool="b", started_at=1.0)
            )
        first: list[str] = []
        stopped = asyncio.Event()
        holder: list[Subscription] = []

        async def take_forty(value: ToolEvent, delivery: Delivery) -> None:
            first.append(value.call_id)
            if len(first) == 40:
                await holder[0].stop()
                stopped.set()

        holder.append(
            await first_bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, take_forty)
        )
        async with asyncio.timeout(10):
            await stopped.wait()
        await first_bus.drain()

        second_bus = await Bus.connect(nats_url, name="second", namespace=namespace, ack_wait_s=2.0)
        rest: list[str] = []
        done = asyncio.Event()

        async def take_rest(value: ToolEvent, delivery: Delivery) -> None:
            rest.append(value.call_id)
            if len(rest) == 60:
                done.set()

        await second_bus.consume(subjects.STREAM_TOOL, "tools", decode_tool_event, take_rest)
        try:
            async with asyncio.timeout(10):
                await done.wait()
            assert first == [f"c{i:03d}" for i in range(40)]
            assert sorted(rest) == [f"c{i:03d}" for i in range(40, 100)]
            assert len(rest) == 60
        finally:
            await second_bus.delete_streams()
            await second_bus.drain()
