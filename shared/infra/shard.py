"""Partitioning a service across processes by key: shard ``index`` of ``count`` owns a key when
``crc32(key) mod count == index`` (``TAO_SHARD=i/N``).

The tools service shards by session id: every replica gets every event (durable consumers of
its own, ``tools-<i>of<N>-<stream>``), decodes it and keeps those of its sessions, so one session's
events are applied by one process in stream order while the store writes (the costly part)
are split N ways. The telemetry service shards by node id: a shard scrapes its nodes, follows
their KV-event feeds and keeps their block index (docs/scale-out.md). CRC-32 is stable across
processes and Python runs (``hash()`` is salted).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Final

__all__ = ["ONE", "Shard", "parse_shard"]

_RE: Final = re.compile(r"(\d{1,4})/(\d{1,4})")


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard ``index`` of ``count`` (0 ≤ index < count)."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"need 0 <= INDEX < COUNT, got {self.index}/{self.count}")

    def owns(self, key: str) -> bool:
        """Whether ``key`` (a session id, a node id) belongs to this shard."""
        return self.count == 1 or zlib.crc32(key.encode()) % self.count == self.index

    def member(self, service: str) -> str:
        """The name this shard consumes under (its durables are ``<member>-<stream>``): the
        service's own when unsharded, so an existing deployment resumes where it was."""
        return service if self.count == 1 else f"{service}-{self.index}of{self.count}"


ONE: Final = Shard()
"""The whole key space (no sharding)."""


def parse_shard(raw: str) -> Shard:
    """``"i/N"`` → Shard(i, N); ValueError saying what is wrong otherwise."""
    m = _RE.fullmatch(raw.strip())
    if m is None:
        raise ValueError(f"must be INDEX/COUNT such as 0/2, got {raw!r}")
    return Shard(int(m.group(1)), int(m.group(2)))
