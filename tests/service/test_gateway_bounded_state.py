"""The gateway under odd ids and state attacks: bounded maps, checks before memory, isolation.

The real app on an in-memory bus, forwarding to the stub nodes of the other gateway service
tests. Each case here is an attack or odd input of issue 40 ("Bounded state", "Isolation"):
it must be refused with a 4xx naming what was wrong, before the gateway remembers anything
for it, and one tenant must never reach or evict another's state.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.gateway.app import HOOKS
from shared.contracts import SessionRequest, subjects
from shared.harness.base import MAX_HOOK_BYTES
from shared.infra.tenants import add_secret
from tests.service.test_gateway_continuation import ResponsesNode
from tests.service.test_gateway_domains import Env, env  # noqa: F401 (a fixture)
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness

MIB_ID = "s" * (MAX_HOOK_BYTES - 100)
"""A session id as long as a hook body may be (1 MiB less the payload around it)."""


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def hook_body(session: str) -> bytes:
    return json.dumps({"session_id": session, "hook_event_name": "Stop"}).encode()


@pytest.fixture
async def g() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS):
        yield harness


class TestHookIds:
    """A hook post whose session id is no id is 400 naming the field, and no bucket is kept."""

    @pytest.mark.parametrize(
        ("session", "needle"),
        [
            (MIB_ID, "hook 'session_id' must be at most 512 characters, got 1048476"),
            ("a\nb", "hook 'session_id' must not contain control characters, got U+000A"),
            ("a\x00b", "U+0000 at position 1"),
            ("a\x7f", "U+007F"),
        ],
        ids=["1MiB", "newline", "nul", "del"],
    )
    async def test_refused_before_kept(self, g: Harness, session: str, needle: str) -> None:
        resp = await g.client.post("/hooks/claude", data=hook_body(session))
        assert resp.status == 400
        assert needle in (await resp.json())["error"]["message"]
        assert len(g.client.app[HOOKS].limiter) == 0
        assert g.relay.metrics.hooks.get(result="bad_request") == 1

    async def test_a_new_id_per_post_meets_the_tenant_limit(self) -> None:
        """250 posts, each naming a new session: the tenant's bucket (burst 50) stops the
        flood that the per-session buckets alone let through."""
        settings = SETTINGS.replace(hook_tenant_burst=50, hook_tenant_rate=0.01)
        async for g in make_harness(settings):
            codes = [
                (await g.client.post("/hooks/claude", data=hook_body(f"s{n}"))).status
                for n in range(250)
            ]
            assert codes.count(200) == 50 and codes.count(429) == 200
            assert g.relay.metrics.hooks.get(result="rate_limited") == 200


class TestModelRequestIds:
    """A control character in any id a model request names is 400 naming the field, and
    nothing is registered (today: a 500 after the session was registered and admitted)."""

    @pytest.mark.parametrize(
        ("body", "headers", "needle"),
        [
            ({"session_id": "\u0000"}, {}, "'session_id' must not contain control characters"),
            ({"session_id": "a\nb"}, {}, "'session_id' must not contain control characters"),
            ({"session_id": "a\x7fb"}, {}, "U+007F at position 1"),
            ({"user": "a\nb"}, {}, "'user' must not contain control characters"),
            ({"program_id": "p\x00"}, {}, "'program_id' must not contain control characters"),
            ({"conversation_id": "c\rd"}, {}, "'conversation_id' must not contain control"),
            ({}, {"X-Dynamo-Session-ID": "a\tb"}, "header X-Dynamo-Session-ID must not"),
            ({}, {"X-Session-ID": "a\tb"}, "header X-Session-ID must not contain control"),
            ({"user": "u" * 513}, {}, "'user' must be at most 512 characters, got 513"),
        ],
    )
    async def test_400_naming_the_field(
        self, g: Harness, body: dict[str, Any], headers: dict[str, str], needle: str
    ) -> None:
        resp = await g.chat(None, headers=headers, **body)
        assert resp.status == 400
        assert needle in (await resp.json())["error"]["message"]
        assert g.bus.published == [] and g.node.bodies == []

    async def test_control_character_in_a_messages_metadata_session(self, g: Harness) -> None:
        user_id = json.dumps({"session_id": "a\nb"})
        payload = {
            "model": "m",
            "max_tokens": 8,
            "metadata": {"user_id": user_id},
            "messages": [{"role": "user", "content": "x"}],
        }
        resp = await g.client.post("/v1/messages", json=payload)
        assert resp.status == 400
        assert "'metadata.user_id' session must not" in (await resp.json())["error"]["message"]
        assert g.bus.published == []


class TestDelete:
    """``DELETE /v1/sessions/{id}`` with an id that is no id is 400, and nothing is ended."""

    @pytest.mark.parametrize(
        ("path", "needle"),
        [
            ("/v1/sessions/" + "x" * 600, "session id must be at most 512 characters, got 600"),
            ("/v1/sessions/a%0Ab", "session id must not contain control characters, got U+000A"),
            ("/v1/sessions/a%00b", "U+0000"),
        ],
    )
    async def test_400(self, g: Harness, path: str, needle: str) -> None:
        resp = await g.client.delete(path)
        assert resp.status == 400
        assert needle in (await resp.json())["error"]["message"]
        assert g.bus.published == []
        assert g.relay.metrics.requests.get(endpoint="delete", outcome="bad_request") == 1


class Tenants:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.a = add_secret(path, "team-a", "api")
        self.b = add_secret(path, "team-b", "api")


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[Harness, Tenants]]:
    keys = Tenants(tmp_path / "tenants.toml")
    settings = SETTINGS.replace(tenants_file=str(keys.path))
    async for harness in make_harness(settings, node=ResponsesNode()):
        yield harness, keys


class TestPreviousResponseIsolation:
    """A ``previous_response_id`` is forwarded only when this tenant was served it; another
    tenant's is answered as OpenAI answers an unknown id, and never reaches the node."""

    async def test_another_tenants_response_id_is_404(self, two: tuple[Harness, Tenants]) -> None:
        g, keys = two
        await g.place("admit", "team-a:a1", 1)
        await g.place("admit", "team-b:b1", 1)
        first = await g.client.post(
            "/v1/responses",
            json={"model": "m", "input": "hi", "session_id": "a1"},
            headers=bearer(keys.a),
        )
        rid = (await first.json())["id"]
        await g.relay.flush()
        stolen = await g.client.post(
            "/v1/responses",
            json={"model": "m", "input": "more", "previous_response_id": rid, "session_id": "b1"},
            headers=bearer(keys.b),
        )
        assert stolen.status == 404
        assert (await stolen.json())["error"] == {
            "message": f"Previous response with id '{rid}' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }
        assert len(g.node.bodies) == 1  # only team-a's first request reached the node
        own = await g.client.post(
            "/v1/responses",
            json={"model": "m", "input": "more", "previous_response_id": rid},
            headers=bearer(keys.a),
        )
        assert own.status == 200
        assert g.node.bodies[-1]["previous_response_id"] == rid
        registered = [r.session_id for r in g.rec.of(SessionRequest)]
        assert registered == ["team-a:a1", "team-a:a1"]


class TestDomainsRememberNothingBad:
    """In domains mode a request whose session id is refused leaves no trace in the router."""

    async def test_4mb_session_id(self, env: Env) -> None:  # noqa: F811 (the fixture)
        body = {
            "model": "tao-sim",
            "messages": [{"role": "user", "content": "hi"}],
            "session_id": "s" * (4 << 20),
        }
        for _ in range(3):
            resp = await env.client.post("/v1/chat/completions", json=body)
            assert resp.status == 400
            assert "'session_id' must be at most 512" in (await resp.json())["error"]["message"]
        assert len(env.router.remembered) == 0

    async def test_a_bad_hook_id_is_not_routed(self, env: Env) -> None:  # noqa: F811
        resp = await env.client.post("/hooks/claude", data=hook_body(MIB_ID))
        assert resp.status == 400 and len(env.router.remembered) == 0
        assert not any(
            s == subjects.hook_events("claude")
            for d in env.d.values()
            for s, _, _ in d.bus.published
        )
