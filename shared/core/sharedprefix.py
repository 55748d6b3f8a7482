"""Shared prefixes, live: which leading blocks of a session's context other live sessions have too.

A harness sends the same system prompt and tool schemas at the start of every session's
context; a node holds those blocks once for all its sessions, so they are left out of each
session's weight (:attr:`shared.core.session.Session.shared`, paper App. B.1). The simulator
knows each workload's shared prefix; live, :class:`SharedPrefixes` learns it from the block keys
the gateway computes over each response's prompt token ids
(:func:`shared.core.blockkeys.chain_keys`, ``SessionResponse.block_keys``)::

    shared(session) = (leading keys of its chain that another live session also has) × block size

Keys are a hash chain, so two chains share a key at position ``j`` exactly when their first
``j + 1`` blocks are the same tokens: a common system prompt, or a fork (a sub-agent or a retry
that starts from another session's conversation) sharing everything up to the fork.

Bounds. Only the first ``max_tokens`` tokens of each chain are kept (a system prompt and tool
schemas are far shorter than 64k tokens); at most ``max_sessions`` sessions and ``max_keys`` keys
in all, the least recently observed session dropped first. Each kept key costs about 100 bytes
(a dict slot and its int), so the default bound of 2**20 keys is about 100 MB at worst; the
shared blocks themselves are counted once whatever the number of sessions that hold them. Keys
are counted per *scope*, the request's model and the block size: a prefix shared with a session
of another model (a LoRA adapter, a second model of the same tokenizer) is not shared on a node.

Exactness. Each key counts the sessions that hold it; a count of one remembers its holder, so
when a second session brings the key the first one is reported too (:meth:`take_touched`): its
``shared`` grew and its weight should follow. A count that falls back to one (a session ended,
was evicted, or moved on to another prefix) forgets who is left, and the remaining session is
not reported: its ``shared`` is corrected by its own next response. Until then it is too large,
which costs nothing on its node: the node holds that prefix once
(:attr:`shared.core.valuation.NodeView.shared`), and its weight plus the node's shared still
sum to its context.

Where it lives: in the tools service, the one that calls the session transitions and writes the
weights (``services/tools/handlers.py``). Every tools shard consumes every session event (it
applies only its own sessions', :mod:`shared.infra.shard`), so every shard feeds its registry
the same responses in the same order and holds the same counts: the shard that owns a session
computes its ``shared`` from all sessions, not from its share of them, and writes it with the
response in the same transaction, where the weight is computed. The gateway computes the keys
but each gateway replica sees only the requests routed to it (two replicas would disagree); the
telemetry service sees every response too but may not write session records. A restarted tools
process registers the chains the telemetry service stored (``Store.chains``) before it consumes.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from shared.core.blockkeys import common_prefix
from shared.core.session import Session
from shared.core.valuation import session_weight

__all__ = [
    "DEFAULT_MAX_KEYS",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_TOKENS",
    "Scope",
    "SharedPrefixes",
    "with_shared",
]

DEFAULT_MAX_TOKENS: Final = 65_536
"""Tokens kept of each chain (its first blocks): the longest prefix that can count as shared."""
DEFAULT_MAX_SESSIONS: Final = 16_384
"""Sessions kept, the least recently observed dropped first."""
DEFAULT_MAX_KEYS: Final = 1 << 20
"""Keys kept over all sessions (the memory bound), the least recently observed session's first."""

Scope = tuple[str | None, int]
"""``(model, block size)``: keys count together only within one scope."""


@dataclass(slots=True)
class _Entry:
    scope: Scope
    keys: array[int]  # 'Q': the chain's first keys
    stamp: float


class SharedPrefixes:
    """The shared-prefix registry (module docstring): per scope, how many live sessions hold
    each leading block key; bounded by ``max_tokens`` per chain, ``max_sessions`` and
    ``max_keys`` (LRU)."""

    def __init__(
        self,
        *,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        max_keys: int = DEFAULT_MAX_KEYS,
    ) -> None:
        for name, value in (
            ("max_tokens", max_tokens),
            ("max_sessions", max_sessions),
            ("max_keys", max_keys),
        ):
            if value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        self.max_tokens = max_tokens
        self.max_sessions = max_sessions
        self.max_keys = max_keys
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()
        # per scope: key -> its holders' count, or the holder's id while it has only one
        self._counts: dict[Scope, dict[int, str | int]] = {}
        self._nkeys = 0
        self._touched: set[str] = set()
        self._ended: OrderedDict[str, float] = OrderedDict()
        """Sessions forgotten at their end, with when (at most ``max_sessions``): a response
        that finished by then (late or redelivered) is not registered again."""
        self.evicted = 0
        """Sessions dropped by the bounds so far."""

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session: object) -> bool:
        return session in self._sessions

    @property
    def keys(self) -> int:
        """Keys kept over all sessions (what ``max_keys`` bounds)."""
        return self._nkeys

    def observe(
        self,
        session: str,
        keys: Sequence[int],
        block_size: int,
        model: str | None = None,
        stamp: float = 0.0,
    ) -> int:
        """Register ``session``'s latest chain (the block keys of a response's prompt, from a
        response finished at ``stamp``) in the scope ``(model, block_size)``, replacing its
        previous one; returns its :meth:`shared` tokens. A chain older than the one held (a
        redelivered response), or one finished by its session's recorded end, changes nothing.
        Sessions whose ``shared`` this may have raised
        are kept for :meth:`take_touched`. :class:`ValueError` for a block size below 1 or a
        key outside 0..2**64-1."""
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        ended = self._ended.get(session)
        if ended is not None:
            if stamp <= ended:  # a response of the session that ended: nothing to keep
                return 0
            del self._ended[session]  # the id was used again
        old = self._sessions.get(session)
        if old is not None and stamp < old.stamp:
            return self.shared(session)
        limit = min(self.max_tokens // block_size, self.max_keys)
        try:
            new = array("Q", keys[:limit])
        except (OverflowError, TypeError):
            raise ValueError("block keys: must be integers in 0..2**64-1") from None
        scope: Scope = (model, block_size)
        if old is not None and old.scope == scope:
            counts = self._counts.setdefault(scope, {})  # (dropped while it held no key)
            common = common_prefix(old.keys, new)
            if common < len(old.keys):
                self._remove(counts, old.keys[common:])
            self._add(session, counts, new[common:])
            self._nkeys += len(new) - len(old.keys)
            self._sessions.move_to_end(session)
        else:
            if old is not None:  # another model or block size: a chain of its own
                del self._sessions[session]
                self._uncount(old)
            self._add(session, self._counts.setdefault(scope, {}), new)
            self._nkeys += len(new)
        self._sessions[session] = _Entry(scope, new, stamp)
        self._evict()
        return self.shared(session)

    def forget(self, session: str, at: float | None = None) -> bool:
        """Drop ``session`` (it ended, at ``at`` when given: responses that finished by then
        are not registered again); whether it was held."""
        if at is not None:
            self._ended[session] = at
            self._ended.move_to_end(session)
            while len(self._ended) > self.max_sessions:
                self._ended.popitem(last=False)
        entry = self._sessions.pop(session, None)
        self._touched.discard(session)
        if entry is None:
            return False
        self._uncount(entry)
        return True

    def shared(self, session: str) -> int:
        """Tokens of ``session``'s leading blocks that another session held now also has
        (0 for a session not held)."""
        entry = self._sessions.get(session)
        if entry is None:
            return 0
        counts = self._counts.get(entry.scope, {})
        n = 0
        for key in entry.keys:
            held = counts.get(key)
            if not isinstance(held, int) or held < 2:
                break
            n += 1
        return n * entry.scope[1]

    def take_touched(self) -> set[str]:
        """The sessions (other than the one observed) whose :meth:`shared` an observation since
        the last call may have raised, and that are still held."""
        touched, self._touched = self._touched, set()
        return {sid for sid in touched if sid in self._sessions}

    # --- internals ----------------------------------------------------------------------------

    def _add(self, session: str, counts: dict[int, str | int], keys: array[int]) -> None:
        touched = self._touched
        for key in keys:
            held = counts.get(key)
            if held is None:
                counts[key] = session
            elif isinstance(held, str):
                counts[key] = 2
                if held != session:
                    touched.add(held)  # its only holder now shares it
            else:
                counts[key] = held + 1

    @staticmethod
    def _remove(counts: dict[int, str | int], keys: array[int]) -> None:
        for key in keys:
            held = counts[key]
            if isinstance(held, str) or held <= 1:
                del counts[key]
            else:
                counts[key] = held - 1  # 2 -> 1: who is left is not known

    def _uncount(self, entry: _Entry) -> None:
        counts = self._counts.get(entry.scope)
        if counts is not None:  # (none when no session of the scope holds a key)
            self._remove(counts, entry.keys)
            if not counts:
                del self._counts[entry.scope]
        self._nkeys -= len(entry.keys)

    def _evict(self) -> None:
        sessions = self._sessions
        while len(sessions) > 1 and (
            len(sessions) > self.max_sessions or self._nkeys > self.max_keys
        ):
            sid, entry = sessions.popitem(last=False)
            self._touched.discard(sid)
            self._uncount(entry)
            self.evicted += 1


def with_shared(s: Session, shared: int, *, reweigh: bool = True) -> Session:
    """``s`` with its shared prefix learned to be ``shared`` tokens (after its response was
    written: another session brought the same prefix). With ``reweigh`` an admitted session's
    weight moves by the change of its unshared part, ``max(tokens − shared, 0)``, keeping the
    reserve it was given (``weight − (tokens − shared)``: the fixed one or the growth rule's).
    One version later (the valuation's reader and the apply check see it), ``updated_at``
    kept (learning it is not activity: the idle rule reads ``updated_at``). ``s`` itself when
    nothing changes."""
    shared = max(0, shared)
    if shared == s.shared:
        return s
    weight = s.weight
    if reweigh and s.node is not None:
        moved = session_weight(s.tokens, shared, 0) - session_weight(s.tokens, s.shared, 0)
        weight = max(weight + moved, 0)
    return msgspec.structs.replace(s, shared=shared, weight=weight, version=s.version + 1)
