"""One way to open the state store's Redis client, for a single server or a Redis Cluster.

``TAO_REDIS_URL`` names either

* one server: ``redis://[user:password@]host:port/db`` (also ``rediss://``, ``unix://``,
  ``valkey://``), opened with ``redis.asyncio.Redis.from_url``; or
* a Redis (or Valkey) Cluster: ``redis+cluster://[user:password@]host:port[,host:port...]``
  (``rediss+cluster://`` with TLS). The hosts are *startup nodes*: the client asks the first
  one that answers for the slot map (``CLUSTER SLOTS``) and then talks to every master itself,
  following ``MOVED``/``ASK`` redirections and re-reading the map when a master fails over.
  Several startup nodes let a service start while one of them is down. A cluster has no
  database number: a path is refused.

Every key of a scheduling domain carries the ``{<domain>}`` hash tag (:mod:`.keys`), so each of
the store's multi-key scripts and ``WATCH``/``MULTI`` transactions touches one slot and runs on
the master that owns it, atomically, exactly as on one server (docs/scale-out.md).
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import unquote, urlsplit

from .errors import SettingsError

__all__ = ["CLUSTER_SCHEMES", "is_cluster_url", "open_redis", "startup_nodes"]

CLUSTER_SCHEMES: Final = ("redis+cluster", "rediss+cluster")

CLUSTER_RETRIES: Final = 8
"""Attempts a cluster command makes across a master's failover (redis-py re-reads the slot map
between attempts, with exponential backoff; valkey's default ``cluster-node-timeout`` is 15 s,
the tests' 1 s, so a service also retries at its own level: nak and redelivery)."""


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (scheme :data:`CLUSTER_SCHEMES`)."""
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def startup_nodes(url: str) -> list[tuple[str, int]]:
    """``(host, port)`` of each startup node of a cluster URL; :class:`SettingsError` if the URL
    has no host, a bad port or a database path."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if parts.path not in ("", "/"):
        raise SettingsError("TAO_REDIS_URL", None, "a Redis Cluster URL has no database path")
    out: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":")
        if not sep:
            host, port = item, "6379"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError("TAO_REDIS_URL", None, f"bad cluster node {item!r} (host:port)")
        out.append((host.strip("[]"), int(port)))
    return out


def open_redis(url: str, **options: Any) -> Any:
    """A ``redis.asyncio`` client for ``url`` (a ``Redis``, or a ``RedisCluster`` for a cluster
    URL); ``options`` go to the client (``socket_timeout``, ``socket_connect_timeout``...).
    Nothing is sent until the first command."""
    import redis.asyncio as aioredis  # only processes that use Redis pay for the import

    if not is_cluster_url(url):
        return aioredis.Redis.from_url(url, **options)
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    parts = urlsplit(url)
    if parts.username is not None:
        options.setdefault("username", unquote(parts.username))
    if parts.password is not None:
        options.setdefault("password", unquote(parts.password))
    if parts.scheme.lower().startswith("rediss"):
        options.setdefault("ssl", True)
    nodes = [ClusterNode(host, port) for host, port in startup_nodes(url)]
    retry = Retry(ExponentialBackoff(cap=1.0, base=0.05), CLUSTER_RETRIES)
    return RedisCluster(startup_nodes=nodes, retry=retry, **options)
