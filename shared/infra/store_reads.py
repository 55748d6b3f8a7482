"""Fast read paths for the valuation service (the tick's sessions + residency; the idle sweep).

:class:`SessionReader` reads the sessions of an index set (``pool`` / ``admitted_tool``) and
their residency. On the Redis :class:`~shared.infra.store.Store` that is one ``SMEMBERS`` and
one ``EVALSHA`` of ``lua/read_sessions.lua`` per :data:`CHUNK` sessions (instead of two
pipelines of one ``HGETALL`` per key: redis-py's per-command work and the per-field decode,
not Redis, were most of a tick). The reader keeps the records it decoded, per index set, with
the ``v`` and ``updated_at`` text they were read at, and passes those to the script: a session
whose version and ``updated_at`` are unchanged comes back as ``{v, updated_at, probe}`` only
and is not decoded again (every transition bumps the version and touches ``updated_at``; the
one write that does neither, a probe mark, is read every time and patched in). Each index
set's cache keeps only the sessions of its latest read, so it is bounded by the set's size.
The script gets one key and three arguments whatever the number of sessions: the cached
tokens in one argument, each key built in Lua from its prefix and the escaped id (as
``read_index.lua`` does), because redis-py's per-argument encoding was most of a large read
(two arguments per session took half of a periodic tick's 1,000-session read).
:meth:`SessionReader.tick_read`, the valuation tick's read, does the same for a whole index
set and every node in one call of ``lua/read_index.lua`` (the set's members read in Redis).

:func:`idle_candidates` reads only ``node``, ``activity``, ``ended`` and ``updated_at`` of
every stored session (the store's ``lua/batch_read.lua``, no JSON decode) and returns the ids
the idle rule may end; the caller re-checks each on the full record in its consistent update.

On any other :class:`~shared.infra.store_types.StateStore` (the in-memory ``FakeStore``) the
same functions use the protocol's ``sessions`` / ``residency`` reads, with the same results.

To merge into :class:`Store` later: ``SessionReader`` needs the store's Redis client (read
here as ``store._r``) and key builder; its script is loaded with :func:`store.load_script`, and
:func:`idle_candidates` runs the store's own ``batch_read`` script.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from shared.core.session import Session
from shared.core.valuation import NodeView
from shared.infra.store import Store, load_script
from shared.infra.store_codec import decode_node, decode_session_values, parse_residency
from shared.infra.store_ops import texts
from shared.infra.store_types import NodeRecord, StateStore, StoreError

__all__ = [
    "CHUNK",
    "IDLE_FIELDS",
    "Index",
    "SessionReader",
    "idle_candidates",
    "is_idle",
]

CHUNK: Final = 1000
"""Sessions per script call: bounds how long one call holds Redis (it runs scripts serially)."""
IDLE_FIELDS: Final = ("node", "activity", "ended", "updated_at")

Index = Literal["pool", "admitted_tool"]
ResidencyMap = dict[str, dict[str, tuple[int, float]]]

_READ: Final = load_script("read_sessions")
_READ_INDEX: Final = load_script("read_index")


def _text(x: Any) -> str:
    """A reply value as text (None -> "")."""
    if x is None:
        return ""
    return x.decode() if isinstance(x, bytes) else str(x)


def _records(flat_nodes: Sequence[Any]) -> list[NodeRecord]:
    """read_index.lua's node replies (id, flat HGETALL, ...) as records, by id."""
    recs: list[NodeRecord] = []
    pairs = sorted((_text(flat_nodes[j]), flat_nodes[j + 1]) for j in range(0, len(flat_nodes), 2))
    for node, flat in pairs:
        rec = decode_node(node, dict(zip(flat[::2], flat[1::2], strict=True)))
        if rec is not None:
            recs.append(rec)
    return recs


def _opt_float(text: str) -> float | None:
    return None if text == "" else float(text)


def _residency(flat: Sequence[Any]) -> tuple[dict[str, tuple[int, float]], dict[str, int]]:
    """A flat HGETALL reply (node, "k0 t_obs[ host]", ...) as ``node -> (k0, t_obs)`` (the GPU
    residency) and ``node -> host`` (host KV tier tokens), each without its zero entries."""
    out: dict[str, tuple[int, float]] = {}
    host: dict[str, int] = {}
    for j in range(0, len(flat), 2):
        k0, t_obs, h = parse_residency(_text(flat[j + 1]))
        node = _text(flat[j])
        if k0 > 0:
            out[node] = (k0, t_obs)
        if h > 0:
            host[node] = h
    return out, host


def is_idle(
    node: str | None, activity: str, ended: bool, updated_at: float, now: float, timeout_s: float
) -> bool:
    """The idle rule: not ended, idle or in a tool, untouched for longer than ``timeout_s``,
    admitted or not. A harness that died after an answer leaves its session ``idle``; one that
    died during or after a tool call (whose next request never came) leaves it in ``tool``,
    which no later event changes: both are abandoned, their reservations held and their
    records kept for ever unless collected. A tool that reports nothing (no ``ToolProgress``)
    for longer than the timeout counts as abandoned too: set ``TAO_IDLE_TIMEOUT_S`` above the
    longest silent tool (its next request then starts a new record, without its cache
    credit). ``waiting`` and ``running`` sessions are the gateway's to end (hold timeout,
    client gone)."""
    del node  # admitted or not: a pooled record is abandoned the same way
    return not ended and activity in ("idle", "tool") and now - updated_at > timeout_s


HostMap = dict[str, dict[str, int]]
_Parsed = tuple[tuple[Any, ...], dict[str, tuple[int, float]], dict[str, int]]


def _reparsed(flat: Sequence[Any], seen: _Parsed | None) -> _Parsed:
    """A residency reply with its :func:`_residency` parse, the one ``seen`` holds when the
    reply is the same (a pooled session's residency rarely moves between ticks)."""
    key = tuple(flat)
    if seen is not None and seen[0] == key:
        return seen
    return (key, *_residency(flat))


@dataclass(slots=True)
class _Held:
    """A decoded record and the hash text it was read at."""

    v: str
    updated_at: str
    probe: str
    session: Session


class SessionReader:
    """Reads index sets' sessions and residency, keeping decoded records between reads."""

    def __init__(self, store: StateStore, chunk: int = CHUNK) -> None:
        if chunk < 1:
            raise ValueError(f"chunk: must be >= 1, got {chunk}")
        self.store = store
        self.chunk = chunk
        self.decoded = 0
        """Records decoded from JSON so far (the rest were reused from the cache)."""
        self.reused = 0
        self._held: dict[str, dict[str, _Held]] = {}
        self._names: dict[str, dict[str, str]] = {}  # escaped key names, per cache too
        self._redis: Store | None = store if isinstance(store, Store) else None
        if self._redis is not None:
            self._read = self._redis._r.register_script(_READ)
            self._read_index = self._redis._r.register_script(_READ_INDEX)
        self._res: dict[str, dict[str, _Parsed]] = {}
        """Per cache, each session's last residency reply and its parse (reused while equal)."""
        self._hosts: dict[str, HostMap] = {}
        """Per cache, the host-tier residency of the sessions its last read saw (:meth:`host`)."""
        self._whole: set[str] = set()
        """The index sets read whole at least once: a named read reuses the rest of them."""
        self.evidence: dict[str, tuple[float, float]] = {}
        """The KV-event evidence ``(kv_since, kv_until)`` of the nodes of the last
        :meth:`tick_read` that have it (:attr:`NodeRecord.evidence`)."""

    def _views(self, recs: Sequence[NodeRecord]) -> list[NodeView]:
        """``recs`` as views; their evidence kept in :attr:`evidence`."""
        self.evidence = {r.id: ev for r in recs if (ev := r.evidence) is not None}
        return [r.view() for r in recs]

    async def index(self, which: Index) -> tuple[list[Session], ResidencyMap]:
        """The sessions of index set ``which`` (sorted by id, absent ones skipped) and the
        residency of each id read."""
        ids = await (self.store.pool_ids() if which == "pool" else self.store.admitted_tool_ids())
        return await self.read(sorted(ids), which)

    async def tick_read(
        self, which: Index, named: Collection[str] | None = None
    ) -> tuple[list[Session], ResidencyMap, list[NodeView]]:
        """:meth:`index` and the store's ``node_views()`` as of one instant: on Redis one
        ``EVALSHA`` of ``lua/read_index.lua`` (the set's members, their records as
        :meth:`read` gets them, their residency and every node hash), whatever the set's size
        up to :attr:`chunk` members; a larger set is read as :meth:`index` does. The nodes'
        KV-event evidence is left in :attr:`evidence`.

        ``named`` (a wake-up tick's read): only these sessions are read, with whether each is
        still a member, and every node; the rest of the set is what the last read held (its
        records and residency as they were then). Without an earlier read of ``which``, or
        with more than :attr:`chunk` names, the whole set is read."""
        if named is not None and which in self._whole and len(named) <= self.chunk:
            if self._redis is None:
                return await self._named_apart(which, named)
            return await self._named(which, named)
        self._whole.add(which)
        if self._redis is None or len(self._held.get(which, {})) > self.chunk:
            return await self._tick_read_apart(which)  # past a chunk: one call holds Redis long
        keys = self._redis.keys
        old = self._held.get(which, {})
        names = self._names.get(which, {})
        cut = len(keys.session_prefix)  # what is left of a session key is the token
        lines = [f"{names[sid][cut:]} {h.v} {h.updated_at}\n" for sid, h in old.items()]
        members, flat_nodes = await self._read_index(
            keys=[self._index_key(which)], args=[*self._prefixes(), "".join(lines), keys.nodes]
        )
        if len(members) // 3 > self.chunk:  # it grew past a chunk meanwhile: read it in chunks
            return await self._tick_read_apart(which)
        new: dict[str, _Held] = {}
        fresh: dict[str, str] = {}
        seen, parsed = self._res.get(which, {}), {}
        for sid, raw, res in self._replies(members):
            fresh[sid] = names.get(sid) or keys.session(sid)
            parsed[sid] = _reparsed(res, seen.get(sid))
            held = self._one(sid, raw, old.get(sid))
            if held is not None:
                new[sid] = held
        self._held[which] = new
        self._names[which] = fresh
        self._res[which] = parsed
        self._note_hosts(which)
        return self._held_out(which, self._views(_records(flat_nodes)))

    def host(self, cache: str) -> HostMap:
        """The host KV tier residency (session -> node -> tokens of its context from its
        start; sessions and nodes with none left out) of the sessions the last read of ``cache`` (an
        index set, or :meth:`read`'s cache name) returned with their residency."""
        return self._hosts.get(cache, {})

    def _note_hosts(self, which: str) -> None:
        self._hosts[which] = {sid: p[2] for sid, p in self._res[which].items() if p[2]}

    def note_probe_marks(self, which: Index, marks: Mapping[str, float | None]) -> None:
        """The reader's own probe-mark writes, patched into what it holds of ``which`` (a
        named read reuses those records without reading their marks again)."""
        held = self._held.get(which)
        if not held:
            return
        for sid, mark in marks.items():
            h = held.get(sid)
            if h is not None:
                text = "" if mark is None else repr(float(mark))
                s = msgspec.structs.replace(h.session, probe_mark=mark)
                held[sid] = _Held(h.v, h.updated_at, text, s)

    def _index_key(self, which: Index) -> str:
        assert self._redis is not None
        keys = self._redis.keys
        return keys.pool if which == "pool" else keys.admitted_tool

    def _prefixes(self) -> list[str]:
        """read_index.lua's ARGV[1..3]: the session, residency and node key prefixes."""
        assert self._redis is not None
        keys = self._redis.keys
        return [keys.session_prefix, keys.residency_prefix, keys.node_prefix]

    @staticmethod
    def _replies(members: Sequence[Any]) -> list[tuple[str, Any, Any]]:
        """read_index.lua's session replies as (id, record reply, residency reply), by id."""
        return sorted(
            (_text(members[j]), members[j + 1], members[j + 2]) for j in range(0, len(members), 3)
        )

    def _held_out(
        self, which: Index, views: list[NodeView]
    ) -> tuple[list[Session], ResidencyMap, list[NodeView]]:
        """What the cache of ``which`` holds: its sessions by id, the residency of every id the
        last reads saw (absent ones included, as a whole read reports them) and ``views``."""
        held = self._held[which]
        out = [held[sid].session for sid in sorted(held)]
        return out, {sid: p[1] for sid, p in self._res[which].items()}, views

    async def _named(
        self, which: Index, named: Collection[str]
    ) -> tuple[list[Session], ResidencyMap, list[NodeView]]:
        """A named read on Redis: one ``read_index.lua`` call over ``named`` and every node."""
        assert self._redis is not None
        keys = self._redis.keys
        ids = sorted(set(named))
        held, names = self._held.setdefault(which, {}), self._names.setdefault(which, {})
        seen = self._res.setdefault(which, {})
        cut = len(keys.session_prefix)
        tokens = {sid: names.get(sid) or keys.session(sid) for sid in ids}
        lines = [
            f"{tokens[sid][cut:]} {h.v} {h.updated_at}\n"
            for sid in ids
            if (h := held.get(sid)) is not None
        ]
        members, flat_nodes = await self._read_index(
            keys=[self._index_key(which)],
            args=[*self._prefixes(), "".join(lines), keys.nodes, "named", *ids],
        )
        for sid, raw, res in self._replies(members):
            got = self._one(sid, raw, held.get(sid))
            if got is None:  # left the set, or its record is gone
                held.pop(sid, None)
                names.pop(sid, None)
                seen.pop(sid, None)
                continue
            held[sid] = got
            names[sid] = tokens[sid]
            seen[sid] = _reparsed(res, seen.get(sid))
        self._note_hosts(which)
        return self._held_out(which, self._views(_records(flat_nodes)))

    async def _named_apart(
        self, which: Index, named: Collection[str]
    ) -> tuple[list[Session], ResidencyMap, list[NodeView]]:
        """A named read on any other store: the set's membership, the named records and their
        residency, and the node views (several reads; the in-memory store is one process)."""
        members = await (
            self.store.pool_ids() if which == "pool" else self.store.admitted_tool_ids()
        )
        ids = sorted(sid for sid in set(named) if sid in members)
        gone = set(named) - set(ids)
        sessions = {s.id: s for s in await self.store.sessions(ids)} if ids else {}
        residency = await self.store.residency(ids) if ids else {}
        host = await self.store.host_residency(ids) if ids else {}
        self.decoded += len(sessions)
        held = self._held.setdefault(which, {})
        seen = self._res.setdefault(which, {})
        for sid in gone | (set(ids) - set(sessions)):
            held.pop(sid, None)
            seen.pop(sid, None)
        for sid, s in sessions.items():
            held[sid] = _Held("", "", "", s)
            seen[sid] = ((), residency.get(sid, {}), host.get(sid, {}))
        self._note_hosts(which)
        return self._held_out(which, self._views(await self.store.nodes()))

    async def read(
        self, ids: Sequence[str], cache: str, *, residency: bool = True
    ) -> tuple[list[Session], ResidencyMap]:
        """The sessions ``ids`` (in order; absent ones skipped) and their residency (none with
        ``residency=False``: the map is empty); the reader's cache named ``cache`` is replaced
        by what this read saw."""
        if self._redis is None:
            sessions = await self.store.sessions(ids) if ids else []
            self.decoded += len(sessions)
            if not (ids and residency):
                return sessions, {}
            self._hosts[cache] = await self.store.host_residency(ids)
            return sessions, await self.store.residency(ids)
        old = self._held.get(cache, {})
        new: dict[str, _Held] = {}
        out: list[Session] = []
        found: ResidencyMap = {}
        hosts: HostMap = {}
        keys = self._redis.keys
        cut = len(keys.session_prefix)  # what is left of a session key is the token
        head = [keys.session_prefix, keys.residency_prefix if residency else ""]
        names = self._names.get(cache, {})
        fresh: dict[str, str] = {}
        for lo in range(0, len(ids), self.chunk):
            part = ids[lo : lo + self.chunk]
            lines: list[str] = []
            for sid in part:
                key = names.get(sid) or keys.session(sid)
                fresh[sid] = key
                h = old.get(sid)
                lines.append(
                    f"{key[cut:]} -\n" if h is None else f"{key[cut:]} {h.v} {h.updated_at}\n"
                )
            reply = await self._read(keys=[fresh[part[0]]], args=[*head, "".join(lines)])
            for j, sid in enumerate(part):
                held = self._one(sid, reply[2 * j], old.get(sid))
                if residency:
                    found[sid], host = _residency(reply[2 * j + 1])
                    if host:
                        hosts[sid] = host
                if held is not None:
                    new[sid] = held
                    out.append(held.session)
        self._held[cache] = new
        self._names[cache] = fresh
        if residency:
            self._hosts[cache] = hosts
        return out, found

    async def _tick_read_apart(
        self, which: Index
    ) -> tuple[list[Session], ResidencyMap, list[NodeView]]:
        sessions, residency = await self.index(which)
        if self._redis is None:  # what a later named read reuses (Redis' read() keeps its own)
            self._held[which] = {s.id: _Held("", "", "", s) for s in sessions}
        host = self._hosts.get(which, {})
        self._res[which] = {sid: ((), r, host.get(sid, {})) for sid, r in residency.items()}
        return sessions, residency, self._views(await self.store.nodes())

    def _one(self, sid: str, raw: Sequence[Any], held: _Held | None) -> _Held | None:
        """One session reply of ``read_sessions.lua`` against what the cache holds."""
        if len(raw) == 0:
            return None
        if len(raw) == 3:
            if held is None:  # pragma: no cover - the script only skips what we passed
                raise StoreError(f"session {sid!r}: short reply without a cached record")
            probe = _text(raw[2])
            self.reused += 1
            if probe != held.probe:
                s = msgspec.structs.replace(held.session, probe_mark=_opt_float(probe))
                return _Held(held.v, held.updated_at, probe, s)
            return held
        values = texts(raw)
        if values is None:  # no ``data``: no record
            return None
        self.decoded += 1
        s = decode_session_values(values)
        return _Held(values[0], values[6], values[5], s)


async def idle_candidates(
    store: StateStore, now: float, timeout_s: float, chunk: int = CHUNK
) -> list[str]:
    """Ids of the stored sessions the idle rule (:func:`is_idle`) selects at ``now``, sorted.

    On Redis only the four fields the rule reads are fetched; a session that changes after
    the read is re-checked by the caller's update."""
    if not isinstance(store, Store):
        return [
            s.id
            for s in await store.sessions(None)
            if is_idle(s.node, s.activity, s.ended, s.updated_at, now, timeout_s)
        ]
    ids = sorted(await store.session_ids())
    out: list[str] = []
    for lo in range(0, len(ids), chunk):
        part = ids[lo : lo + chunk]
        keys = [store.keys.session(sid) for sid in part]
        reply = await store._batch_read(keys=keys, args=IDLE_FIELDS)
        for sid, raw in zip(part, reply, strict=True):
            node, activity, ended, updated_at = (_text(x) for x in raw)
            if updated_at == "":  # absent (deleted meanwhile)
                continue
            try:
                at = float(updated_at)
            except ValueError as exc:
                raise StoreError(f"corrupt session record {sid!r}: {exc}") from None
            if is_idle(node or None, activity, ended == "1", at, now, timeout_s):
                out.append(sid)
    return out
