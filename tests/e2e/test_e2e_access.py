"""Access control on the bus and the store, as ``tao up`` runs it: embedded NATS and Valkey
that check one user per role (:mod:`shared.infra.access`).

A stack of its own on its own servers (the rest of the suite uses the shared test servers,
which check nothing). Checked: agent sessions run through the gateway with every service
connected as its own user, and no service logged a permission error (so the grants cover what
the code does); then every attempt to forge or snoop is refused by the servers themselves —
no user or a wrong password, a placement published by any role but the planner, a hook role
publishing anything but hook payloads or reading a placement or another role's inbox, the
gateway or a hook writing a session record, the password-less default user touching a key.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from shared.cli.stack import Stack, StackConfig
from shared.contracts import subjects
from shared.harness import hookclient
from shared.infra import Bus
from shared.infra.access import ADMIN, ROLES, inbox_prefix, role_url
from shared.infra.errors import BusError
from shared.infra.keys import Keys
from tests.e2e.conftest import E2E, E2E_KV_TOKENS

DEADLINE_S = 10.0
_PERMISSION_MARKS = ("permissions violation", "nopermission", "noperm", "no permissions")
"""How a refusal reads in a service's log, lower-cased (nats-py reports a refused publish as
``nats: permissions violation for publish to "..."``)."""


@pytest.fixture(scope="module")
def guarded() -> Iterator[E2E]:
    tag = uuid.uuid4().hex[:12]
    base = {k: v for k, v in os.environ.items() if k not in ("TAO_NATS_URL", "TAO_REDIS_URL")}
    config = StackConfig(
        sim_nodes=2,
        time_scale=20.0,
        kv_tokens=E2E_KV_TOKENS,
        namespace="a" + tag,
        domain="d" + tag,
        extra_env={"TAO_LOG_LEVEL": "info", "TAO_HOLD_TIMEOUT_S": "60", "TAO_TICK_S": "0.25"},
        env=base,
    )
    stack = Stack(config)
    e2e = E2E(stack, config.namespace, "d" + tag, {})
    try:
        stack.start()
        e2e.env = dict(stack.env)
        from tests.e2e.conftest import _ready

        asyncio.run(_ready(stack, e2e.domain, 2))
        yield e2e
    finally:
        e2e.close()


def _publish(url: str, subject: str) -> None:
    """One publish with the hook client's plain NATS protocol client, which reports the
    server's ``-ERR`` (a permission violation) as :class:`HookClientError`."""
    hookclient.publish(url, subject, b"{}", {}, time.monotonic() + DEADLINE_S)


async def _refused_subscription(url: str, subject: str) -> str:
    """Subscribe as ``url``'s user; the server's asynchronous refusal, as nats-py reports it."""
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    user = url.split("//", 1)[1].split(":", 1)[0]
    nc = await nats.connect(url, error_cb=on_error, inbox_prefix=inbox_prefix(user))
    try:
        await nc.subscribe(subject)
        await nc.flush()
        deadline = time.monotonic() + DEADLINE_S
        while not errors and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # the server's -ERR arrives after the flush
    finally:
        await nc.close()
    assert errors, f"{user} subscribed to {subject} without a refusal"
    return errors[0]


class TestGuardedStack:
    async def test_sessions_complete_with_every_service_as_its_own_user(self, guarded: E2E) -> None:
        stack = guarded.stack
        assert stack.access is not None and stack.access_dir is not None
        for name in ("telemetry", "tools", "valuation", "planner", "gateway"):
            env = stack.env_for(name)
            assert "TAO_NATS_URL" not in env
            assert Path(env["TAO_NATS_URL_FILE"]).read_text().strip() == stack.access.nats(name)
        tag = uuid.uuid4().hex[:8]
        async with guarded.clients(role="ops") as c:
            sessions = [
                c.agent(f"acc-{tag}-{i}", turns=3, stream=i % 2 == 0, tool="pytest", seed=i)
                for i in range(4)
            ]
            results = await asyncio.gather(*sessions)
        assert [len(turns) for turns in results] == [3, 3, 3, 3]
        assert not stack.failed(), stack.failed()
        complaints = [
            f"{log.name}: {line[:200]}"
            for log in sorted(stack.log_dir.glob("*.log"))
            for line in log.read_text(errors="replace").splitlines()
            if any(mark in line.lower() for mark in _PERMISSION_MARKS)
        ]
        assert complaints == []

    async def test_nats_refuses_a_client_without_a_user_or_with_a_wrong_password(
        self, guarded: E2E
    ) -> None:
        plain = guarded.stack._servers.nats_url  # type: ignore[union-attr]
        assert plain is not None
        for url in (plain, role_url(plain, "planner", "not-the-password")):
            with pytest.raises(BusError, match=r"(?i)authorization"):
                await Bus.connect(url, name="intruder", allow_reconnect=False, quiet=True)

    @pytest.mark.parametrize("role", [r for r in ROLES if r not in ("planner", ADMIN)])
    def test_only_the_planner_may_publish_a_placement(self, guarded: E2E, role: str) -> None:
        stack = guarded.stack
        subject = f"{guarded.namespace}.{subjects.placement('gw0')}"
        with pytest.raises(hookclient.HookClientError, match="Permissions Violation"):
            _publish(stack.nats_for(role), subject)
        _publish(stack.nats_for("planner"), subject)  # the planner's own is accepted

    def test_a_hook_publishes_hook_payloads_only(self, guarded: E2E) -> None:
        hook = guarded.stack.nats_for("hook")
        ns = guarded.namespace
        _publish(hook, f"{ns}.{subjects.hook_events('claude')}")
        forged = (
            subjects.tool_event("someone"),
            subjects.session_events("end").replace("*", "someone"),
            subjects.wake(),
            subjects.node_status("sim0"),
        )
        for subject in forged:
            with pytest.raises(hookclient.HookClientError, match="Permissions Violation"):
                _publish(hook, f"{ns}.{subject}")

    async def test_nobody_snoops_placements_or_another_roles_inbox(self, guarded: E2E) -> None:
        stack, ns = guarded.stack, guarded.namespace
        placements = f"{ns}.{subjects.placements()}"
        for role in ("hook", "tools", "valuation"):
            why = await _refused_subscription(stack.nats_for(role), placements)
            assert "permissions violation" in why.lower()
        why = await _refused_subscription(stack.nats_for("hook"), f"{inbox_prefix('gateway')}.>")
        assert "permissions violation" in why.lower()

    async def test_redis_lets_only_writers_write_a_session(self, guarded: E2E) -> None:
        stack = guarded.stack
        key = Keys(guarded.domain).session("forged")
        for role in ("gateway", "ops", "telemetry"):
            client = aioredis.Redis.from_url(stack.redis_for(role))
            try:
                assert await client.exists(key) == 0  # reading is allowed
                with pytest.raises(NoPermissionError):
                    await client.hset(key, mapping={"node": "sim0", "weight": "1"})
            finally:
                await client.aclose()
        hook = aioredis.Redis.from_url(stack.redis_for("hook"))
        anonymous = aioredis.Redis.from_url(stack._servers.redis_url)  # type: ignore[union-attr]
        wrong = aioredis.Redis.from_url(role_url(stack._servers.redis_url or "", "planner", "x"))  # type: ignore[union-attr]
        try:
            with pytest.raises(NoPermissionError):
                await hook.get(key)
            assert await anonymous.ping()  # health checks still work
            with pytest.raises((NoPermissionError, ResponseError)):
                await anonymous.get(key)
            with pytest.raises((AuthenticationError, ResponseError)):
                await wrong.ping()
        finally:
            for client in (hook, anonymous, wrong):
                await client.aclose()
        planner = aioredis.Redis.from_url(stack.redis_for("planner"))
        try:
            assert await planner.hset(key, mapping={"probe": ""}) == 1  # the planner may
            await planner.delete(key)
        finally:
            await planner.aclose()


class TestPlannerBatchAdmit:
    async def test_the_planner_admits_by_thunderagents_accounting_as_its_own_user(
        self, guarded: E2E
    ) -> None:
        """The live ThunderAgent's resumes go through the store's batch write as the planner's
        Redis user (services/planner/thunder_apply.py): its grant covers every key the write
        names (a demo run of `thunderagent` was refused on the session index before)."""
        from services.planner.thunder_apply import admit_unchecked
        from shared.core.session import Session, on_request
        from shared.core.tick import Move
        from shared.infra.store import Store

        stack = guarded.stack
        admin_client = aioredis.Redis.from_url(stack.redis_for(ADMIN))
        planner_client = aioredis.Redis.from_url(stack.redis_for("planner"))
        admin, planner = Store(admin_client, guarded.domain), Store(planner_client, guarded.domain)
        sid = f"ta-{uuid.uuid4().hex[:8]}"
        try:
            await admin.update_session(sid, lambda _: on_request(Session(sid), "r1", 1.0)[0])
            pooled = await admin.get_session(sid)
            assert pooled is not None and pooled.pooled
            node = next(n.id for n in await admin.nodes() if n.healthy)
            got = await admit_unchecked(planner, [Move(sid, node, 512, pooled.version)], 2.0)
            assert [m.session for m in got.admitted] == [sid]
            after = await admin.get_session(sid)
            assert after is not None and after.node == node
        finally:
            await admin.delete_session(sid)
            await admin_client.aclose()
            await planner_client.aclose()
