"""The scale-out tier's servers, each started once for the session: a 3-server NATS cluster
(JetStream, 3 replicas) and a Redis Cluster of 3 masters with a replica each (valkey, 1 s node
timeout). After every test each cluster it used is healed: a server the test killed (and did
not restart, because it failed first) is restarted, and the next test waits until the cluster
has settled, so one failure does not cascade into the next test's set-up. A failed test's
report carries its processes' warning and error lines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.infra.natscluster import NatsCluster
from shared.infra.rediscluster import RedisClusterProcs
from shared.infra.serverset import ServerSet
from tests.logs import telling_lines


@pytest.fixture(scope="session")
def cluster() -> Iterator[NatsCluster]:
    with NatsCluster(3) as c:
        yield c


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterProcs]:
    with RedisClusterProcs(masters=3, replicas=1, node_timeout_ms=1000) as c:
        yield c


@pytest.fixture(autouse=True)
def _healed(request: pytest.FixtureRequest) -> Iterator[None]:
    used: list[ServerSet] = [
        request.getfixturevalue(name)
        for name in ("cluster", "redis_cluster")
        if name in request.fixturenames
    ]
    for servers in used:  # settled before the test (a previous test's restart caught up)
        servers.settled()
    yield
    for servers in used:
        servers.heal()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the warnings and errors of the processes it started
    (their logs are under its ``tmp_path``)."""
    report = yield
    if report.failed and call.when == "call":
        logs = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(logs, Path):
            report.sections.append((f"process logs {logs}", telling_lines(logs) or "(nothing)"))
    return report
