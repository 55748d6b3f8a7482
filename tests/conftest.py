"""Fixtures for the whole suite: the NATS and Redis servers, and a fresh namespace per test.

Servers, in order of preference: ``TAO_TEST_NATS_URL`` / ``TAO_TEST_REDIS_URL`` when set; the
local servers at 127.0.0.1:4222 (JetStream on) and 127.0.0.1:6379 when they answer; else
embedded servers (``shared.infra.embedded``) started once for the session, only when a test
asks for them. So ``bash scripts/test.sh`` runs anywhere the project installs. A Redis Cluster
(``TAO_TEST_REDIS_CLUSTER_URL``, else 3 masters and 3 replicas of the embedded Valkey,
:mod:`shared.infra.rediscluster`) starts the same way, for the tests that ask for one.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from shared.infra.embedded import EmbeddedServers, nats_answers, redis_answers
from shared.infra.rediscluster import RedisClusterProcs

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    """URL of a NATS server with JetStream: configured, local, or embedded for the session."""
    url = os.environ.get("TAO_TEST_NATS_URL")
    if url:
        yield url
    elif nats_answers(LOCAL_NATS):
        yield LOCAL_NATS
    else:
        with EmbeddedServers(nats=True, redis=False) as servers:
            assert servers.nats_url is not None
            yield servers.nats_url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a Redis-protocol server: configured, local, or embedded Valkey for the session."""
    url = os.environ.get("TAO_TEST_REDIS_URL")
    if url:
        yield url
    elif redis_answers(LOCAL_REDIS):
        yield LOCAL_REDIS
    else:
        with EmbeddedServers(nats=False, redis=True) as servers:
            assert servers.redis_url is not None
            yield servers.redis_url


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """URL (``redis+cluster://``) of a Redis Cluster: configured, or 3 masters with a replica
    each, started for the session."""
    url = os.environ.get("TAO_TEST_REDIS_CLUSTER_URL")
    if url:
        yield url
    else:
        with RedisClusterProcs(masters=3, replicas=1) as cluster:
            yield cluster.url


@pytest.fixture
def namespace() -> str:
    """A fresh bus namespace / key prefix, so tests never collide on a shared server."""
    return "t" + uuid.uuid4().hex[:12]
