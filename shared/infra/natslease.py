"""The NATS side of :mod:`shared.infra.lease`: the lease bucket as a JetStream KV store."""

from __future__ import annotations

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js.kv import KeyValue

from .errors import BusError
from .lease import LeaseConflict, bucket_name

__all__ = ["NatsLeaseTable", "open_lease_table"]


class NatsLeaseTable:
    """:class:`~shared.infra.lease.LeaseTable` on a JetStream KV bucket (history 1; the
    bucket's TTL lapses a key nobody renews)."""

    def __init__(self, kv: KeyValue, ttl_s: float) -> None:
        self._kv = kv
        self._ttl_s = ttl_s

    @property
    def ttl_s(self) -> float:
        return self._ttl_s

    async def create(self, key: str, value: bytes) -> int:
        try:
            return int(await self._kv.create(key, value))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise LeaseConflict(key) from None

    async def update(self, key: str, value: bytes, last: int) -> int:
        try:
            return int(await self._kv.update(key, value, last=last))
        except nats.js.errors.KeyWrongLastSequenceError:
            raise LeaseConflict(key) from None

    async def get(self, key: str) -> tuple[bytes, int] | None:
        try:
            entry = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            return None
        return (entry.value or b""), int(entry.revision or 0)

    async def delete(self, key: str, last: int) -> None:
        try:
            await self._kv.delete(key, last=last)
        except nats.js.errors.APIError as exc:
            if exc.err_code not in (10071, 10164):  # wrong last sequence: not ours any more
                raise


async def open_lease_table(
    js: JetStreamContext, namespace: str, ttl_s: float, *, replicas: int = 1
) -> NatsLeaseTable:
    """Bind the lease bucket, creating it (TTL ``ttl_s``, ``replicas`` copies) if absent.

    Every member of a domain must agree on the TTL: a bucket that exists with another one is a
    BusError naming both, not silently changed under the running leader. A transient error
    (a JetStream API timeout while the cluster is busy or electing) is retried by the caller
    (:meth:`shared.infra.bus.Bus.lease_table`); ``nats`` errors are raised as they are."""
    name = bucket_name(namespace)
    try:
        kv = await js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        config = api.KeyValueConfig(bucket=name, history=1, ttl=ttl_s, replicas=replicas)
        try:
            kv = await js.create_key_value(config)
        except nats.js.errors.BadRequestError:  # created by a peer meanwhile
            kv = await js.key_value(name)
    have = (await kv.status()).ttl
    if have is not None and abs(have - ttl_s) > 1e-3:
        raise BusError(
            f"lease bucket {name} has TTL {have:g} s but TAO_LEASE_TTL_S is {ttl_s:g} s "
            "(every replica of a domain needs the same; delete the bucket to change it)"
        )
    return NatsLeaseTable(kv, ttl_s)
