"""The gateway beyond loopback with its own key (secure by default, :mod:`services.gateway.
gatewaykey`): requests and hooks need the key, probes stay open, and the key is one implicit
tenant whose sessions keep the clients' own ids.

The real app on an in-memory bus, forwarding to the stub node of ``test_gateway_service``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.gateway.app import HOOKS
from shared.contracts import SessionRequest
from shared.infra.tenants import TENANT_HEADER
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness

KEY = "tao-gw-test-key-0123456789"
BEYOND = SETTINGS.replace(gateway_host="0.0.0.0", gateway_key=KEY, hook_burst=10_000)
FIXTURES = Path(__file__).parents[1] / "fixtures"
HOOK_DIRS = {"claude-code": "claude", "opencode": "opencode", "openhands": "openhands",
             "mini-swe-agent": "miniswe"}  # fmt: skip
HOOK_BODY = b'{"session_id": "s1", "hook_event_name": "Stop"}'


@pytest.fixture
async def g() -> AsyncIterator[Harness]:
    async for harness in make_harness(BEYOND):
        yield harness


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def hook_posts(g: Harness) -> list[tuple[bytes, dict[str, str]]]:
    """The hook payloads the gateway forwarded so far (once its queue task published all)."""
    await asyncio.wait_for(g.client.server.app[HOOKS].queue.join(), 10)
    return [(b, h) for s, b, h in g.bus.published if s.startswith("tao.v1.hook.")]


class TestRequests:
    @pytest.mark.parametrize(
        "headers",
        [{}, bearer("wrong"), {"x-api-key": "wrong"}, {"Authorization": f"Basic {KEY}"}],
        ids=["none", "wrong-bearer", "wrong-x-api-key", "basic"],
    )
    async def test_without_the_key_401_and_nothing_published(
        self, g: Harness, headers: dict[str, str]
    ) -> None:
        resp = await g.chat("s1", headers=headers)
        assert resp.status == 401
        error = (await resp.json())["error"]
        assert error["type"] == "invalid_request_error" and "API key" in error["message"]
        assert g.bus.published == [] and g.node.bodies == []
        assert g.relay.metrics.requests.get(endpoint="chat", outcome="unauthorized") == 1

    async def test_messages_401_in_anthropic_shape(self, g: Harness) -> None:
        resp = await g.client.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
        )
        assert resp.status == 401
        body = await resp.json()
        assert (body["type"], body["error"]["type"]) == ("error", "authentication_error")

    @pytest.mark.parametrize(
        "headers", [bearer(KEY), {"x-api-key": KEY}], ids=["bearer", "x-api-key"]
    )
    async def test_with_the_key_served_under_the_clients_own_id(
        self, g: Harness, headers: dict[str, str]
    ) -> None:
        """The key's tenant is implicit: session ids are not prefixed, and the key is not
        passed on to the node."""
        task = asyncio.create_task(g.chat("s1", headers=headers))
        [req] = await g.rec.next(SessionRequest)
        assert req.session_id == "s1"
        await g.place("admit", "s1", 1)
        resp = await task
        assert resp.status == 200
        [sent] = g.node.headers
        assert sent["X-Session-ID"] == "s1"
        assert all(KEY not in str(value) for value in sent.values())

    async def test_models_and_delete_need_the_key(self, g: Harness) -> None:
        assert (await g.client.get("/v1/models")).status == 401
        assert (await g.client.get("/v1/models", headers=bearer(KEY))).status == 200
        assert (await g.client.delete("/v1/sessions/s1")).status == 401
        assert (await g.client.delete("/v1/sessions/s1", headers=bearer(KEY))).status == 200

    @pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
    async def test_probes_stay_open(self, g: Harness, path: str) -> None:
        assert (await g.client.get(path)).status == 200


class TestHooks:
    async def test_hooks_need_the_key_and_carry_no_tenant(self, g: Harness) -> None:
        for headers in ({}, bearer("wrong"), {"X-TAO-Hook-Token": "wrong"}):
            resp = await g.client.post("/hooks/claude", data=HOOK_BODY, headers=headers)
            assert resp.status == 401
            assert "hook token" in (await resp.json())["error"]["message"]
        assert g.relay.metrics.hooks.get(result="unauthorized") == 3
        for headers in (bearer(KEY), {"X-TAO-Hook-Token": KEY}):
            resp = await g.client.post("/hooks/claude", data=HOOK_BODY, headers=headers)
            assert (resp.status, await resp.json()) == (200, {})
        posts = await hook_posts(g)
        assert [body for body, _ in posts] == [HOOK_BODY, HOOK_BODY]
        assert all(TENANT_HEADER not in headers for _, headers in posts)

    async def test_every_real_hook_shape_is_accepted(self, g: Harness) -> None:
        """Each harness's recorded payloads (a file, or a line of a ``.jsonl``) still pass the
        gateway's body check and are forwarded as sent."""
        sent: list[bytes] = []
        for folder, token in HOOK_DIRS.items():
            for path in sorted((FIXTURES / folder).iterdir()):
                if path.suffix == ".json":
                    bodies = [path.read_bytes()]
                elif path.suffix == ".jsonl":
                    bodies = [ln for ln in path.read_bytes().splitlines() if ln.strip()]
                else:
                    continue
                for body in bodies:
                    resp = await g.client.post(f"/hooks/{token}", data=body, headers=bearer(KEY))
                    assert resp.status == 200, (path.name, await resp.text())
                    sent.append(body)
        assert len(sent) > 30
        assert [body for body, _ in await hook_posts(g)] == sent
        assert g.relay.metrics.hooks.get(result="bad_request") == 0


class TestSwitchedOff:
    async def test_auth_off_beyond_loopback_is_open(self) -> None:
        """TAO_GATEWAY_AUTH=off: the operator's explicit choice, no key asked."""
        settings = SETTINGS.replace(gateway_host="0.0.0.0", gateway_auth="off")
        async for g in make_harness(settings):
            task = asyncio.create_task(g.chat("s1"))
            [req] = await g.rec.next(SessionRequest)
            assert req.session_id == "s1"
            await g.place("admit", "s1", 1)
            assert (await task).status == 200
            resp = await g.client.post("/hooks/claude", data=HOOK_BODY)
            assert resp.status == 200
            assert [body for body, _ in await hook_posts(g)] == [HOOK_BODY]
