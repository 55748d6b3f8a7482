"""The scale-out tier's servers, each started once for the session: a 3-server NATS cluster
(JetStream, 3 replicas) and a Redis Cluster of 3 masters with a replica each (valkey, 1 s node
timeout). A test that kills a server restarts it before it ends."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.infra.natscluster import NatsCluster
from shared.infra.rediscluster import RedisClusterProcs


@pytest.fixture(scope="session")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as c:
        yield c


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcs]:
    with RedisClusterProcs(masters=3, replicas=1, node_timeout_ms=1000) as c:
        yield c
