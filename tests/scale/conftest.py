"""The scale-out tier's servers: a 3-server NATS cluster (JetStream, 3 replicas) for the
session, and a Redis Cluster of 3 masters with a replica each per module that kills one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shared.infra.natscluster import NatsCluster


@pytest.fixture(scope="session")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as c:
        yield c
