"""Pacing each client's request bodies: a byte rate per client, by back-pressure (pure).

A client that sends bodies as fast as its link allows (the abuse benchmark's attacker: nine
30 MB bodies a second, or 88 gzip bombs) makes the gateway receive, join, inflate and scan
every byte of them on the cores the agents beside it need; each body is refused or served
within the bounds of :mod:`.bodies`, but nothing bounded how many a client could send a
second. Here each client has a byte budget: ``burst`` decoded bytes at once (by default one
body of the largest size allowed, so a single large request is never slowed), then ``rate``
bytes a second (``TAO_BODY_CLIENT_RATE``, ``TAO_BODY_CLIENT_BURST``). Past it the gateway
does not refuse anything: :func:`.bodies.read_raw` waits before it reads the client's next
chunk, the server stops reading that connection once its buffer is full, and TCP slows the
sender. The wait is not counted against the body's arrival deadline (``TAO_BODY_MIN_RATE``).

The budget is a generic cell rate algorithm (GCRA, the token bucket kept as one time per
client): the client's *theoretical arrival time* ``tat`` advances ``n / rate`` per ``n``
bytes; a read may go on while ``tat`` is at most ``burst / rate`` ahead of now, and waits out
the excess. Concurrent bodies of one client (several connections) advance the same ``tat``,
each chunk in turn, so none of them is starved and together they get ``rate``.

A client is its tenant (``Caller.name``: the API key's tenant, ``""`` for the gateway's own
key or with authentication off) and its address (IPv4, or the /64 of an IPv6 address, which
one host can pick from at will). Budgets are kept in a :class:`.bounded.TenantLRU`; one
forgotten is full again, as it would be after ``burst / rate`` seconds idle.
"""

from __future__ import annotations

import ipaddress
from typing import Final

from services.gateway.bounded import TenantLRU
from shared.infra.settings import Settings

__all__ = ["MAX_CLIENTS", "MAX_CLIENTS_PER_TENANT", "BodyPacer", "client_address", "pacer_of"]

MAX_CLIENTS: Final = 100_000
MAX_CLIENTS_PER_TENANT: Final = 10_000


def client_address(remote: str | None) -> str:
    """The address a budget is kept for: an IPv4 address as is, an IPv6 one by its /64
    prefix, anything else (a Unix socket, unknown) as given."""
    if not remote:
        return ""
    try:
        ip = ipaddress.ip_address(remote)
    except ValueError:
        return remote[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


class BodyPacer:
    """Per-client byte budgets of request bodies (module docstring)."""

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        per_tenant: int = MAX_CLIENTS_PER_TENANT,
        total: int = MAX_CLIENTS,
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate and burst must be > 0, got {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self._tat: TenantLRU[str, str, float] = TenantLRU(per_tenant, total)
        self.paced_s = 0.0
        """Seconds of waiting imposed so far, over all clients."""

    def charge(self, tenant: str, address: str, n: int, now: float) -> float:
        """Count ``n`` decoded bytes of the client's body at ``now``; return the seconds to
        wait before reading more of it (0 within the budget)."""
        tat = self._tat.get(tenant, address)
        tat = max(now if tat is None else tat, now) + n / self.rate
        self._tat.put(tenant, address, tat)
        wait = tat - now - self.burst / self.rate
        if wait <= 0:
            return 0.0
        self.paced_s += wait
        return wait


def pacer_of(settings: Settings) -> BodyPacer | None:
    """The gateway's pacer: ``TAO_BODY_CLIENT_RATE`` bytes/s per client (0: none), a burst of
    ``TAO_BODY_CLIENT_BURST`` bytes (0: one body of ``TAO_MAX_BODY_BYTES``)."""
    if settings.body_client_rate <= 0:
        return None
    burst = settings.body_client_burst or settings.max_body_bytes
    return BodyPacer(settings.body_client_rate, burst)
