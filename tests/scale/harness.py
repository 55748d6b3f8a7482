"""What the scale-out tests and ``benchmarks/failover.py`` share: a domain's services as real
processes on a NATS cluster and Redis (one server or a Redis Cluster), and the gateway's side
played in-process (write waiting sessions, wake the valuation, read the placements)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import orjson

from shared.contracts import subjects
from shared.contracts.codec import decode, encode
from shared.contracts.plan import Placement
from shared.contracts.wake import Wake
from shared.core.session import Session, on_request
from shared.infra.bus import Bus
from shared.infra.busapi import Delivery
from shared.infra.embedded import stop_processes
from shared.infra.lease import LeaseTable, lease_key
from shared.infra.redisconn import open_redis
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate

ROOT = Path(__file__).resolve().parents[2]
LIVENESS_S = 30.0
GATEWAY = "gw0"


class Procs:
    """Services started as ``python -m services.<name>``, one log file per instance."""

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

    async def logged(self, instance: str, event: str, times: int = 1) -> bool:
        return self.logged_count(instance, event) >= times

    def running(self, instance: str) -> bool:
        p = self.procs.get(instance)
        return p is not None and p.poll() is None

    def kill(self, instance: str) -> None:
        """SIGKILL ``instance`` (no clean-up: its lease is left to lapse)."""
        p = self.procs.pop(instance)
        p.send_signal(signal.SIGKILL)
        p.wait()

    def stop(self) -> None:
        stop_processes(list(self.procs.values()))
        self.procs.clear()
        for f in self.files:
            f.close()
        self.files.clear()


async def until(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float = LIVENESS_S
) -> None:
    """Poll ``check`` (every 20 ms) until it holds; AssertionError naming ``what`` after
    ``timeout`` s. While a NATS server is down this process's own client may time out on a
    read: such a poll counts as not yet.

    The bound is a deadline checked between polls, not a cancellation: nats-py turns a
    cancelled request into its own TimeoutError, which a poll swallows, so a cancelling timeout
    (``asyncio.timeout``) could be lost and the wait go on for ever."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if await check():
                return
        except Exception:  # a read during a server's death: try again
            pass
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.02)


async def retrying(make: Callable[[], Awaitable[object]]) -> None:
    """Retry ``make`` until it succeeds, for up to :data:`LIVENESS_S` (then its last error):
    JetStream's meta leader is elected a moment after the servers answer, and a Redis
    Cluster's dead master is replaced a moment after it dies (a service retries the same way,
    by nak and redelivery). A deadline, as in :func:`until`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LIVENESS_S
    while True:
        try:
            await make()
            return
        except Exception:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.3)


@dataclass
class Domain:
    """One scheduling domain on a NATS cluster: the bus and store of the gateway's side, the
    lease table, the service processes, and the admit placements received per session."""

    bus: Bus
    store: Store
    table: LeaseTable
    procs: Procs
    admits: dict[str, int] = field(default_factory=dict)

    @property
    def planner_key(self) -> str:
        return lease_key("planner", self.store.domain)

    async def holder(self) -> str | None:
        """The instance holding the planner lease now, None if nobody does."""
        got = await self.table.get(self.planner_key)
        return None if got is None else str(orjson.loads(got[0])["instance"])

    async def start_planners(self) -> None:
        """Node ``n1`` with room for every session, valuation ``v1`` and planners ``p1`` and
        ``p2``; returns once one of them holds the lease."""
        await self.store.put_node_status(
            "n1", NodeUpdate(capacity_tokens=200_000, target_utilisation=1.0, healthy=True)
        )
        self.procs.start("valuation", "v1")
        self.procs.start("planner", "p1")
        self.procs.start("planner", "p2")

        async def held() -> bool:
            return await self.holder() is not None

        await until("a planner holds the lease", held)

    async def add_sessions(self, ids: list[str], tokens: int = 1000) -> None:
        """Write waiting sessions (as the tools service would) and wake the valuation."""
        for sid in ids:
            s, _ = on_request(
                Session(sid), "r", 1.0, model="m", gateway_id=GATEWAY, tokens_estimate=tokens
            )
            await retrying(lambda sid=sid, s=s: self.store.update_session(sid, lambda _o: s))
        wake = encode(Wake(reason="arrival", ts=1.0))
        await retrying(lambda: self.bus.publish(subjects.wake(), wake))

    async def admitted(self, ids: list[str]) -> bool:
        for sid in ids:
            s = await self.store.get_session(sid)
            if s is None or s.node is None:
                return False
        return True

    async def placed(self, ids: list[str]) -> bool:
        """Whether an admit placement reached the gateway for every one of ``ids``."""
        return all(self.admits.get(sid, 0) >= 1 for sid in ids)


@contextlib.asynccontextmanager
async def domain(
    nats_url: str, redis_url: str, logs: Path, *, ttl_s: float, replicas: int, **env: str
) -> AsyncIterator[Domain]:
    """A fresh namespace and domain on the servers; removed afterwards, processes stopped."""
    ns = "fo" + uuid.uuid4().hex[:8]
    name = "fo" + uuid.uuid4().hex[:8]
    bus = await Bus.connect(nats_url, name="scale-gateway", namespace=ns, replicas=replicas)
    await retrying(bus.ensure_streams)
    tables: list[LeaseTable] = []

    async def lease() -> None:
        tables.append(await bus.lease_table(ttl_s, replicas=replicas))

    await retrying(lease)
    client = open_redis(redis_url)
    store = Store(client, name)
    base = {
        **os.environ,
        "TAO_NATS_URL": nats_url,
        "TAO_REDIS_URL": redis_url,
        "TAO_NAMESPACE": ns,
        "TAO_DOMAIN": name,
        "TAO_REPLICAS": str(replicas),
        "TAO_LEASE_TTL_S": str(ttl_s),
        "TAO_TICK_S": "0.2",
        "TAO_FRESHNESS_S": "600",
        "TAO_IDLE_TIMEOUT_S": "600",
        "TAO_ACK_WAIT_S": "2",
        "TAO_LOG_FORMAT": "json",
        **env,
    }
    d = Domain(bus, store, tables[0], Procs(base, logs))

    async def on_placement(p: Placement, _: Delivery) -> None:
        if p.kind == "admit":
            d.admits[p.session_id] = d.admits.get(p.session_id, 0) + 1

    await bus.consume(
        subjects.STREAM_PLACEMENT,
        GATEWAY,
        lambda b: decode(b, Placement),
        on_placement,
        filter_subject=subjects.placement(GATEWAY),
    )
    try:
        yield d
    finally:
        d.procs.stop()
        await store.clear()
        await client.aclose()
        with contextlib.suppress(Exception):
            await bus.delete_streams()
        await bus.drain()
