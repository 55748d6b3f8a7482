"""Session continuation by content: a request that names no session joins the one it extends (pure).

Many clients name no session (the ``openai`` SDK by default, LiteLLM- and LangChain-based
agents, SWE-agent, trace replayers), but every turn of an agent re-sends its conversation: the
messages of the previous request, an answer in the assistant's place, and what came after.
The gateway remembers, per live session, one *tip*: its last request's items followed by the
answer it returned (streamed or not), read as :mod:`.items` reads every API.

**Chains.** ``h[0] = H(tenant)``, ``h[i] = BLAKE2b-128(h[i-1] || kind || 0 || text)``: each
position names the whole conversation up to it, so two chains meet at position ``i`` exactly
when their first ``i`` items are equal, and a tenant's chains never meet another's. Each
request and tip has two: the *exact* chain of its items, and the *loose* chain of the same
items with each assistant turn (text and calls) one marker (:func:`.items.loose_items`).

**Matching** (:meth:`Continuations.claim`), among the live sessions of the request's tenant:

1. *Exact*: the request's exact positions, longest first. At the first position that is some
   session's tip: the oldest idle session there joins; if every session there has a request
   running (a retry of it, or a parallel sample of the same turn), a new session starts.
   This is a client that re-sent the answer it was served: each of several forks with the
   same first turns joins its own session, as their answers differ.
2. *Loose*, when no exact position matched: the request's loose positions, longest first. At
   the first position that is some session's loose tip (idle or running), the request joins
   that session only when it is the **only** one there and has no request running. So a
   client that re-sends its own history (a trace's assistant text, not the served one; AIPerf
   and agentic-bench replays do) keeps its session, while
   * forks (two sessions whose last requests share the prefix, their answers aside) and
   * parallel samples (two requests at once extending one session: the second finds it
     running)
   are never merged: the request starts a session of its own. Its cache credit still comes by
   content: its first response reports the block keys of its prompt's token ids, and the KV
   index and the shared-prefix registry match keys by content.

**Claims and retries.** A claimed tip is taken out of the idle index while its request runs
(listed as running under the same hashes) and the session gets its new tip when the answer is
complete (:meth:`Continuations.answered`). A request that fails or whose client leaves before
a complete answer gives the tip back (:meth:`Continuations.release`), so the client's retry
joins the same session.

**Bounds** (:class:`.bounded.TenantLRU`): at most ``max_sessions`` sessions per tenant and
``max_total`` over all tenants, the least recently used dropped first (over all: the tenant
holding the most pays); a session's tip lives ``ttl_s`` after its last use (TAO's idle
timeout: the session is ended by then) and is dropped at once when the session ends
(:meth:`Continuations.forget`). A session costs two 16-byte digests, its id and a few dict
slots: about 2 KB (``benchmarks/continuation.py``).

Explicit ids always win: the gateway asks this only when nothing named the session
(:mod:`.requests`, "Session identity").
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Final

from services.gateway.bounded import TenantLRU
from services.gateway.items import (
    ASSISTANT_TURN,
    Item,
    answer_items,
    anthropic_items,
    chat_items,
    loose_items,
    responses_items,
)

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_TOTAL",
    "Continuations",
    "Conversation",
    "Item",
    "answer_items",
    "anthropic_items",
    "chain",
    "chat_items",
    "conversation",
    "responses_items",
    "root",
]

DEFAULT_MAX_SESSIONS: Final = 100_000
"""Sessions remembered per tenant (about 200 MB at most)."""
DEFAULT_MAX_TOTAL: Final = 2 * DEFAULT_MAX_SESSIONS
"""Sessions remembered over all tenants."""
_DIGEST: Final = 16

Tip = tuple[bytes, bytes]
"""A session's last request + answer: its exact and its loose hash."""


def root(tenant: str | None) -> bytes:
    """The chain's start for a tenant (``None``: authentication off)."""
    return blake2b(b"tao-continuation\x00" + (tenant or "").encode(), digest_size=_DIGEST).digest()


def chain(start: bytes, items: Iterable[Item]) -> list[bytes]:
    """The hash chain over ``items`` from ``start`` (module docstring); ``[i]`` names items
    ``0..i``."""
    out: list[bytes] = []
    h = start
    for kind, text in items:
        step = blake2b(h, digest_size=_DIGEST)
        step.update(kind.encode())
        step.update(b"\x00")
        step.update(text.encode("utf-8", "surrogatepass"))
        h = step.digest()
        out.append(h)
    return out


@dataclass(frozen=True, slots=True)
class Conversation:
    """A request's two chains (module docstring), and the tip an answer to it makes."""

    exact: list[bytes]
    loose: list[bytes]
    loose_open: bool
    """The request ends with an assistant turn (an answer continues it)."""

    def tip(self, answer: Sequence[Item]) -> Tip:
        """The session's tip once ``answer`` (its items) answered this request."""
        exact = chain(self.exact[-1], answer)[-1] if answer else self.exact[-1]
        if not answer or self.loose_open:
            return exact, self.loose[-1]
        return exact, chain(self.loose[-1], [ASSISTANT_TURN])[-1]


def conversation(tenant: str | None, items: Sequence[Item]) -> Conversation | None:
    """The chains of a request's ``items`` (``None`` when it has none)."""
    if not items:
        return None
    start = root(tenant)
    loose, loose_open = loose_items(items)
    return Conversation(chain(start, items), chain(start, loose), loose_open)


@dataclass(slots=True)
class _Entry:
    tip: Tip | None
    """The session's last request + answer; ``None`` while a request of it runs."""
    claimed: Tip | None
    """The tip the running request took (given back if it fails)."""
    used_at: float


class Continuations:
    """The tips of live sessions that no client named, per tenant (module docstring)."""

    def __init__(
        self,
        *,
        ttl_s: float,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_total: int | None = None,
    ) -> None:
        if ttl_s <= 0 or max_sessions < 1:
            raise ValueError(
                f"ttl_s must be > 0 and max_sessions >= 1, got {ttl_s}, {max_sessions}"
            )
        self.ttl_s = ttl_s
        total = max(max_sessions, max_total if max_total is not None else 2 * max_sessions)
        self._lru: TenantLRU[str | None, str, _Entry] = TenantLRU(
            max_sessions, total, self._dropped
        )
        self._tenant_of: dict[str, str | None] = {}
        self._idle: tuple[dict[bytes, deque[str]], dict[bytes, deque[str]]] = ({}, {})
        """Idle sessions by exact tip, by loose tip (oldest first)."""
        self._running: tuple[dict[bytes, set[str]], dict[bytes, set[str]]] = ({}, {})
        """Sessions with a request running, by the exact / loose tip it claimed."""

    @property
    def max_sessions(self) -> int:
        return self._lru.per_tenant

    @property
    def dropped(self) -> int:
        """Sessions forgotten by the bounds (count or time), not by their end."""
        return self._lru.dropped

    def __len__(self) -> int:
        return len(self._lru)

    def claim(
        self,
        tenant: str | None,
        hashes: Sequence[bytes],
        now: float,
        loose: Sequence[bytes] = (),
    ) -> str | None:
        """The live session the request with exact chain ``hashes`` and loose chain ``loose``
        joins (module docstring, "Matching"), taken for the request that now runs; ``None``:
        a new session."""
        self._expire(tenant, now)
        for side, chain_ in enumerate((hashes, loose)):
            idle, running = self._idle[side], self._running[side]
            for h in reversed(chain_):
                waiting = idle.get(h)
                busy = running.get(h)
                if not waiting and not busy:
                    continue
                if waiting and (side == 0 or (len(waiting) == 1 and not busy)):
                    return self._take(tenant, waiting[0], now)
                return None
        return None

    def begin(self, tenant: str | None, session: str, now: float) -> None:
        """Remember ``session``, new, with its first request running (no tip yet)."""
        self._expire(tenant, now)
        self.forget(session)
        self._tenant_of[session] = tenant
        self._lru.put(tenant, session, _Entry(None, None, now))

    def answered(self, session: str, tip: Tip | bytes, now: float) -> None:
        """The session's request got its whole answer: ``tip`` (request + answer; a bare
        exact hash also stands for the loose one) is now what a continuation extends."""
        entry = self._find(session)
        if entry is None:
            return
        self._unindex(session, entry)
        pair = tip if isinstance(tip, tuple) else (tip, tip)
        entry.tip, entry.claimed, entry.used_at = pair, None, now
        self._index(session, entry)

    def release(self, session: str, now: float) -> None:
        """The session's request ended without a whole answer: give back the tip it took (a
        retry joins the session again)."""
        entry = self._find(session)
        if entry is None or entry.tip is not None or entry.claimed is None:
            return
        self._unindex(session, entry)
        entry.tip, entry.claimed, entry.used_at = entry.claimed, None, now
        self._index(session, entry)

    def forget(self, session: str) -> None:
        """The session ended: forget it."""
        tenant = self._tenant_of.pop(session, None)
        entry = self._lru.pop(tenant, session)
        if entry is not None:
            self._unindex(session, entry)

    def _take(self, tenant: str | None, session: str, now: float) -> str:
        entry = self._lru.get(tenant, session)
        assert entry is not None, "an indexed session is in the map"
        self._unindex(session, entry)
        entry.claimed, entry.tip, entry.used_at = entry.tip, None, now
        self._index(session, entry)
        return session

    def _find(self, session: str) -> _Entry | None:
        if session not in self._tenant_of:
            return None
        return self._lru.get(self._tenant_of[session], session)

    def _index(self, session: str, entry: _Entry) -> None:
        if entry.tip is not None:
            for side, h in enumerate(entry.tip):
                self._idle[side].setdefault(h, deque()).append(session)
        if entry.claimed is not None:
            for side, h in enumerate(entry.claimed):
                self._running[side].setdefault(h, set()).add(session)

    def _unindex(self, session: str, entry: _Entry) -> None:
        if entry.tip is not None:
            for side, h in enumerate(entry.tip):
                queue = self._idle[side].get(h)
                if queue is not None:
                    with contextlib.suppress(ValueError):
                        queue.remove(session)
                    if not queue:
                        del self._idle[side][h]
        if entry.claimed is not None:
            for side, h in enumerate(entry.claimed):
                busy = self._running[side].get(h)
                if busy is not None:
                    busy.discard(session)
                    if not busy:
                        del self._running[side][h]

    def _dropped(self, tenant: str | None, session: str, entry: _Entry) -> None:
        """The bounds dropped ``session``: out of the indexes too."""
        self._tenant_of.pop(session, None)
        self._unindex(session, entry)

    def _expire(self, tenant: str | None, now: float) -> None:
        cutoff = now - self.ttl_s
        while True:
            oldest = self._lru.oldest(tenant)
            if oldest is None or oldest[1].used_at > cutoff:
                return
            self._lru.drop_oldest(tenant)
