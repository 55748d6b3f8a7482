"""A rate limit on hook posts per session: a token bucket per (tenant, harness, session).

A harness reports a handful of events per tool call (Claude Code: PreToolUse, PostToolUse, and
Stop or UserPromptSubmit per turn), so a session posting more than ``TAO_HOOK_RATE`` events a
second for longer than ``TAO_HOOK_BURST`` events' worth is either broken or trying to flood
the tools service. Its posts beyond that are answered 429 with ``Retry-After`` (a non-blocking
error for the agent) and counted, ``tao_gateway_hooks_total{result="rate_limited"}``.

The session is read from the payload without mapping it: the first string value of
``session_id`` or ``sessionID`` found within four levels of objects, breadth first (Claude
Code, mini-swe-agent and OpenHands put ``session_id`` at the top; OpenCode's hooks
``sessionID`` under ``input``, its events under ``event.properties`` or
``event.properties.part``). A payload that is not JSON, or names no session, shares one
bucket per (tenant, harness); the tools service dead-letters what it cannot map anyway.

At most ``max_keys`` buckets are kept: the least recently used goes first (a bucket unused for
``burst / rate`` seconds is full again, so forgetting it changes nothing).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Final

import orjson

__all__ = ["DEFAULT_BURST", "DEFAULT_RATE", "HookLimiter", "retry_after", "session_of"]

DEFAULT_RATE: Final = 20.0
DEFAULT_BURST: Final = 200
_KEYS: Final = ("session_id", "sessionID")
_DEPTH: Final = 4


def session_of(body: bytes) -> str:
    """The session a hook payload names (module docstring), '' when none is found."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    level: list[Any] = [doc]
    for _ in range(_DEPTH):
        nxt: list[Any] = []
        for obj in level:
            if not isinstance(obj, dict):
                continue
            for key in _KEYS:
                value = obj.get(key)
                if isinstance(value, str) and value:
                    return value
            nxt.extend(v for v in obj.values() if isinstance(v, dict))
        level = nxt
    return ""


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value for ``seconds``: whole seconds, at least 1 (RFC 9110 §10.2.3)."""
    return str(max(1, math.ceil(seconds)))


class HookLimiter:
    """Token buckets of ``burst`` events refilled at ``rate`` per second, per key."""

    def __init__(self, rate: float, burst: int, *, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: OrderedDict[tuple[str, str, str], tuple[float, float]] = OrderedDict()

    def take(self, key: tuple[str, str, str], now: float) -> float:
        """Spend one event of ``key``'s bucket at ``now``: 0.0 when allowed, else the seconds
        until one is available again."""
        tokens, at = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - at) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[key] = (tokens, now)
            wait = (1.0 - tokens) / self.rate
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)
        return wait

    @staticmethod
    def retry_after(wait_s: float) -> str:
        """``Retry-After`` for ``wait_s`` (:func:`retry_after`)."""
        return retry_after(wait_s)

    def __len__(self) -> int:
        return len(self._buckets)
