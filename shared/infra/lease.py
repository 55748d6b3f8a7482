"""Leader election per scheduling domain: a lease in a NATS JetStream KV bucket, fenced by epoch.

Several replicas of a service that must act alone in its domain (the planner, the valuation)
run side by side; one holds the lease and acts, the others wait as hot standbys. The lease is
one key of the bucket ``TAO_V1_LEASE`` (namespaced like the streams), ``<role>.<domain>``,
whose value names the holder. The bucket's TTL (``TAO_LEASE_TTL_S``, the stream's
``max_age``) removes a key nobody renews, so a dead leader's lease lapses by itself:

* **acquire**: ``create`` (succeeds only if the key is absent, or deleted): the revision it
  returns is the holder's **epoch**. Revisions are the bucket stream's sequence numbers, so each
  new epoch is larger than every earlier one. A holder restarted with the same instance name
  (``TAO_INSTANCE``) takes its own lease back at once with a revision-checked update (a new,
  larger epoch) instead of waiting for it to lapse.
* **renew**: every ``ttl / 3``, a revision-checked ``update`` (``last`` = the revision it
  holds). It fails when someone else wrote the key meanwhile: the holder is deposed at once.
* **validity**: the holder acts only while ``now < last renewal + ttl × SAFETY``, measured on
  its own monotonic clock from *before* the renewal was sent, so it stops before the server can
  let the key lapse and a standby take over (clocks need only run at about the same rate).
* **standby**: tries ``create`` every ``ttl / 4``; a clean stop deletes the key (revision
  checked), so a standby takes over within one try, and a crash within about ``ttl + ttl / 4``.
* **fencing**: a deposed leader that has not noticed yet (paused, partitioned) may still send
  a plan. The new leader raises the domain's stored epoch in Redis on taking over
  (:meth:`shared.infra.store_types.StateStore.fence`), and the apply script refuses a plan
  whose epoch is below it (``Applied.fenced``), so a late plan of an old epoch changes nothing.

On a NATS cluster the bucket is replicated (``replicas``, at most the cluster size); a KV write
succeeds only once a quorum has it, so a lease survives the loss of a minority of servers.
:class:`MemoryLeaseTable` is the same table in memory, for :class:`~shared.infra.fakes.FakeBus`.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

import anyio
import orjson
from structlog.typing import FilteringBoundLogger

from shared.contracts import subjects

from .errors import BusError
from .logging import get_logger

__all__ = [
    "BUCKET",
    "SAFETY",
    "Leadership",
    "LeaseConflict",
    "LeaseTable",
    "MemoryLeaseTable",
    "bucket_name",
    "default_instance",
    "lease_key",
]

BUCKET: Final = subjects.LEASE_BUCKET
"""The KV bucket of every lease (``<namespace>_TAO_V1_LEASE`` on a namespaced bus)."""
SAFETY: Final = 0.8
"""The share of the TTL a holder counts its lease valid for after a renewal was sent."""

_log = get_logger("shared.infra.lease")


class LeaseConflict(BusError):
    """The lease ``key`` is held by someone else (a create found it, or an update lost a race)."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"lease {key}: held by another instance")


class LeaseTable(Protocol):
    """The revision-checked key-value operations a lease needs (a NATS KV bucket's)."""

    @property
    def ttl_s(self) -> float:
        """How long a key lives after its last write, s."""
        ...

    async def create(self, key: str, value: bytes) -> int:
        """Write ``key`` if it is absent or deleted; its revision. LeaseConflict if present."""
        ...

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write ``key`` if its revision is still ``last``; the new one. LeaseConflict if not."""
        ...

    async def get(self, key: str) -> tuple[bytes, int] | None:
        """The value and revision of ``key``, None when absent or deleted."""
        ...

    async def delete(self, key: str, last: int) -> None:
        """Delete ``key`` if its revision is still ``last`` (else leave it)."""
        ...


def bucket_name(namespace: str) -> str:
    """The lease bucket of ``namespace`` (``<namespace>_TAO_V1_LEASE``, like the streams)."""
    return subjects.lease_bucket(namespace)


def lease_key(role: str, domain: str) -> str:
    """The lease of ``role`` (a service name) in ``domain``."""
    return f"{role}.{domain}"


def default_instance(service: str) -> str:
    """``<host>-<service>``: stable across restarts of one container or host, distinct between
    hosts (so a restarted leader takes its lease back at once)."""
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in socket.gethostname())
    return f"{host or 'host'}-{service}"


@dataclass(slots=True)
class _Entry:
    value: bytes
    revision: int
    written: float
    deleted: bool = False


@dataclass(slots=True)
class MemoryLeaseTable:
    """:class:`LeaseTable` in memory: one revision counter, keys lapse ``ttl_s`` after their
    last write (on ``clock``), as the NATS bucket's do."""

    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _revision: int = 0

    def _live(self, key: str) -> _Entry | None:
        e = self._entries.get(key)
        if e is not None and self.clock() - e.written >= self.ttl_s:
            del self._entries[key]
            return None
        return e

    def _write(self, key: str, value: bytes, deleted: bool = False) -> int:
        self._revision += 1
        self._entries[key] = _Entry(value, self._revision, self.clock(), deleted)
        return self._revision

    async def create(self, key: str, value: bytes) -> int:
        e = self._live(key)
        if e is not None and not e.deleted:
            raise LeaseConflict(key)
        return self._write(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        e = self._live(key)
        if (0 if e is None else e.revision) != last:
            raise LeaseConflict(key)
        return self._write(key, value)

    async def get(self, key: str) -> tuple[bytes, int] | None:
        e = self._live(key)
        return None if e is None or e.deleted else (e.value, e.revision)

    async def delete(self, key: str, last: int) -> None:
        e = self._live(key)
        if e is not None and e.revision == last:
            self._write(key, b"", deleted=True)


OnChange = Callable[[int], Awaitable[None]]
"""``async def on_change(epoch)``: called on taking the lease (epoch > 0) and on losing it (0)."""


@dataclass(slots=True)
class Leadership:
    """One instance's side of a lease: :meth:`run` keeps trying to hold it, and
    :attr:`leading` says whether this instance may act now.

    ``epoch`` is the revision this instance acquired the lease at (0 while it does not hold
    it); every write it makes to the domain's state carries it, for fencing."""

    table: LeaseTable
    key: str
    instance: str
    clock: Callable[[], float] = time.monotonic
    log: FilteringBoundLogger = field(default_factory=lambda: _log)
    epoch: int = 0
    revision: int = 0
    valid_until: float = 0.0
    takeovers: int = 0
    """How many times this instance has taken the lease."""

    @property
    def leading(self) -> bool:
        """Whether this instance holds the lease and it cannot have lapsed yet."""
        return self.epoch > 0 and self.clock() < self.valid_until

    def _value(self, epoch: int) -> bytes:
        return orjson.dumps({"instance": self.instance, "epoch": epoch, "at": time.time()})

    async def _take(self) -> bool:
        """One try to acquire (create; or, when this instance's own name holds it, update)."""
        sent = self.clock()
        try:
            rev = await self.table.create(self.key, self._value(0))
        except LeaseConflict:
            held = await self.table.get(self.key)
            if held is None:
                return False  # it lapsed between the two calls: the next try creates it
            value, rev = held
            if _holder(value) != self.instance:
                return False
            try:  # our own lease from before a restart: take it back with a new epoch
                rev = await self.table.update(self.key, self._value(0), rev)
            except LeaseConflict:
                return False
        self.epoch = self.revision = rev
        self.valid_until = sent + self.table.ttl_s * SAFETY
        self.takeovers += 1
        return True

    async def _renew(self) -> bool:
        sent = self.clock()
        try:
            self.revision = await self.table.update(
                self.key, self._value(self.epoch), self.revision
            )
        except LeaseConflict:
            return False
        self.valid_until = sent + self.table.ttl_s * SAFETY
        return True

    async def step(self) -> bool:
        """Acquire or renew once; whether this instance leads afterwards. A bus error counts as
        a failed try (the lease stays valid until it would have lapsed)."""
        try:
            if self.epoch > 0 and self.clock() < self.valid_until:
                return await self._renew() or self._lost()
            self.epoch = 0
            return await self._take()
        except LeaseConflict:
            return self._lost()
        except Exception as exc:  # a NATS outage: keep what is still valid, retry next period
            self.log.warning("lease_error", key=self.key, error=str(exc) or type(exc).__name__)
            return self.leading

    def _lost(self) -> bool:
        self.epoch = 0
        return False

    async def run(self, on_change: OnChange) -> None:
        """Hold the lease while it can, forever (until cancelled; then release it). Calls
        ``on_change(epoch)`` on each takeover and ``on_change(0)`` when it is lost.

        A takeover's hand-over runs beside the renewals, never in their way: the planner's
        (a fence, then every admission re-published) took 3 s at 10,000 sessions on the 2-core
        machine, longer than the 2 s lease, which then lapsed in the middle of it, was taken
        again with a new epoch that fenced out the plans in flight, and was handed over again,
        over and over. A hand-over that fails is told again next period; one still running
        when the lease changes hands finishes before the next one starts."""
        ttl = self.table.ttl_s
        was = 0  # the epoch whose hand-over is done
        busy = False  # a hand-over is running

        async def hand_over(epoch: int) -> None:
            nonlocal was, busy
            try:
                if await self._tell(on_change, epoch) and self.epoch == epoch:
                    was = epoch  # else told again next period
            finally:
                busy = False

        try:
            async with anyio.create_task_group() as tg:
                while True:
                    leading = await self.step()
                    if leading and self.epoch != was:
                        if not busy:
                            self.log.info("lease_acquired", key=self.key, epoch=self.epoch)
                            busy = True
                            tg.start_soon(hand_over, self.epoch)
                    elif not leading and was:
                        self.log.warning("lease_lost", key=self.key, epoch=was)
                        was = 0
                        await self._tell(on_change, 0)
                    await anyio.sleep(ttl / 3 if leading else ttl / 4)
        finally:
            with anyio.CancelScope(shield=True):
                await self.release()

    async def _tell(self, on_change: OnChange, epoch: int) -> bool:
        """Run ``on_change(epoch)``; a failure (the store down during the hand-over) is logged
        and reported, never raised: the caller tries again next period."""
        try:
            await on_change(epoch)
        except Exception as exc:
            self.log.warning(
                "lease_handover_failed", key=self.key, epoch=epoch, error=str(exc) or repr(exc)
            )
            return False
        return True

    async def release(self) -> None:
        """Give the lease up now (a clean stop), so a standby need not wait for it to lapse."""
        if self.epoch > 0:
            self.epoch = 0
            with contextlib.suppress(Exception):
                with anyio.fail_after(2.0):
                    await self.table.delete(self.key, self.revision)


def _holder(value: bytes) -> str | None:
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    name = doc.get("instance") if isinstance(doc, dict) else None
    return name if isinstance(name, str) else None
