"""A map keyed by client input, bounded per tenant and over all tenants (pure).

Every map the gateway keys by what a client sends (the hook limiter's buckets, the domain
router's sessions, the continuation tips, the served Responses ids, the prompt calibration)
is one of these, so no client can grow the gateway's memory without bound, and no tenant can
push another's entries out:

* at most ``per_tenant`` entries of one tenant: one more drops that tenant's least recently
  used entry;
* at most ``total`` entries over all tenants: one more drops the least recently used entry of
  the tenant that holds the most (the one filling the map pays for it; a tenant within its fair
  share keeps its entries while another floods).

Keys are checked for length by their callers before they get here (:mod:`.ids`). Each drop
is counted (:attr:`TenantLRU.dropped`) and passed to ``on_drop`` (an index beside the map
forgets the entry too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["TenantLRU"]

T = TypeVar("T", bound=Hashable)
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TenantLRU(Generic[T, K, V]):
    """Least-recently-used maps per tenant ``T`` of ``K`` to ``V`` (module docstring)."""

    def __init__(
        self,
        per_tenant: int,
        total: int,
        on_drop: Callable[[T, K, V], None] | None = None,
    ) -> None:
        if per_tenant < 1 or total < 1:
            raise ValueError(f"per_tenant and total must be >= 1, got {per_tenant}, {total}")
        self.per_tenant = per_tenant
        self.total = total
        self.on_drop = on_drop
        self.dropped = 0
        """Entries dropped by the bounds (not by :meth:`pop`)."""
        self._maps: dict[T, OrderedDict[K, V]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def count(self, tenant: T) -> int:
        """Entries of ``tenant``."""
        found = self._maps.get(tenant)
        return 0 if found is None else len(found)

    def get(self, tenant: T, key: K, *, touch: bool = True) -> V | None:
        """``key``'s value for ``tenant`` (made the most recently used when ``touch``)."""
        found = self._maps.get(tenant)
        if found is None:
            return None
        value = found.get(key)
        if value is not None and touch:
            found.move_to_end(key)
        return value

    def put(self, tenant: T, key: K, value: V) -> None:
        """Set ``key`` of ``tenant`` to ``value``, the most recently used; then drop what the
        bounds do not hold."""
        found = self._maps.setdefault(tenant, OrderedDict())
        if key in found:
            found.move_to_end(key)
        else:
            self._size += 1
        found[key] = value
        while len(found) > self.per_tenant:
            self._drop(tenant)
        while self._size > self.total:
            self._drop(max(self._maps, key=lambda t: len(self._maps[t])))

    def pop(self, tenant: T, key: K) -> V | None:
        """Remove ``key`` of ``tenant``; its value, ``None`` when absent."""
        found = self._maps.get(tenant)
        if found is None or key not in found:
            return None
        value = found.pop(key)
        self._size -= 1
        if not found:
            del self._maps[tenant]
        return value

    def oldest(self, tenant: T) -> tuple[K, V] | None:
        """``tenant``'s least recently used entry, ``None`` when it has none."""
        found = self._maps.get(tenant)
        if not found:
            return None
        return next(iter(found.items()))

    def drop_oldest(self, tenant: T) -> None:
        """Drop ``tenant``'s least recently used entry (an expiry), counted as a drop."""
        if self._maps.get(tenant):
            self._drop(tenant)

    def tenants(self) -> Iterator[T]:
        """The tenants with entries."""
        return iter(list(self._maps))

    def _drop(self, tenant: T) -> None:
        found = self._maps[tenant]
        key, value = found.popitem(last=False)
        self._size -= 1
        self.dropped += 1
        if not found:
            del self._maps[tenant]
        if self.on_drop is not None:
            self.on_drop(tenant, key, value)
