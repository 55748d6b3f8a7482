"""Deterministic token ids for simulated sessions.

Every session's context is a sequence of token ids whose first ``shared_prefix`` ids are the
family's system prompt (identical across sessions of one family, so the engine's prefix cache
shares them, as vLLM does for a common system prompt) and whose remaining ids are unique to the
session. Turn ``j``'s prompt is the first ``prompt_len`` ids; its scripted output is the next
``output`` ids, so the next prompt (prompt + output + observation) extends it exactly.

Ids are plain ints built from ``range`` objects (fast, no randomness needed): the engine only
hashes and compares them.
"""

from __future__ import annotations

import zlib

from shared.core.engine import ROOT_HASH, HashChain, chain_hash

_FAMILY_SPACE = 1 << 24
_SESSION_BASE = 1 << 40
_SESSION_SPACE = 1 << 24


def family_base(family: str) -> int:
    """A stable id offset per family (crc32, so it does not depend on PYTHONHASHSEED)."""
    return (zlib.crc32(family.encode()) & 0xFFFF) * _FAMILY_SPACE


class SessionTokens:
    """Token ids of one session's context; :meth:`take` returns a list slice."""

    __slots__ = ("_cache", "_hashes", "_index", "base", "shared", "shared_base")

    def __init__(self, family: str, shared_prefix: int, index: int) -> None:
        self.shared = shared_prefix
        self.shared_base = family_base(family)
        self.base = _SESSION_BASE + index * _SESSION_SPACE
        self._cache: list[int] = []
        self._hashes = HashChain()
        self._index: dict[int, int] = {}

    def take(self, start: int, stop: int) -> list[int]:
        """Ids at positions ``[start, stop)``."""
        if stop > len(self._cache):
            self._grow(stop)
        return self._cache[start:stop]

    def block_hashes(self, nblocks: int, block_size: int) -> list[int]:
        """The engine's chain hashes (:func:`~shared.core.engine.chain_hash` from ``ROOT_HASH``)
        of the first ``nblocks`` full blocks, extended incrementally; the returned list may be
        longer than ``nblocks`` (one ``block_size`` per session). It is a
        :class:`~shared.core.engine.HashChain`, which the engine walks without converting."""
        hs = self._hashes
        if len(hs) < nblocks:
            if nblocks * block_size > len(self._cache):
                self._grow(nblocks * block_size)
            toks = self._cache
            index = self._index
            parent = hs[-1] if hs else ROOT_HASH
            new: list[int] = []
            for j in range(len(hs), nblocks):
                parent = chain_hash(parent, toks[j * block_size : j * block_size + block_size])
                new.append(parent)
                index.setdefault(parent, j)
            hs.grow(new)
        return hs

    @property
    def index(self) -> dict[int, int]:
        """``{block hash: first position}`` of the hashes :meth:`block_hashes` computed so far
        (read-only use)."""
        return self._index

    def _grow(self, n: int) -> None:
        have = len(self._cache)
        s = self.shared
        if have < s:
            end = min(n, s)
            self._cache.extend(range(self.shared_base + have, self.shared_base + end))
            have = end
        if n > have:
            self._cache.extend(range(self.base + have, self.base + n))
