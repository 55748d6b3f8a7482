"""Ready means ready, on real NATS and Redis: the gateway's ``/readyz`` stays 503 while the
planner loads its kernels, turns 200 only after that, and a request sent then is admitted
without any kernel being compiled for it.

The planner's warm-up is held at a gate (a slow numba compilation, made deterministic): the
test checks readiness while the planner is inside it, then opens it. tools, valuation and the
planner run through the real runner (``tests.integration.test_services_chain``'s stack); the
gateway is the real app on the same bus and store, forwarding to a stub node.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import create_app
from services.planner import app as planner_app
from services.tools import app as tools_app
from services.valuation import app as valuation_app
from shared.core import kernels
from shared.core.planner import warm_up
from tests.integration.test_gateway_bus import node_chat
from tests.integration.test_services_chain import GW, Stack, stack

__all__ = ["stack"]  # the fixture, imported

TIMEOUT_S = 60.0


def compiled() -> dict[str, int]:
    """How many signatures each planner kernel has compiled in this process."""
    return {
        name: len(fn.signatures)
        for name in dir(kernels)
        if hasattr(fn := getattr(kernels, name), "signatures")
    }


class Gate:
    """``warm_up`` held until :meth:`open`; records when it was entered and when it ended."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.done = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        assert self.release.wait(TIMEOUT_S), "the test never opened the gate"
        warm_up()
        self.done.set()


async def readyz(client: TestClient[Any, Any]) -> tuple[int, dict[str, Any]]:
    resp = await client.get("/readyz")
    return resp.status, await resp.json()


class TestReadiness:
    async def test_ready_only_after_warm_up_then_served_without_compiling(
        self, stack: Stack, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        gate = Gate()
        monkeypatch.setattr(planner_app, "warm_up", gate)
        node_app = web.Application()
        node_app.router.add_post("/v1/chat/completions", node_chat)
        node = TestServer(node_app)
        await node.start_server()
        settings = stack.settings.replace(gateway_id=GW, hold_timeout_s=TIMEOUT_S)
        app = create_app(
            settings,
            stack.bus,
            node_urls={"n1": str(node.make_url("")).rstrip("/")},
            store=stack.store,
        )
        client = TestClient(TestServer(app))
        await client.start_server()
        try:
            status, body = await readyz(client)
            assert status == 503 and "no planner is ready" in body["reason"]
            for name, main in (
                ("tools", tools_app.main),
                ("valuation", valuation_app.main),
                ("planner", planner_app.main),
            ):
                stack.start(name, main)
            assert await anyio.to_thread.run_sync(gate.entered.wait, TIMEOUT_S)
            status, body = await readyz(client)  # the planner is inside its warm-up
            assert status == 503 and body["status"] == "not_ready", body
            assert not gate.done.is_set()

            gate.release.set()
            with anyio.fail_after(TIMEOUT_S):
                while (await readyz(client))[0] != 200:
                    await anyio.sleep(0.05)  # polling the probe, as an orchestrator does
            assert gate.done.is_set()  # ready implies the kernels were loaded first
            status, body = await readyz(client)
            assert status == 200 and body["nodes_healthy"] == ["n1"]
            assert body["planner"]["warm_ms"] >= 0

            before = compiled()
            resp = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hello"}]},
                headers={"X-Session-ID": "first"},
            )
            assert resp.status == 200
            assert (await resp.json())["choices"][0]["message"]["content"] == "ok"
            if os.environ.get("NUMBA_DISABLE_JIT") != "1":
                assert sum(before.values()) > 0  # the planner loaded them in this process
                assert compiled() == before  # and compiled nothing more for the request
            rec = await stack.store.get_session("first")
            assert rec is not None and rec.node == "n1"
        finally:
            await client.close()
            await node.close()
