"""The gateway in front of the real sim node app: what the client sees and what is reported."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import RELAY, create_app
from services.simnode.app import SimNodeConfig
from services.simnode.app import create_app as create_simnode
from shared.infra import FakeBus, Settings
from tests.service.gateway_util import admit, reported

GW = "gwsim"


@pytest.fixture
async def env() -> AsyncIterator[tuple[FakeBus, TestClient]]:
    bus = FakeBus()
    node = TestServer(create_simnode(SimNodeConfig(node_id="n1", time_scale=100.0)))
    await node.start_server()
    app = create_app(
        Settings(gateway_id=GW, hold_timeout_s=10),
        bus,
        node_urls={"n1": str(node.make_url("")).rstrip("/")},
    )
    client = TestClient(TestServer(app))
    await client.start_server()
    await admit(bus, GW)
    try:
        yield bus, client
    finally:
        await client.close()
        await node.close()
        await bus.drain()


class TestGatewayWithSimNode:
    async def test_stream_usage_matches_what_node_reports(
        self, env: tuple[FakeBus, TestClient]
    ) -> None:
        """A client asking for usage sees the node's usage chunk; the report carries the same."""
        bus, client = env
        body: dict[str, Any] = {
            "model": "tao-sim",
            "messages": [{"role": "user", "content": "hello world " * 40}],
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        resp = await client.post("/v1/chat/completions", json=body, headers={"X-Session-ID": "s1"})
        assert resp.status == 200
        raw = await resp.read()
        chunks = [
            orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")
        ]
        usage = [c["usage"] for c in chunks if not c.get("choices") and c.get("usage")]
        assert len(usage) == 1 and raw.endswith(b"data: [DONE]\n\n")
        await client.server.app[RELAY].flush()
        [done] = reported(bus)
        assert done.usage.prompt_tokens == usage[0]["prompt_tokens"]
        assert done.usage.completion_tokens == usage[0]["completion_tokens"] == 8
        assert done.finish_reason == "length" and done.error is None and done.ttft_s is not None
