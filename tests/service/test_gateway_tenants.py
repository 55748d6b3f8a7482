"""The gateway with a tenants file: API keys, namespaced sessions, hook tokens, held limits.

The real app on an in-memory bus, forwarding to the stub node of ``test_gateway_service``.
Every forged or cross-tenant attempt here must be rejected or land in its own tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from shared.contracts import SessionCancel, SessionEnd, SessionRequest, subjects
from shared.infra.tenants import TENANT_HEADER, add_secret
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness


class Keys:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.a = add_secret(path, "team-a", "api", max_held=2)
        self.b = add_secret(path, "team-b", "api")
        self.hook_a = add_secret(path, "team-a", "hook")


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "tenants.toml")


@pytest.fixture
async def g(keys: Keys) -> AsyncIterator[Harness]:
    settings = SETTINGS.replace(tenants_file=str(keys.path), node_api_key="node-secret")
    async for harness in make_harness(settings):
        yield harness


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class TestApiKeys:
    @pytest.mark.parametrize(
        "headers",
        [
            {},
            {"Authorization": "Bearer tao-api-forged"},
            {"x-api-key": "wrong"},
            {"Authorization": "Basic dGVhbS1hOng="},
        ],
        ids=["none", "forged", "wrong-x-api-key", "basic"],
    )
    async def test_without_a_known_key_401_and_nothing_published(
        self, g: Harness, headers: dict[str, str]
    ) -> None:
        resp = await g.chat("s1", headers=headers)
        assert resp.status == 401
        body = await resp.json()
        error = body["error"]
        assert error["type"] == "invalid_request_error" and "API key" in error["message"]
        assert g.bus.published == [] and g.node.bodies == []
        assert g.relay.metrics.requests.get(endpoint="chat", outcome="unauthorized") == 1

    async def test_messages_401_in_anthropic_shape(self, g: Harness) -> None:
        resp = await g.client.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]},
            headers={"x-api-key": "forged"},
        )
        assert resp.status == 401
        body = await resp.json()
        assert (body["type"], body["error"]["type"]) == ("error", "authentication_error")

    async def test_sessions_are_the_tenants_own(self, g: Harness, keys: Keys) -> None:
        """Both tenants name session "s1": two sessions, each kept under its tenant."""
        ta = asyncio.create_task(g.chat("s1", headers=bearer(keys.a)))
        tb = asyncio.create_task(g.chat("s1", headers={"x-api-key": keys.b}))
        reqs = await g.rec.next(SessionRequest, 2)
        assert sorted(r.session_id for r in reqs) == ["team-a:s1", "team-b:s1"]
        await g.place("admit", "team-a:s1", 1)
        resp = await ta
        assert resp.status == 200
        assert not tb.done()  # admitting team-a's s1 did not admit team-b's
        await g.place("admit", "team-b:s1", 1)
        assert (await tb).status == 200
        # the node sees the kept id and the gateway's own key, never a client's key
        assert [h["X-Session-ID"] for h in g.node.headers] == ["team-a:s1", "team-b:s1"]
        assert {h["Authorization"] for h in g.node.headers} == {"Bearer node-secret"}
        assert all("x-api-key" not in {k.lower() for k in h} for h in g.node.headers)

    async def test_a_client_cannot_name_another_tenants_session(
        self, g: Harness, keys: Keys
    ) -> None:
        """team-b sending the id "team-a:s1" gets its own "team-b:team-a:s1"."""
        task = asyncio.create_task(g.chat("team-a:s1", headers=bearer(keys.b)))
        [req] = await g.rec.next(SessionRequest)
        assert req.session_id == "team-b:team-a:s1"
        await g.place("admit", "team-a:s1", 1)
        await asyncio.sleep(0.05)
        assert not task.done()
        task.cancel()

    async def test_delete_ends_only_the_callers_session(self, g: Harness, keys: Keys) -> None:
        held = asyncio.create_task(g.chat("s1", headers=bearer(keys.a)))
        await g.rec.next(SessionRequest)
        forged = await g.client.delete("/v1/sessions/s1", headers=bearer("tao-api-forged"))
        assert forged.status == 401
        other = await g.client.delete("/v1/sessions/s1", headers=bearer(keys.b))
        assert other.status == 200 and (await other.json())["id"] == "s1"
        [end] = await g.rec.next(SessionEnd)
        assert end.session_id == "team-b:s1"  # team-b ended its own (unknown) session
        assert not held.done() and g.rec.of(SessionCancel) == []
        own = await g.client.delete("/v1/sessions/s1", headers=bearer(keys.a))
        assert own.status == 200
        assert (await held).status == 409
        [cancel] = await g.rec.next(SessionCancel)
        assert cancel.session_id == "team-a:s1"

    async def test_models_need_a_key(self, g: Harness, keys: Keys) -> None:
        assert (await g.client.get("/v1/models")).status == 401
        assert (await g.client.get("/v1/models", headers=bearer(keys.a))).status == 200

    async def test_health_and_metrics_stay_open(self, g: Harness) -> None:
        assert (await g.client.get("/healthz")).status == 200
        assert (await g.client.get("/metrics")).status == 200

    async def test_a_key_added_later_works_without_a_restart(self, g: Harness, keys: Keys) -> None:
        late = add_secret(keys.path, "team-c", "api")
        watch = g.relay.auth.watch
        assert watch is not None
        watch._checked -= watch.every_s  # the next request checks the file's stamp again
        task = asyncio.create_task(g.chat("s1", headers=bearer(late)))
        [req] = await g.rec.next(SessionRequest)
        assert req.session_id == "team-c:s1"
        task.cancel()


class TestHeldLimit:
    async def test_the_tenants_held_requests_are_capped(self, g: Harness, keys: Keys) -> None:
        """team-a may hold 2 requests; a third is 429 with Retry-After, and never registered;
        team-b (no limit) is not affected; an admitted team-a session is never refused."""
        held = [asyncio.create_task(g.chat(f"s{i}", headers=bearer(keys.a))) for i in (1, 2)]
        await g.rec.next(SessionRequest, 2)
        third = await g.chat("s3", headers=bearer(keys.a))
        assert third.status == 429 and third.headers["Retry-After"] == "3"
        assert (await third.json())["error"]["type"] == "rate_limit_error"
        assert g.relay.metrics.requests.get(endpoint="chat", outcome="tenant_limit") == 1
        other = asyncio.create_task(g.chat("s3", headers=bearer(keys.b)))
        await g.rec.next(SessionRequest, 3)
        ids = sorted(r.session_id for r in g.rec.of(SessionRequest))
        assert ids == ["team-a:s1", "team-a:s2", "team-b:s3"]
        await g.place("admit", "team-a:s9", 1)
        assert (await g.chat("s9", headers=bearer(keys.a))).status == 200
        await g.place("admit", "team-a:s1", 2)
        assert (await held[0]).status == 200
        fourth = asyncio.create_task(g.chat("s4", headers=bearer(keys.a)))  # room again
        await g.rec.next(SessionRequest, 5)
        for t in (held[1], other, fourth):
            t.cancel()


class TestHookTokens:
    async def test_hooks_need_a_token_and_carry_the_tenant(self, g: Harness, keys: Keys) -> None:
        body = b'{"session_id": "s1", "hook_event_name": "Stop"}'
        for headers in ({}, bearer(keys.a), {"X-TAO-Hook-Token": "forged"}):  # an API key is no
            resp = await g.client.post("/hooks/claude", data=body, headers=headers)  # hook token
            assert resp.status == 401
        assert g.relay.metrics.hooks.get(result="unauthorized") == 3
        for headers in (bearer(keys.hook_a), {"X-TAO-Hook-Token": keys.hook_a}):
            resp = await g.client.post("/hooks/claude", data=body, headers=headers)
            assert (resp.status, await resp.json()) == (200, {})
        await g.bus.settle()
        for _ in range(100):
            sent = [(s, h) for s, _, h in g.bus.published if s == subjects.hook_events("claude")]
            if len(sent) == 2:
                break
            await asyncio.sleep(0.01)  # the forwarder publishes from its queue task
        assert [h[TENANT_HEADER] for _, h in sent] == ["team-a", "team-a"]
        assert g.relay.metrics.hooks.get(result="forwarded") == 2
        assert "tao_gateway_hooks_total" in await (await g.client.get("/metrics")).text()


def _poster(g: Harness) -> Any:
    def post(sid: str, token: str) -> Any:
        body = b'{"session_id": "%s", "hook_event_name": "Stop"}' % sid.encode()
        return g.client.post("/hooks/claude", data=body, headers=bearer(token))

    return post


class TestHookRate:
    async def test_a_flooding_session_gets_429_others_go_on(self, keys: Keys) -> None:
        """TAO_HOOK_BURST posts of one session pass; the next gets 429 with Retry-After and is
        not forwarded; another session, and the same id of another tenant, are not affected."""
        hook_b = add_secret(keys.path, "team-b", "hook")
        settings = SETTINGS.replace(tenants_file=str(keys.path), hook_rate=0.5, hook_burst=3)
        async for g in make_harness(settings):
            post = _poster(g)

            for _ in range(3):
                assert (await post("s1", keys.hook_a)).status == 200
            limited = await post("s1", keys.hook_a)
            assert limited.status == 429 and limited.headers["Retry-After"] == "2"
            assert (await limited.json())["error"]["type"] == "rate_limited"
            assert (await post("s2", keys.hook_a)).status == 200
            assert (await post("s1", hook_b)).status == 200
            assert g.relay.metrics.hooks.get(result="rate_limited") == 1
            for _ in range(100):
                if g.relay.metrics.hooks.get(result="forwarded") == 5:
                    break
                await asyncio.sleep(0.01)  # the forwarder publishes from its queue task
            sent = [s for s, _, _ in g.bus.published if s == subjects.hook_events("claude")]
            assert len(sent) == 5
