"""A Redis Cluster master and a NATS server die mid-load: real processes, real servers, SIGKILL.

The domain's state lives on a Redis Cluster of three masters with a replica each (valkey, 1 s
node timeout); the bus on the 3-server NATS cluster. One valuation and two planner replicas run
as processes. The test plays the gateway (tests/scale/harness.py) and writes a steady stream of
waiting sessions; a third of the way in it SIGKILLs the master that owns the domain's hash slot
and one NATS server at once. The master's replica takes the slot over; every session of the
stream, before and after, is admitted once in the store and its admission reaches the gateway;
the node's ``reserved`` equals the admitted weights and stays within its capacity; the sessions
written before the kill are all there. The killed master, restarted, rejoins as a replica.

Time bounds are liveness bounds (generous, for a loaded 2-core machine).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.infra.natscluster import NatsCluster
from shared.infra.rediscluster import RedisClusterProcs
from tests.scale.harness import Domain, domain, until

TTL_S = 1.0
SESSIONS = 45
KILL_AT = 15


@pytest.fixture
async def world(
    cluster: NatsCluster, redis_cluster: RedisClusterProcs, tmp_path: Path
) -> AsyncIterator[Domain]:
    async with domain(cluster.url, redis_cluster.url, tmp_path, ttl_s=TTL_S, replicas=3) as d:
        yield d


async def test_nothing_is_lost_when_a_redis_master_and_a_nats_server_die(
    cluster: NatsCluster, redis_cluster: RedisClusterProcs, world: Domain
) -> None:
    d = world
    await d.start_planners()
    master = redis_cluster.master_of(d.store.keys.pool)
    ids = [f"s{i}" for i in range(SESSIONS)]
    for i, sid in enumerate(ids):
        if i == KILL_AT:
            redis_cluster.kill(master)  # the domain's master, with a NATS server, mid-stream
            cluster.kill(1)
        await d.add_sessions([sid])
        await asyncio.sleep(0.05)

    await until("every session is admitted", lambda: d.admitted(ids), timeout=60)
    await until("every admission reached the gateway", lambda: d.placed(ids), timeout=60)
    assert redis_cluster.master_of(d.store.keys.pool) != master  # its replica took the slot

    sessions = {s.id: s for s in await d.store.sessions()}
    assert sorted(sessions) == sorted(ids)  # the ones written before the kill are there too
    assert all(sessions[sid].node == "n1" for sid in ids)
    node = await d.store.get_node("n1")
    assert node is not None and node.reserved == sum(s.weight for s in sessions.values())
    assert 0 < node.reserved <= node.usable

    redis_cluster.restart(master)  # the old master comes back as its successor's replica
    cluster.restart(1)
    redis_cluster.wait_ok()
    assert redis_cluster.master_of(d.store.keys.pool) != master
