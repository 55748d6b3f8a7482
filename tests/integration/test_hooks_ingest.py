"""Harness hook payloads through the tools service, the gateway's ``POST /hooks/{harness}``, and
the ``tao hook`` process; on FakeBus and on real NATS (and the stores of ``store``)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from services.gateway import hooks as gateway_hooks
from services.gateway.auth import Auth
from services.tools.app import start
from services.tools.hooks import decode_hook, received_at
from shared.contracts import DeadLetter, decode, subjects
from shared.contracts.errors import DecodeError
from shared.contracts.session import SessionEnd
from shared.contracts.wake import WAKE_END, WAKE_TOOL_END, Wake
from shared.core.session import INFERRED, Session, ToolCall
from shared.harness.base import MAX_HOOK_BYTES, RECEIVED_AT_HEADER
from shared.harness.hookclient import OVERSIZED_MARKER, Spool, hook_subject, oversized_marker
from shared.infra import Bus, Delivery, FakeBus, MessageBus, Subscription
from shared.infra.embedded import free_port
from shared.infra.fake_store import FakeStore
from shared.infra.store_types import StateStore
from shared.infra.tenants import TENANT_HEADER, add_secret, qualify
from tests.integration.collect import Collector, dead_letter_reader

FIXTURES = Path(__file__).parents[1] / "fixtures" / "claude-code"
ROOT = Path(__file__).parents[2]
TIMEOUT_S = 15.0
AT = 1_700_000_000.0
CLAUDE = subjects.hook_events("claude")


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


def fixture(name: str) -> dict[str, Any]:
    value = json.loads(fixture_bytes(name))
    assert isinstance(value, dict)
    return value


def at(t: float = AT) -> dict[str, str]:
    return {RECEIVED_AT_HEADER: f"{t:.6f}"}


async def dead_letters(bus: MessageBus) -> Collector:
    return await dead_letter_reader(bus, "tools", TIMEOUT_S)


async def wakes(bus: MessageBus) -> Collector:
    got = Collector(TIMEOUT_S)
    await bus.subscribe(subjects.wake(), "wake-reader", lambda data: decode(data, Wake), got)
    return got


async def stop_all(subs: Iterable[Subscription]) -> None:
    for sub in subs:
        await sub.stop()


def in_tool(sid: str, call: str, tool: str = "Bash") -> Session:
    """A session whose model asked for ``tool`` (call ``call``), as the gateway left it."""
    return Session(
        id=sid,
        version=1,
        activity="tool",
        turns=1,
        tool=ToolCall(call_id=call, tool=tool, started_at=AT - 1, source=INFERRED),
    )


async def seed(store: StateStore, *sessions: Session) -> None:
    for s in sessions:
        await store.update_session(s.id, lambda _, s=s: s)


class TestDeadLetters:
    """What cannot be read is dead-lettered with a clear reason; the consumer goes on."""

    @pytest.mark.parametrize(
        ("subject", "data", "reason"),
        [
            (CLAUDE, fixture_bytes("pre-tool-use-bash")[:60], "not valid JSON (truncated?)"),
            (CLAUDE, b"[1, 2]", "expected a JSON object, got array"),
            (CLAUDE, b"", "not valid JSON"),
            (
                CLAUDE,
                json.dumps(fixture("pre-tool-use-bash") | {"session_id": 42}).encode(),
                "cannot map claude-code hook payload: session_id: expected a string, got int",
            ),
            (
                CLAUDE,
                json.dumps({**fixture("post-tool-use-bash"), "duration_ms": "8s"}).encode(),
                "duration_ms: expected a number of milliseconds, got str",
            ),
            (
                CLAUDE,
                json.dumps(
                    {k: v for k, v in fixture("pre-tool-use-bash").items() if k != "tool_use_id"}
                ).encode(),
                "tool_use_id: missing",
            ),
            (
                CLAUDE,
                oversized_marker(b'{"session_id": "s1"' + b" " * 100, MAX_HOOK_BYTES + 1),
                f"oversized: {MAX_HOOK_BYTES + 1} bytes or more, limit {MAX_HOOK_BYTES}",
            ),
            (
                subjects.hook_events("cursor"),
                fixture_bytes("pre-tool-use-bash"),
                "harness 'cursor': unknown",
            ),
            (
                CLAUDE,
                json.dumps(fixture("pre-tool-use-bash") | {"session_id": "x" * 600}).encode(),
                "session_id: unusable as a session id",
            ),
        ],
        ids=[
            "truncated",
            "array",
            "empty",
            "wrong-type",
            "wrong-duration",
            "missing-call-id",
            "oversized",
            "unknown-harness",
            "session-id",
        ],
    )
    async def test_reason(self, bus: MessageBus, subject: str, data: bytes, reason: str) -> None:
        store = FakeStore()
        await seed(store, in_tool("s1", "toolu_03"))
        _, subs = await start(store, bus)
        letters = await dead_letters(bus)
        woken = await wakes(bus)
        await bus.publish(subject, data, at())
        (letter,) = await letters.values(1)
        assert isinstance(letter, DeadLetter)
        assert reason in letter.reason, letter.reason
        assert (letter.subject, letter.payload, letter.service) == (subject, data, "tools")
        assert letter.headers.get(RECEIVED_AT_HEADER) == f"{AT:.6f}"
        # the consumer goes on with the next payload
        await bus.publish(CLAUDE, fixture_bytes("post-tool-use-run-in-background"), at())
        await woken.values(1, lambda w: w.reason == WAKE_TOOL_END)
        rec = await store.get_session("s1")
        assert rec is not None and rec.tool is not None and rec.tool.background
        await stop_all(subs)

    async def test_raw_oversized_payload(self) -> None:
        """A body over the limit (possible where the server allows it) is refused too."""
        with pytest.raises(DecodeError, match=f"oversized: {MAX_HOOK_BYTES + 1} bytes"):
            decode_hook(b" " * (MAX_HOOK_BYTES + 1))


class TestGoodPayloads:
    """Mapped hook events reach the session records through the tools service's own path."""

    async def test_tool_start_is_stored(self, bus: MessageBus, store: StateStore) -> None:
        """PreToolUse replaces the gateway's inferred call with the hook's, deadline included;
        a later PostToolUse of another session wakes the planner once both are written."""
        sid = fixture("pre-tool-use-bash")["session_id"]
        await seed(store, in_tool(sid, "toolu_01ABCDEF"), in_tool("s1", "toolu_03"))
        _, subs = await start(store, bus)
        woken = await wakes(bus)
        await bus.publish(CLAUDE, fixture_bytes("pre-tool-use-bash"), at(AT))
        await bus.publish(CLAUDE, fixture_bytes("post-tool-use-run-in-background"), at(AT + 1))
        await woken.values(1, lambda w: w.reason == WAKE_TOOL_END)
        rec = await store.get_session(sid)
        assert rec is not None and rec.tool is not None
        assert rec.activity == "tool"
        assert (rec.tool.call_id, rec.tool.tool, rec.tool.source) == (
            "toolu_01ABCDEF",
            "Bash:test",  # the fixture's command is ``pytest -x tests/``
            "hook",
        )
        assert rec.tool.deadline == pytest.approx(AT + 300.0)
        assert rec.tool.open
        other = await store.get_session("s1")
        assert other is not None and other.tool is not None and other.tool.background
        await stop_all(subs)

    async def test_session_end_goes_to_the_session_stream(self, bus: MessageBus) -> None:
        """A SessionEnd hook is published where the gateway's go: the record is ended."""
        store = FakeStore()
        await seed(store, in_tool("s1", "toolu_03"))
        _, subs = await start(store, bus)
        woken = await wakes(bus)
        ends = Collector(TIMEOUT_S)
        await bus.subscribe(
            subjects.session_events("end"), "end-reader", lambda d: decode(d, SessionEnd), ends
        )
        await bus.publish(CLAUDE, fixture_bytes("session-end"), at(AT + 9))
        (end,) = await ends.values(1)
        assert (end.session_id, end.ended_at) == ("s1", AT + 9)
        await woken.values(1, lambda w: w.reason == WAKE_END)
        assert await store.get_session("s1") is None
        await stop_all(subs)


# -- the gateway's HTTP hook -------------------------------------------------------------------


class BrokenBus(FakeBus):
    async def publish(self, subject: str, data: bytes, headers: Any = None) -> None:
        raise ConnectionError("nats is down")


async def stream_reader(bus: MessageBus) -> Collector:
    got = Collector(TIMEOUT_S)
    await bus.consume(subjects.STREAM_HOOK, "hook-reader", lambda d: d, got, ephemeral=True)
    return got


@pytest.fixture
async def gateway(bus: MessageBus) -> AsyncIterator[tuple[TestClient, gateway_hooks.HookForwarder]]:
    app = web.Application()
    forwarder = gateway_hooks.install(app, bus)
    client = TestClient(TestServer(app))
    await client.start_server()
    yield client, forwarder
    await client.close()


class TestGatewayHook:
    """``POST /hooks/{harness}`` answers 200 ``{}`` at once and forwards the body."""

    async def test_forwards_body(
        self, bus: MessageBus, gateway: tuple[TestClient, gateway_hooks.HookForwarder]
    ) -> None:
        client, _ = gateway
        got = await stream_reader(bus)
        body = fixture_bytes("pre-tool-use-bash")
        resp = await client.post("/hooks/claude", data=body)
        assert (resp.status, await resp.json()) == (200, {})
        (data,) = await got.values(1)
        assert data == body
        _, d = got.items[0]
        assert d.subject == CLAUDE
        assert float(d.headers[RECEIVED_AT_HEADER]) > 0

    async def test_unknown_harness(
        self, gateway: tuple[TestClient, gateway_hooks.HookForwarder]
    ) -> None:
        client, forwarder = gateway
        resp = await client.post("/hooks/cursor", data=b"{}")
        assert resp.status == 404
        assert "unknown" in (await resp.json())["error"]["message"]
        assert forwarder.queue.empty() and forwarder.worker is None

    async def test_oversized_body_becomes_the_marker(
        self, bus: MessageBus, gateway: tuple[TestClient, gateway_hooks.HookForwarder]
    ) -> None:
        client, _ = gateway
        got = await stream_reader(bus)
        resp = await client.post("/hooks/claude-code", data=b"x" * (MAX_HOOK_BYTES + 10))
        assert (resp.status, await resp.json()) == (200, {})
        (data,) = await got.values(1)
        assert data.startswith(OVERSIZED_MARKER + str(MAX_HOOK_BYTES + 1).encode() + b"\n")
        assert len(data) < 1024

    async def test_bus_failure_still_answers(self) -> None:
        """A bus that cannot publish: 200 {} all the same; the payload is counted dropped."""
        app = web.Application()
        forwarder = gateway_hooks.install(app, BrokenBus())
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/hooks/claude", data=fixture_bytes("stop"))
            assert (resp.status, await resp.json()) == (200, {})
            await asyncio.wait_for(forwarder.queue.join(), TIMEOUT_S)
        assert (forwarder.forwarded, forwarder.dropped) == (0, 1)


class TestTenantHooks:
    """A hook posted with a tenant's token names that tenant's sessions, and no other's."""

    async def test_gateway_post_reaches_only_the_tenants_session(
        self, bus: MessageBus, store: StateStore, tmp_path: Path
    ) -> None:
        sid = fixture("pre-tool-use-bash")["session_id"]
        mine, plain = qualify("team-a", sid), in_tool(sid, "toolu_01ABCDEF")
        await seed(store, in_tool(mine, "toolu_01ABCDEF"), plain, in_tool("s1", "toolu_03"))
        token = add_secret(tmp_path / "t.toml", "team-a", "hook")
        add_secret(tmp_path / "t.toml", "team-b", "hook")
        auth = Auth.from_file(str(tmp_path / "t.toml"), None, clock=lambda: 0.0)
        _, subs = await start(store, bus)
        woken = await wakes(bus)
        app = web.Application()
        gateway_hooks.install(app, bus, auth)
        async with TestClient(TestServer(app)) as client:
            body = fixture_bytes("pre-tool-use-bash")
            forged = await client.post("/hooks/claude", data=body)
            assert forged.status == 401
            token_header = {"Authorization": f"Bearer {token}"}
            ok = await client.post("/hooks/claude", data=body, headers=token_header)
            assert ok.status == 200
            # a later tool end of another (untenanted) session: both written once it wakes
            await bus.publish(CLAUDE, fixture_bytes("post-tool-use-run-in-background"), at())
            await woken.values(1, lambda w: w.reason == WAKE_TOOL_END)
        rec = await store.get_session(mine)
        assert rec is not None and rec.tool is not None and rec.tool.source == "hook"
        untouched = await store.get_session(sid)
        assert untouched is not None and untouched.tool is not None
        assert untouched.tool.source == INFERRED  # the same id outside team-a: not reached
        await stop_all(subs)

    async def test_bad_tenant_header_is_dead_lettered(self, bus: MessageBus) -> None:
        store = FakeStore()
        _, subs = await start(store, bus)
        letters = await dead_letters(bus)
        data = fixture_bytes("pre-tool-use-bash")
        await bus.publish(CLAUDE, data, {**at(), TENANT_HEADER: "a b"})
        (letter,) = await letters.values(1)
        assert "header Tao-Tenant is not a tenant name: 'a b'" in letter.reason
        assert letter.payload == data
        await stop_all(subs)


# -- the hook process --------------------------------------------------------------------------


def run_hook(
    stdin: bytes, env: dict[str, str], harness: str = "claude"
) -> subprocess.CompletedProcess[bytes]:
    """``tao hook <harness>`` as a process (through the console script's entry module), with a
    spool of its own unless ``env`` names one (nothing lands in the user's cache)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TAO_")}
    base["TAO_HOOK_SPOOL"] = tempfile.mkdtemp(prefix="tao-spool-")
    return subprocess.run(
        [sys.executable, "-m", "shared.cli.entry", "hook", harness],
        input=stdin,
        env={**base, **env},
        capture_output=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )


@pytest.fixture
async def nats_bus(nats_url: str, namespace: str) -> AsyncIterator[Bus]:
    bus = await Bus.connect(nats_url, name="test-hooks", namespace=namespace)
    await bus.ensure_streams()
    try:
        yield bus
    finally:
        await bus.drain()
        admin = await Bus.connect(nats_url, name="test-cleanup", namespace=namespace)
        await admin.delete_streams()
        await admin.drain()


class TestHookProcess:
    """``tao hook claude`` publishes stdin on the stream, silently, exit 0."""

    async def test_lands_on_the_stream(self, nats_bus: Bus, nats_url: str, namespace: str) -> None:
        got = await stream_reader(nats_bus)
        body = fixture_bytes("post-tool-use-bash")
        env = {"TAO_NATS_URL": nats_url, "TAO_NAMESPACE": namespace}
        proc = await asyncio.to_thread(run_hook, body, env)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
        (data,) = await got.values(1)
        _, d = got.items[0]
        assert (data, d.subject) == (body, CLAUDE)
        assert float(d.headers[RECEIVED_AT_HEADER]) > 0

    async def test_oversized_stdin_sends_the_marker(
        self, nats_bus: Bus, nats_url: str, namespace: str
    ) -> None:
        got = await stream_reader(nats_bus)
        env = {"TAO_NATS_URL": nats_url, "TAO_NAMESPACE": namespace}
        proc = await asyncio.to_thread(run_hook, b"{" + b" " * (2 * MAX_HOOK_BYTES), env)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
        (data,) = await got.values(1)
        with pytest.raises(DecodeError, match="oversized"):
            decode_hook(data)

    async def test_oversized_json_is_slimmed_and_still_maps(
        self, nats_bus: Bus, nats_url: str, namespace: str
    ) -> None:
        """A PostToolUse with a 3 MiB output arrives cut, with its ids and flags intact."""
        got = await stream_reader(nats_bus)
        env = {"TAO_NATS_URL": nats_url, "TAO_NAMESPACE": namespace}
        body = json.loads((FIXTURES / "post-tool-use-auto-backgrounded.json").read_text())
        body["tool_response"]["stdout"] = "x" * (3 * MAX_HOOK_BYTES)
        proc = await asyncio.to_thread(run_hook, json.dumps(body).encode(), env)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
        (data,) = await got.values(1)
        assert len(data) < 4096
        payload = decode_hook(data)
        assert payload.body["tool_use_id"] == "toolu_02"
        assert payload.body["tool_response"]["backgroundTaskId"] == "bmotwaq65"
        assert payload.body["tool_response"]["stdout"].startswith("x" * 256 + "... [")

    async def test_through_the_tools_service(
        self, nats_bus: Bus, nats_url: str, namespace: str
    ) -> None:
        """Process → stream → tools service → record: the call went to the background."""
        store = FakeStore()
        await seed(store, in_tool("s1", "toolu_03"))
        _, subs = await start(store, nats_bus)
        woken = await wakes(nats_bus)
        env = {"TAO_NATS_URL": nats_url, "TAO_NAMESPACE": namespace}
        proc = await asyncio.to_thread(
            run_hook, fixture_bytes("post-tool-use-run-in-background"), env
        )
        assert proc.returncode == 0
        await woken.values(1, lambda w: w.reason == WAKE_TOOL_END)
        rec = await store.get_session("s1")
        assert rec is not None and rec.tool is not None and rec.tool.background
        await stop_all(subs)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("1700000100.5", 1700000100.5),
        ("1e308", 1.7e9),
        ("-5", 1.7e9),
        ("nan", 1.7e9),
        ("inf", 1.7e9),
        ("x", 1.7e9),
        (None, 1.7e9),
    ],
)
def test_received_at_header_is_believed_only_when_plausible(
    header: str | None, expected: float
) -> None:
    headers = {} if header is None else {RECEIVED_AT_HEADER: header}
    d = Delivery("tao.v1.hook.claude", headers, 1, 1, 1.7e9)
    assert received_at(d) == expected


class TestHookSpool:
    """What the hook could not publish in time is spooled, delivered later by its drainer, in
    order and with the receive time each hook saw, once NATS can be reached again (the hook
    dropped 32 of 240 events under CPU load before this)."""

    async def test_spooled_events_arrive_in_order_when_nats_comes_back(
        self, nats_bus: Bus, nats_url: str, namespace: str, tmp_path: Path
    ) -> None:
        got = await stream_reader(nats_bus)
        run_file = tmp_path / "run.json"
        dead = f"nats://127.0.0.1:{free_port()}"
        run_file.write_text(json.dumps({"pid": 1, "nats_url": dead, "redis_url": "x"}))
        env = {
            "TAO_RUN_FILE": str(run_file),
            "TAO_NAMESPACE": namespace,
            "TAO_HOOK_SPOOL": str(tmp_path / "spool"),
            "TAO_HOOK_DRAIN_S": "60",
        }
        bodies = [
            json.dumps({**fixture("pre-tool-use-bash"), "tool_use_id": f"toolu_{i:02d}"}).encode()
            for i in range(6)
        ]
        for body in bodies:  # NATS unreachable: each hook spools and returns at once, silently
            proc = await asyncio.to_thread(run_hook, body, env)
            assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
        spool = Spool(env["TAO_HOOK_SPOOL"], hook_subject("claude", namespace))
        assert spool.pending()
        run_file.write_text(json.dumps({"pid": 1, "nats_url": nats_url, "redis_url": "x"}))
        try:
            data = await got.values(len(bodies))  # the drainer finds NATS through the run file
            for _ in range(200):  # and then removes what it delivered
                if not spool.pending():
                    break
                await asyncio.sleep(0.05)
        finally:
            subprocess.run(
                ["pkill", "-f", f"shared.harness.hookclient drain {tmp_path}"], check=False
            )
        assert data == bodies
        stamps = [float(d.headers[RECEIVED_AT_HEADER]) for _, d in got.items]
        assert stamps == sorted(stamps) and stamps[0] < stamps[-1]
        assert not spool.pending(), sorted(os.listdir(spool.directory))

    async def test_a_hook_behind_a_spool_waits_its_turn(
        self, nats_bus: Bus, nats_url: str, namespace: str, tmp_path: Path
    ) -> None:
        """With NATS up but something still spooled, a new payload goes behind it, not ahead;
        draining delivers both, oldest first."""
        got = await stream_reader(nats_bus)
        subject = hook_subject("claude", namespace)
        spool = Spool(str(tmp_path / "spool"), subject)
        first = fixture_bytes("pre-tool-use-bash")
        assert spool.append(first, 1_000.0)
        env = {
            "TAO_NATS_URL": nats_url,
            "TAO_NAMESPACE": namespace,
            "TAO_HOOK_SPOOL": spool.directory,
            "TAO_HOOK_DRAIN_S": "60",
        }
        second = fixture_bytes("post-tool-use-bash")
        try:
            proc = await asyncio.to_thread(run_hook, second, env)
            assert proc.returncode == 0
            data = await got.values(2)
        finally:
            subprocess.run(
                ["pkill", "-f", f"shared.harness.hookclient drain {tmp_path}"], check=False
            )
        assert data == [first, second]
        assert float(got.items[0][1].headers[RECEIVED_AT_HEADER]) == 1_000.0
