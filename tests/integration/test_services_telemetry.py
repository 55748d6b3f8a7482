"""telemetry → tools → valuation → planner with a sim node, on real NATS and Redis.

The node record comes from telemetry scraping a running sim node (``services.simnode``), not
from the test: a request for the node's model is admitted there. (Residency from responses is
covered by the service tests, where the fake bus can be settled; no message announces it.)
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as aioredis
from aiohttp import web

from services.planner import app as planner_app
from services.simnode.app import SimNodeConfig, create_app
from services.telemetry import app as telemetry_app
from services.tools import app as tools_app
from services.valuation import app as valuation_app
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.node import NodeStatus
from shared.contracts.plan import Placement
from shared.contracts.session import SessionRequest
from shared.infra import Bus, Delivery, NodeSpec, Settings
from shared.infra.runner import run_service_async
from shared.infra.store import Store

GW = "gw1"
TIMEOUT_S = 60.0


@pytest.fixture
async def sim_url() -> AsyncIterator[str]:
    runner = web.AppRunner(create_app(SimNodeConfig("sim1", kv_tokens=65_536)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


class TestWithSimNode:
    async def test_scraped_node_status_and_admission(
        self, nats_url: str, redis_url: str, namespace: str, sim_url: str
    ) -> None:
        """Telemetry publishes the sim node's status from its scrape, and a request for the
        node's model is admitted on it."""
        settings = Settings(
            nats_url=nats_url,
            redis_url=redis_url,
            namespace=namespace,
            domain="d" + uuid.uuid4().hex[:12],
            tick_s=0.05,
            nodes=(NodeSpec("sim1", sim_url),),
            log_level="warning",
        )
        bus = await Bus.connect(nats_url, name="test", namespace=namespace)
        await bus.ensure_streams()
        client = aioredis.Redis.from_url(redis_url)
        store = Store(client, settings.domain)
        statuses: list[NodeStatus] = []
        placed: list[Placement] = []
        got_status, got_admit = asyncio.Event(), asyncio.Event()

        async def on_status(msg: NodeStatus, d: Delivery) -> None:
            statuses.append(msg)
            got_status.set()

        async def on_placement(msg: Placement, d: Delivery) -> None:
            placed.append(msg)
            got_admit.set()

        await bus.subscribe(
            subjects.node_status("sim1"), "test", lambda b: decode(b, NodeStatus), on_status
        )
        await bus.consume(
            subjects.STREAM_PLACEMENT,
            "gateway",
            lambda b: decode(b, Placement),
            on_placement,
            filter_subject=subjects.placement(GW),
            ephemeral=True,
        )
        tasks = [
            asyncio.create_task(run_service_async(name, main, settings=settings, needs_redis=True))
            for name, main in (
                ("telemetry", telemetry_app.main),
                ("tools", tools_app.main),
                ("valuation", valuation_app.main),
                ("planner", planner_app.main),
            )
        ]
        try:
            with anyio.fail_after(TIMEOUT_S):
                await got_status.wait()
            assert statuses[0].healthy and statuses[0].capacity_tokens == 65_536
            assert statuses[0].models == ["tao-sim"]
            await bus.publish_msg(
                SessionRequest(
                    session_id="s1",
                    request_id="r1",
                    model="tao-sim",
                    arrived_at=1.0,
                    gateway_id=GW,
                    prompt_tokens_estimate=2_000,
                )
            )
            with anyio.fail_after(TIMEOUT_S):
                await got_admit.wait()
            assert [(p.kind, p.node_id) for p in placed] == [("admit", "sim1")]
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await bus.delete_streams()
            await bus.drain()
            await store.clear()
            await client.aclose()
