"""Planner failover on a 3-server NATS cluster: real processes, real servers, SIGKILL.

A NATS cluster of three nats-servers (JetStream, streams and the lease bucket with 3 replicas),
the test's Redis, one valuation and two planner replicas (``python -m services.…``). The test
plays the gateway: it writes waiting sessions into the domain's store, wakes the valuation, and
reads the placements stream. Mid-load it SIGKILLs the leading planner and one NATS server at
once; the standby must take the lease, fence the domain at a larger epoch and admit the
sessions that arrive afterwards; no session is lost, none is admitted twice in the store, and
no node is over-committed. The killed planner, restarted under its instance name, stays a
standby while the other one holds the lease.

Time bounds here are liveness bounds (generous, for a loaded 2-core machine); the failover
time itself is measured by ``benchmarks/failover.py`` (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO

import nats.errors
import orjson
import pytest
import redis.asyncio as aioredis

from shared.contracts import subjects
from shared.contracts.codec import decode, encode
from shared.contracts.plan import Placement
from shared.contracts.wake import Wake
from shared.core.session import Session, on_request
from shared.infra.bus import Bus
from shared.infra.busapi import Delivery
from shared.infra.embedded import stop_processes
from shared.infra.lease import LeaseTable, lease_key
from shared.infra.natscluster import NatsCluster
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate

TTL_S = 1.0
LIVENESS_S = 30.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as c:
        yield c


async def until(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float = LIVENESS_S
) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` s. While a
    NATS server is down the test's own client may time out on a read: that poll counts as
    not yet, the last one must succeed."""

    async def ok() -> bool:
        try:
            return await check()
        except (TimeoutError, nats.errors.Error):
            return False

    try:
        async with asyncio.timeout(timeout):
            while not await ok():
                await asyncio.sleep(0.1)
    except TimeoutError:
        pytest.fail(f"not within {timeout:g} s: {what}")
    assert await check(), what


class Procs:
    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env = env
        self.logs = logs
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.files: list[IO[bytes]] = []

    def start(self, service: str, instance: str) -> None:
        log = open(self.logs / f"{instance}.log", "ab")  # noqa: SIM115 - closed in stop()
        self.files.append(log)
        env = {**self.env, "TAO_INSTANCE": instance, "TAO_SERVICE_NAME": instance}
        self.procs[instance] = subprocess.Popen(
            [sys.executable, "-m", f"services.{service}"],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def logged_count(self, instance: str, event: str) -> int:
        """How many log lines of ``instance`` (over all its lives) are ``event``."""
        text = (self.logs / f"{instance}.log").read_text("utf-8", "replace")
        return text.count(f'"event":"{event}"')

    async def logged(self, instance: str, event: str, times: int) -> bool:
        return self.logged_count(instance, event) >= times

    def kill(self, instance: str) -> None:
        p = self.procs.pop(instance)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def stop(self) -> None:
        stop_processes(list(self.procs.values()))
        for f in self.files:
            f.close()


async def _with_retry(make: Callable[[], Awaitable[object]]) -> None:
    """JetStream's meta leader is elected a moment after the servers answer: retry."""
    async with asyncio.timeout(LIVENESS_S):
        while True:
            try:
                await make()
                return
            except Exception:
                await asyncio.sleep(0.3)


@pytest.fixture
async def world(
    cluster: NatsCluster, redis_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Bus, Store, Procs, LeaseTable]]:
    ns = "fo" + uuid.uuid4().hex[:8]
    domain = "fo" + uuid.uuid4().hex[:8]
    bus = await Bus.connect(cluster.url, name="failover-test", namespace=ns, replicas=3)
    await _with_retry(bus.ensure_streams)
    table: list[LeaseTable] = []

    async def lease() -> None:
        table.append(await bus.lease_table(TTL_S, replicas=3))

    await _with_retry(lease)
    client = aioredis.Redis.from_url(redis_url)
    store = Store(client, domain)
    env = {
        **os.environ,
        "TAO_NATS_URL": cluster.url,
        "TAO_REDIS_URL": redis_url,
        "TAO_NAMESPACE": ns,
        "TAO_DOMAIN": domain,
        "TAO_REPLICAS": "3",
        "TAO_LEASE_TTL_S": str(TTL_S),
        "TAO_TICK_S": "0.2",
        "TAO_FRESHNESS_S": "600",
        "TAO_IDLE_TIMEOUT_S": "600",
        "TAO_ACK_WAIT_S": "2",
        "TAO_LOG_FORMAT": "json",
    }
    procs = Procs(env, tmp_path)
    try:
        yield bus, store, procs, table[0]
    finally:
        procs.stop()
        await store.clear()
        await client.aclose()
        await bus.delete_streams()
        await bus.drain()


async def holder(table: LeaseTable, key: str) -> str | None:
    """The instance holding the lease ``key`` now, None if nobody does."""
    got = await table.get(key)
    return None if got is None else str(orjson.loads(got[0])["instance"])


async def add_sessions(store: Store, bus: Bus, ids: list[str]) -> None:
    for sid in ids:
        s, _ = on_request(Session(sid), "r", 1.0, model="m", gateway_id="gw0", tokens_estimate=1000)
        await store.update_session(sid, lambda _o, s=s: s)
    await bus.publish(subjects.wake(), encode(Wake(reason="arrival", ts=1.0)))


async def test_standby_takes_over_when_the_leader_and_a_nats_server_die(
    cluster: NatsCluster, world: tuple[Bus, Store, Procs, LeaseTable]
) -> None:
    bus, store, procs, table = world
    key = lease_key("planner", store.domain)
    await store.put_node_status(
        "n1", NodeUpdate(capacity_tokens=200_000, target_utilisation=1.0, healthy=True)
    )
    admits: dict[str, int] = {}

    async def on_placement(p: Placement, d: Delivery) -> None:
        if p.kind == "admit":
            admits[p.session_id] = admits.get(p.session_id, 0) + 1

    await bus.consume(
        subjects.STREAM_PLACEMENT,
        "gw0",
        lambda b: decode(b, Placement),
        on_placement,
        filter_subject=subjects.placement("gw0"),
    )
    procs.start("valuation", "v1")
    procs.start("planner", "p1")
    procs.start("planner", "p2")

    first = [f"a{i}" for i in range(10)]
    await until("a planner holds the lease", lambda: _some(holder(table, key)))
    await add_sessions(store, bus, first)
    await until("the first sessions are admitted", lambda: _admitted(store, first))
    leader = await holder(table, key)
    assert leader in ("p1", "p2")
    standby = "p2" if leader == "p1" else "p1"
    epoch_before = int((await store.planner_stats())["epoch"])  # type: ignore[call-overload]

    procs.kill(leader)  # the leader dies mid-load, with one NATS server
    cluster.kill(0)
    second = [f"b{i}" for i in range(10)]
    await add_sessions(store, bus, second)
    await until("the standby holds the lease", lambda: _is(holder(table, key), standby))
    await until("the later sessions are admitted", lambda: _admitted(store, second))
    await until("every admission reached the gateway", lambda: _all_in(admits, first + second))

    stats = await store.planner_stats()
    assert int(stats["epoch"]) > epoch_before  # type: ignore[call-overload]
    sessions = {s.id: s for s in await store.sessions()}
    assert all(sessions[sid].node == "n1" for sid in first + second)
    node = await store.get_node("n1")
    assert node is not None and node.reserved == sum(s.weight for s in sessions.values())
    assert node.reserved <= node.usable

    procs.start("planner", leader)  # back under its own name: the other still holds the lease
    cluster.restart(0)
    await until("the restarted planner is up", lambda: procs.logged(leader, "planner_warm", 2))
    await asyncio.sleep(3 * TTL_S)  # a few lease periods as a standby
    assert await holder(table, key) == standby
    assert procs.logged_count(leader, "lease_acquired") == 1  # only its first life led


async def _some(x: Awaitable[str | None]) -> bool:
    return (await x) is not None


async def _is(x: Awaitable[str | None], want: str) -> bool:
    return (await x) == want


async def _admitted(store: Store, ids: list[str]) -> bool:
    for sid in ids:
        s = await store.get_session(sid)
        if s is None or s.node is None:
            return False
    return True


async def _all_in(admits: dict[str, int], ids: list[str]) -> bool:
    return all(admits.get(sid, 0) >= 1 for sid in ids)
