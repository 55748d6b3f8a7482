"""Rate limits on hook posts: a token bucket per session, and one per tenant.

A harness reports a handful of events per tool call (Claude Code: PreToolUse, PostToolUse, and
Stop or UserPromptSubmit per turn), so a session posting more than ``TAO_HOOK_RATE`` events a
second for longer than ``TAO_HOOK_BURST`` events' worth is either broken or trying to flood
the tools service. A client that names a new session in every post gets a full bucket each
time, so each tenant (each hook token's tenant; everyone, with authentication off) also has
one bucket of ``TAO_HOOK_TENANT_BURST`` refilled at ``TAO_HOOK_TENANT_RATE``, shared by all
its sessions. A post is allowed when both its session's and its tenant's bucket hold a token
(it spends one of each); beyond that it is answered 429 with ``Retry-After`` (a non-blocking
error for the agent) and counted, ``tao_gateway_hooks_total{result="rate_limited"}``.

The session is read from the payload without mapping it: the first string value of
``session_id`` or ``sessionID`` found within four levels of objects, breadth first (Claude
Code, mini-swe-agent and OpenHands put ``session_id`` at the top; OpenCode's hooks
``sessionID`` under ``input``, its events under ``event.properties`` or
``event.properties.part``). A payload that is not JSON, or names no session, shares one
bucket per (tenant, harness); the tools service dead-letters what it cannot map anyway. The
gateway refuses a session id that is no id (:mod:`.ids`: over 512 characters, or a control
character) with a 400 before any bucket is made for it.

Session buckets are bounded (:class:`.bounded.TenantLRU`): at most ``max_keys_per_tenant`` per
tenant and ``max_keys`` in all, the least recently used first (a bucket unused for
``burst / rate`` seconds is full again, so forgetting it changes nothing; one forgotten
sooner is bounded by the tenant's bucket, which is never forgotten while the tenant posts).
"""

from __future__ import annotations

import math
from typing import Any, Final

import orjson

from services.gateway.bounded import TenantLRU

__all__ = [
    "DEFAULT_BURST",
    "DEFAULT_RATE",
    "DEFAULT_TENANT_BURST",
    "DEFAULT_TENANT_RATE",
    "HookLimiter",
    "named_session",
    "retry_after",
    "session_of",
]

DEFAULT_RATE: Final = 20.0
DEFAULT_BURST: Final = 200
DEFAULT_TENANT_RATE: Final = 1000.0
"""A tenant's hook posts per second: about 400 tool calls a second (Claude Code posts two or
three events per call), hundreds of agents at once."""
DEFAULT_TENANT_BURST: Final = 5000
MAX_KEYS: Final = 100_000
MAX_KEYS_PER_TENANT: Final = 10_000
_KEYS: Final = ("session_id", "sessionID")
_DEPTH: Final = 4

_Bucket = tuple[float, float]
"""``(tokens, at)``: the tokens left at time ``at``."""


def named_session(body: bytes) -> tuple[str, str]:
    """The field and the session a hook payload names (module docstring), ``("", "")`` when
    none is found."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", ""
    level: list[Any] = [doc]
    for _ in range(_DEPTH):
        nxt: list[Any] = []
        for obj in level:
            if not isinstance(obj, dict):
                continue
            for key in _KEYS:
                value = obj.get(key)
                if isinstance(value, str) and value:
                    return key, value
            nxt.extend(v for v in obj.values() if isinstance(v, dict))
        level = nxt
    return "", ""


def session_of(body: bytes) -> str:
    """The session a hook payload names (module docstring), '' when none is found."""
    return named_session(body)[1]


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value for ``seconds``: whole seconds, at least 1 (RFC 9110 §10.2.3)."""
    return str(max(1, math.ceil(seconds)))


def _refilled(bucket: _Bucket | None, now: float, rate: float, burst: int) -> float:
    """The tokens ``bucket`` holds at ``now`` (a new bucket is full)."""
    if bucket is None:
        return float(burst)
    tokens, at = bucket
    return min(float(burst), tokens + max(0.0, now - at) * rate)


class HookLimiter:
    """Token buckets of ``burst`` events refilled at ``rate`` per second per session key
    ``(tenant, harness, session)``, and of ``tenant_burst`` at ``tenant_rate`` per tenant."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        tenant_rate: float = DEFAULT_TENANT_RATE,
        tenant_burst: int = DEFAULT_TENANT_BURST,
        max_keys: int = MAX_KEYS,
        max_keys_per_tenant: int = MAX_KEYS_PER_TENANT,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.tenant_rate = tenant_rate
        self.tenant_burst = tenant_burst
        self.max_keys = max_keys
        self._buckets: TenantLRU[str, tuple[str, str], _Bucket] = TenantLRU(
            min(max_keys_per_tenant, max_keys), max_keys
        )
        self._tenants: dict[str, _Bucket] = {}

    def take(self, key: tuple[str, str, str], now: float) -> float:
        """Spend one event of ``key``'s session bucket and of its tenant's at ``now``: 0.0
        when both allow it, else the seconds until both will (nothing is spent)."""
        tenant, rest = key[0], (key[1], key[2])
        own = _refilled(self._buckets.get(tenant, rest), now, self.rate, self.burst)
        shared = _refilled(self._tenants.get(tenant), now, self.tenant_rate, self.tenant_burst)
        if own >= 1.0 and shared >= 1.0:
            own, shared, wait = own - 1.0, shared - 1.0, 0.0
        else:
            wait = max((1.0 - own) / self.rate, (1.0 - shared) / self.tenant_rate, 0.0)
        self._buckets.put(tenant, rest, (own, now))
        self._tenants[tenant] = (shared, now)
        return wait

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """``Retry-After`` for ``wait_s`` (:func:`retry_after`)."""
        return retry_after(wait_s)

    def __len__(self) -> int:
        return len(self._buckets)

    def count(self, tenant: str) -> int:
        """Session buckets kept for ``tenant``."""
        return self._buckets.count(tenant)
