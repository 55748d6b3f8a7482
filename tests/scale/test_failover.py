"""Planner failover on a 3-server NATS cluster: real processes, real servers, SIGKILL.

A NATS cluster of three nats-servers (JetStream, streams and the lease bucket with 3 replicas),
the test's Redis, one valuation and two planner replicas (``python -m services.…``). The test
plays the gateway (tests/scale/harness.py): it writes waiting sessions into the domain's store,
wakes the valuation, and reads the placements stream. Mid-load it SIGKILLs the leading planner
and one NATS server at once; the standby must take the lease, fence the domain at a larger
epoch and admit the sessions that arrive afterwards; no session is lost, none is admitted
twice in the store, and no node is over-committed. The killed planner, restarted under its
instance name, stays a standby while the other one holds the lease.

Time bounds here are liveness bounds (generous, for a loaded 2-core machine); the failover
time itself is measured by ``benchmarks/failover.py`` (docs/scale-out.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.infra.natscluster import NatsCluster
from tests.scale.harness import Domain, domain, until

TTL_S = 1.0


@pytest.fixture
async def world(cluster: NatsCluster, redis_url: str, tmp_path: Path) -> AsyncIterator[Domain]:
    async with domain(cluster.url, redis_url, tmp_path, ttl_s=TTL_S, replicas=3) as d:
        yield d


async def test_standby_takes_over_when_the_leader_and_a_nats_server_die(
    cluster: NatsCluster, world: Domain
) -> None:
    d = world
    await d.start_planners()
    first = [f"a{i}" for i in range(10)]
    await d.add_sessions(first)
    await until("the first sessions are admitted", lambda: d.admitted(first))
    leader = await d.holder()
    assert leader in ("p1", "p2")
    standby = "p2" if leader == "p1" else "p1"
    epoch_before = int((await d.store.planner_stats())["epoch"])  # type: ignore[call-overload]

    assert d.procs.running(standby), "the standby exited before the failover"
    d.procs.kill(leader)  # the leader dies mid-load, with one NATS server
    cluster.kill(0)
    second = [f"b{i}" for i in range(10)]
    await d.add_sessions(second)

    async def taken() -> bool:
        return await d.holder() == standby

    await until("the standby holds the lease", taken)
    await until("the later sessions are admitted", lambda: d.admitted(second))
    await until("every admission reached the gateway", lambda: d.placed(first + second))

    stats = await d.store.planner_stats()
    assert int(stats["epoch"]) > epoch_before  # type: ignore[call-overload]
    sessions = {s.id: s for s in await d.store.sessions()}
    assert all(sessions[sid].node == "n1" for sid in first + second)
    node = await d.store.get_node("n1")
    assert node is not None and node.reserved == sum(s.weight for s in sessions.values())
    assert node.reserved <= node.usable

    d.procs.start("planner", leader)  # back under its own name: the other still holds the lease
    cluster.restart(0)
    await until("the restarted planner is up", lambda: d.procs.logged(leader, "planner_warm", 2))
    await asyncio.sleep(3 * TTL_S)  # a few lease periods as a standby
    assert await d.holder() == standby
    assert d.procs.logged_count(leader, "lease_acquired") == 1  # only its first life led
