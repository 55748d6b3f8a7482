"""The scheduler's shared state in Redis: sessions, nodes, residency, tool statistics, counters.

:class:`Store` implements :class:`~shared.infra.store_types.StateStore` on ``redis.asyncio``.
Key layout and hash fields: :mod:`shared.infra.keys`; encodings: :mod:`shared.infra.store_codec`.

Concurrency. Several service replicas write the same records, so every read-modify-write is
atomic:

* :meth:`Store.update_session` is optimistic: ``WATCH`` the session hash, read it, call the
  caller's *pure* transition, and ``MULTI``/``EXEC`` the new record together with the index sets
  and the nodes' ``reserved`` totals; if anything touched the hash meanwhile (another update,
  the apply script, a probe mark) ``EXEC`` fails and the loop runs again on the fresh record.
* :meth:`Store.apply` is one Lua script (``lua/apply.lua``) that does exactly what
  :func:`shared.core.tick.apply_decision` does on the live records and live free capacity;
  Redis runs scripts one at a time, so concurrent appliers can never over-commit a node.
* :meth:`Store.update_sessions` / :meth:`Store.update_sessions_with` are the same for a batch
  (the tools service's one-write-per-bus-fetch path), checked in the write script instead of
  a ``WATCH``: read every touched hash with one read-only script (``lua/batch_read.lua``:
  HMGET of the session fields; with tool samples, pipelined with the tool statistics hash),
  fold the fns in Python (:func:`store_types.fold_updates`: one write per touched session;
  the samples folded into the statistics), and run one write script (``lua/batch_write.lua``,
  its argument one JSON blob built by :mod:`shared.infra.store_ops`) that first checks that
  every hash read still holds the ``v``, ``updated_at`` and ``probe`` that were read (every
  writer bumps ``v`` but the probe mark) and every statistics field its old text, then writes
  the changed fields of every record, index-set moves only where membership changes, the net
  ``reserved`` moves only where node or weight changed, and the new statistics. If anything
  moved it writes nothing and sends back what the moved hashes (and, if a statistics field
  moved, the statistics hash) hold now, and the batch folds again on that. Two round trips
  and two commands per batch, where ``WATCH``, the read, the statistics read and
  ``MULTI``/``EXEC`` took four (redis-py's per-command cost, not the network, is what limits
  a batch of single commands). The scripts never compute: Python decides, Lua copies and
  compares.
* With ``cache_sessions`` (the tools service: ``TAO_SESSION_CACHE``) the store keeps each
  record as its last landed batch write left it (the fields' texts and the record, at most
  that many, the least recently written dropped first) and the statistics hash likewise; a
  batch whose records are all cached skips the read, so it is one round trip. The cache is
  never trusted: the write script checks a cached record exactly as a read one (a batch
  with nothing to write still runs the check), and a record another writer moved (the
  planner's admission, a probe mark, another process) comes back in the script's reply. The
  one write the check cannot see is a record deleted and made again with the same ``v``,
  ``updated_at`` and ``probe``, which the read path risks only between its read and its
  write: only the tools service deletes records, and it drops its cached copy when it does
  (as on every single update and probe mark of its own); a second process deleting the
  session would have to be another tools process of the same shard.
* :meth:`Store.record_tool` / :meth:`Store.record_tools` and :meth:`Store.put_node_status` are
  ``WATCH`` loops too.

Scripts are loaded with ``SCRIPT LOAD`` and run with ``EVALSHA`` (redis-py's
``register_script`` falls back to loading on ``NOSCRIPT``). Every multi-key script touches
only keys of one domain (one hash tag), so it runs on a Redis Cluster as well.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, Final, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, WatchError

from shared.contracts.node import NodeStatus
from shared.core.predictor import History, ToolStats, censor, update
from shared.core.session import Session
from shared.core.tick import Applied, Decision
from shared.core.valuation import NodeView
from shared.infra.keys import GLOBAL_TOOL_FIELD, SOLVE_SAMPLES, Keys, check_node_id, tool_field
from shared.infra.store_codec import (
    SESSION_FIELDS,
    as_str,
    decode_host_residency,
    decode_node,
    decode_residency,
    decode_session,
    decode_session_values,
    decode_toolstats,
    encode_chain,
    encode_node_fields,
    encode_residency,
    encode_session,
    encode_toolstats,
    read_chain,
    str_map,
)
from shared.infra.store_ops import (
    FIRST_SESSION_KEY,
    folded_toolstats,
    index_ops,
    reserve_ops,
    texts,
    write_args,
)
from shared.infra.store_stats import planner_stats_from, status_dict
from shared.infra.store_types import (
    CHAIN_TTL_S,
    ChainsRead,
    Folded,
    NodeRecord,
    NodeUpdate,
    PlannerReady,
    Samples,
    SessionFn,
    SessionFnWith,
    StoreError,
    check_new,
    fold_tools,
    fold_updates,
    merge_node,
    no_value,
    node_status_update,
)

__all__ = ["Store", "load_script"]

Redis = aioredis.Redis
T = TypeVar("T")


def load_script(name: str) -> str:
    """The text of ``shared/infra/lua/<name>.lua`` (package data)."""
    return resources.files("shared.infra").joinpath(f"lua/{name}.lua").read_text("utf-8")


_APPLY: Final = load_script("apply")
_PROBE: Final = load_script("probe")
_FENCE: Final = """
local have = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0')
local want = tonumber(ARGV[1])
if want < have then return 0 end
redis.call('HSET', KEYS[1], 'epoch', want)
return 1
"""
"""Raise the planner epoch (field ``epoch`` of the planner hash) unless it is already higher."""
_BATCH_READ: Final = load_script("batch_read")
_BATCH_WRITE: Final = load_script("batch_write")
_REBUILD_CONTEXTS: Final = load_script("rebuild_contexts")
_CHAIN_PAGE: Final = 256  # chains read per MGET on restore


def _read_back(raw: Any) -> tuple[list[Any] | None, Session | None]:
    """One HMGET reply of :data:`SESSION_FIELDS`: its texts (:func:`texts`) and its record
    (None for both when the hash is absent)."""
    f = texts(raw)
    return f, None if f is None else decode_session_values(f)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A flat ``HGETALL`` reply from a script, ``[field, value, ...]``, as text."""
    it = iter(flat)
    return {as_str(k): as_str(v) for k, v in zip(it, it, strict=True)}


class Store:
    """Redis-backed :class:`~shared.infra.store_types.StateStore` for one scheduling domain."""

    def __init__(self, redis: Redis, domain: str = "default", *, cache_sessions: int = 0) -> None:
        """``cache_sessions``: how many session records the batch writes keep as they wrote
        them (0: none; the tools service's ``TAO_SESSION_CACHE``); see the module's notes."""
        if cache_sessions < 0:
            raise ValueError(f"cache_sessions must be >= 0, got {cache_sessions}")
        self.keys = Keys(domain)
        self.domain = self.keys.domain
        self._r = redis
        self._apply = redis.register_script(_APPLY)
        self._fence = redis.register_script(_FENCE)
        self._rebuild_contexts = redis.register_script(_REBUILD_CONTEXTS)
        self._probe = redis.register_script(_PROBE)
        self._batch_read = redis.register_script(_BATCH_READ)
        self._batch_write = redis.register_script(_BATCH_WRITE)
        self._cache_size = cache_sessions
        self._cache: dict[str, tuple[list[Any], Session]] | None = {} if cache_sessions else None
        self._stats: dict[str, str] | None = None  # the statistics hash as last written

    def _pipe(self, transaction: bool) -> Any:
        """A pipeline (``Any``: redis-py's pipeline methods are only partly annotated)."""
        return self._r.pipeline(transaction=transaction)

    # --- sessions ---------------------------------------------------------------------------

    async def get_session(self, sid: str) -> Session | None:
        return decode_session(await self._r.hgetall(self.keys.session(sid)))

    async def sessions(self, ids: Iterable[str] | None = None) -> list[Session]:
        wanted = sorted(await self.session_ids()) if ids is None else list(ids)
        if not wanted:
            return []
        async with self._pipe(False) as pipe:
            for sid in wanted:
                pipe.hgetall(self.keys.session(sid))
            raws = await pipe.execute()
        return [s for s in map(decode_session, raws) if s is not None]

    async def _members(self, key: str) -> set[str]:
        return {as_str(m) for m in await self._r.smembers(key)}

    async def session_ids(self) -> set[str]:
        return await self._members(self.keys.sessions)

    async def pool_ids(self) -> set[str]:
        return await self._members(self.keys.pool)

    async def admitted_tool_ids(self) -> set[str]:
        return await self._members(self.keys.admitted_tool)

    async def update_session(self, sid: str, fn: SessionFn) -> Session | None:
        """Read, transform with the pure ``fn``, write back unless the record moved meanwhile
        (then retry on the fresh record). ``fn`` returning None or an equal record writes
        nothing. Index sets and ``reserved`` totals change in the same transaction."""
        stored, _ = await self.update_session_with(sid, no_value(fn))
        return stored

    async def update_session_with(
        self, sid: str, fn: Callable[[Session | None], tuple[Session | None, T]]
    ) -> tuple[Session | None, T]:
        """:meth:`update_session` for transitions that also return a value (``on_tool_end``'s
        duration, ``on_request``'s ended call): returns the stored record and the value of the
        call whose write won."""
        key = self.keys.session(sid)
        self._forget([sid])
        async with self._pipe(True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    old = decode_session(await pipe.hgetall(key))
                    new, extra = fn(old)
                    if new is None or new == old:
                        await pipe.unwatch()
                        return old, extra
                    check_new(sid, new)
                    fields = encode_session(new)
                    if old is not None:
                        prev = encode_session(old)
                        fields = {k: v for k, v in fields.items() if prev[k] != v}
                    pipe.multi()
                    pipe.hset(key, mapping=fields)
                    if old is None:
                        pipe.sadd(self.keys.sessions, sid)
                    index_ops(pipe, self.keys, sid, old, new)
                    reserve_ops(pipe, self.keys, old, new)
                    await pipe.execute()
                    return new, extra
                except WatchError:
                    continue

    async def update_sessions(
        self, updates: Sequence[tuple[str, SessionFn]], *, record: Samples | None = None
    ) -> list[Session | None]:
        """:meth:`update_session` for a batch, atomically: the fns run in order (several may
        name one id; each sees the record the previous one left), everything is written in one
        transaction, and the result is the stored record after each update, in input order.
        A fn or a result that raises refuses the whole batch (nothing is written).

        ``record`` (called after the fns of the run whose write wins) gives the tool samples
        ``(tool, duration, censored)`` to add in the *same* transaction: a crash can never
        leave a call marked ended whose duration was not recorded (a redelivered end finds
        the call ended and records nothing twice)."""
        pairs = [(sid, no_value(fn)) for sid, fn in updates]
        return [stored for stored, _ in await self.update_sessions_with(pairs, record=record)]

    async def update_sessions_with(
        self, updates: Sequence[tuple[str, SessionFnWith[T]]], *, record: Samples | None = None
    ) -> list[tuple[Session | None, T]]:
        """:meth:`update_session_with` for a batch (as :meth:`update_sessions`): returns
        ``(stored record, value)`` per update, the values from the run whose write won."""
        if not updates:
            return []
        keys = {sid: self.keys.session(sid) for sid, _ in updates}
        olds, stored, stored_stats = await self._before_write(keys, record is not None)
        checked = self._cache is None  # else some records may be the cache's, not yet checked
        while True:
            results, folded = fold_updates(updates, stored, encode_session)
            samples = [] if record is None else list(record())
            stats = folded_toolstats(samples, stored_stats)
            if not folded.writes and not stats and checked:
                return results
            numkeys, *args = write_args(self.keys, keys, olds, stored, folded, stats)
            reply = await self._batch_write(keys=args[:numkeys], args=args[numkeys:])
            if reply == 1:
                self._remember(olds, stored, folded, stats, stored_stats, record is not None)
                return results
            # something moved since the read or the cached write: the script sent what the
            # moved hashes (and, if a field moved, the statistics) hold now; fold again
            sids = list(keys)
            for row in reply[0]:
                sid = sids[int(row[0]) - FIRST_SESSION_KEY]
                olds[sid], stored[sid] = _read_back(row[1:])
            if reply[1] is not None:
                stored_stats = _pairs(reply[1])
            checked = True

    async def _before_write(
        self, keys: Mapping[str, str], stats: bool
    ) -> tuple[dict[str, list[Any] | None], dict[str, Session | None], Mapping[str, str]]:
        """Each session's hash fields as text and its record (the cache's where it holds one,
        else read), and with ``stats`` the tool statistics hash (likewise)."""
        olds: dict[str, list[Any] | None] = {}
        stored: dict[str, Session | None] = {}
        cache = self._cache
        missing = list(keys) if cache is None else [sid for sid in keys if sid not in cache]
        if cache is not None:
            for sid in keys.keys() - set(missing):
                olds[sid], stored[sid] = cache.pop(sid)  # re-inserted (most recent) on success
        want_stats = stats and self._stats is None  # (always None without the cache)
        stored_stats: Mapping[str, str] = (self._stats or {}) if stats else {}
        if missing or want_stats:
            raws, read_stats = await self._read_for_write([keys[s] for s in missing], want_stats)
            for sid, raw in zip(missing, raws, strict=True):
                olds[sid], stored[sid] = _read_back(raw)
            if want_stats:
                stored_stats = read_stats
        return olds, stored, stored_stats

    def _remember(
        self,
        olds: Mapping[str, list[Any] | None],
        stored: Mapping[str, Session | None],
        folded: Folded[dict[str, str]],
        stats: Sequence[tuple[str, str | None, str]],
        stored_stats: Mapping[str, str],
        stats_known: bool,
    ) -> None:
        """After a write that landed: every record of the batch as it now is in Redis (the
        written fields are exactly the encoded record's), and with ``stats_known`` (the
        batch read or checked the statistics) the statistics hash."""
        cache = self._cache
        if cache is None:
            return
        for sid, old in olds.items():
            if sid in folded.writes:
                new, fields = folded.writes[sid]
                cache[sid] = (list(fields.values()), new)
            elif old is not None and (record := stored[sid]) is not None:
                cache[sid] = (old, record)
            else:
                cache.pop(sid, None)
        while len(cache) > self._cache_size:
            del cache[next(iter(cache))]  # the least recently written
        if stats_known and (stats or self._stats is None):
            now = dict(stored_stats)
            now.update((f, text) for f, _, text in stats)
            self._stats = now

    def _forget(self, sids: Iterable[str]) -> None:
        """Drop cached records another write of this store moved (only saves the failed
        check: the write script would catch them)."""
        if self._cache is not None:
            for sid in sids:
                self._cache.pop(sid, None)

    async def _read_for_write(
        self, keys: list[str], stats: bool
    ) -> tuple[list[Any], Mapping[str, str]]:
        """The session fields of ``keys`` (``lua/batch_read.lua``) and, with ``stats``, the
        whole tool statistics hash, in one round trip."""
        if not stats:
            return await self._batch_read(keys=keys, args=SESSION_FIELDS), {}
        if not keys:
            return [], str_map(await self._r.hgetall(self.keys.toolstats))
        while True:
            async with self._pipe(False) as pipe:
                pipe.execute_command(
                    "EVALSHA", self._batch_read.sha, len(keys), *keys, *SESSION_FIELDS
                )
                pipe.hgetall(self.keys.toolstats)
                try:
                    raws, stored = await pipe.execute()
                except NoScriptError:  # the server lost its scripts (restart, SCRIPT FLUSH)
                    self._batch_read.sha = await self._r.script_load(_BATCH_READ)
                    continue
            return raws, str_map(stored)

    async def put_probe_marks(
        self, marks: Mapping[str, float | None], versions: Mapping[str, int] | None = None
    ) -> int:
        """Persist probe marks without a version bump; with ``versions`` only where the
        session still has that version. Returns how many were written."""
        if not marks:
            return 0
        self._forget(marks)
        keys: list[str] = []
        args: list[str] = []
        for sid, mark in marks.items():
            keys.append(self.keys.session(sid))
            args.append("" if mark is None else repr(float(mark)))
            v = None if versions is None else versions.get(sid)
            args.append("" if v is None else str(int(v)))
        return int(await self._probe(keys=keys, args=args))

    async def delete_session(self, sid: str) -> bool:
        """Remove the record, its residency, its index entries and its reservation."""
        key, res = self.keys.session(sid), self.keys.residency(sid)
        self._forget([sid])
        async with self._pipe(True) as pipe:
            while True:
                try:
                    await pipe.watch(key, res)
                    old = decode_session(await pipe.hgetall(key))
                    res_nodes = [as_str(n) for n in await pipe.hkeys(res)]
                    pipe.multi()
                    pipe.delete(key, res, self.keys.chain(sid))
                    pipe.srem(self.keys.sessions, sid)
                    pipe.zrem(self.keys.chains, sid)
                    index_ops(pipe, self.keys, sid, old, None)
                    reserve_ops(pipe, self.keys, old, None)
                    for node in res_nodes:
                        pipe.srem(self.keys.node_residents(node), sid)
                    await pipe.execute()
                    return old is not None
                except WatchError:
                    continue

    # --- nodes ------------------------------------------------------------------------------

    async def put_node_status(self, node: str, update: NodeUpdate) -> NodeRecord:
        """Telemetry's write: the given fields change, the others (and ``reserved``) stay."""
        key = self.keys.node(node)
        async with self._pipe(True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    old = decode_node(node, await pipe.hgetall(key)) or NodeRecord(id=node)
                    rec = merge_node(old, update)
                    pipe.multi()
                    pipe.hset(key, mapping=encode_node_fields(rec))
                    pipe.sadd(self.keys.nodes, node)
                    await pipe.execute()
                    return rec
                except WatchError:
                    continue

    async def put_node_status_msg(
        self, status: NodeStatus, *, target_utilisation: float, failures: int = 0
    ) -> NodeRecord:
        """:meth:`put_node_status` from a telemetry ``NodeStatus`` message (empty model list =
        serves any model); ``url`` is kept when the message has none."""
        return await self.put_node_status(
            status.node_id, node_status_update(status, target_utilisation, failures)
        )

    async def get_node(self, node: str) -> NodeRecord | None:
        return decode_node(node, await self._r.hgetall(self.keys.node(node)))

    async def nodes(self) -> list[NodeRecord]:
        ids = sorted(await self._members(self.keys.nodes))
        if not ids:
            return []
        async with self._pipe(False) as pipe:
            for node in ids:
                pipe.hgetall(self.keys.node(node))
            raws = await pipe.execute()
        recs = (decode_node(n, raw) for n, raw in zip(ids, raws, strict=True))
        return [r for r in recs if r is not None]

    async def node_views(self) -> list[NodeView]:
        return [rec.view() for rec in await self.nodes()]

    async def delete_node(self, node: str) -> bool:
        """Forget a node's status (a reservation still held there keeps ``reserved``)."""
        key = self.keys.node(node)
        async with self._pipe(True) as pipe:
            pipe.hget(key, "healthy")  # not HEXISTS: redis-py 8's cluster transaction breaks
            pipe.hdel(key, *encode_node_fields(NodeRecord(id=node)).keys())  # on its reply
            pipe.srem(self.keys.nodes, node)
            existed, _, _ = await pipe.execute()
        return existed is not None

    # --- residency --------------------------------------------------------------------------

    async def put_residency(self, sid: str, node: str, k0: int, t_obs: float) -> None:
        await self.put_residencies(((sid, node, k0, t_obs),))

    async def put_residencies(self, items: Iterable[tuple[str, str, int, float]]) -> None:
        """Record ``(sid, node, k0, t_obs)`` observations; ``k0 <= 0`` deletes the pair."""
        await self.put_tiered_residencies((sid, node, k0, t, 0) for sid, node, k0, t in items)

    async def put_tiered_residencies(
        self, items: Iterable[tuple[str, str, int, float, int]]
    ) -> None:
        """Record ``(sid, node, k0, t_obs, host)`` observations (``host``: tokens of the
        session's context from its start in the node's host KV tier); a pair with neither
        ``k0`` nor ``host`` > 0 is deleted."""
        async with self._pipe(True) as pipe:
            for sid, node, k0, t_obs, host in items:
                res, nres = self.keys.residency(sid), self.keys.node_residents(node)
                if k0 > 0 or host > 0:
                    pipe.hset(res, node, encode_residency(max(0, k0), t_obs, host))
                    pipe.sadd(nres, sid)
                else:
                    pipe.hdel(res, node)
                    pipe.srem(nres, sid)
            await pipe.execute()

    async def residency(self, sids: Iterable[str]) -> dict[str, dict[str, tuple[int, float]]]:
        wanted = list(sids)
        if not wanted:
            return {}
        async with self._pipe(False) as pipe:
            for sid in wanted:
                pipe.hgetall(self.keys.residency(sid))
            raws = await pipe.execute()
        return {sid: decode_residency(raw) for sid, raw in zip(wanted, raws, strict=True)}

    async def host_residency(self, sids: Iterable[str]) -> dict[str, dict[str, int]]:
        """Per session, ``node -> tokens`` of its context in that node's host KV tier (sessions
        and nodes with none left out)."""
        wanted = list(sids)
        if not wanted:
            return {}
        async with self._pipe(False) as pipe:
            for sid in wanted:
                pipe.hgetall(self.keys.residency(sid))
            raws = await pipe.execute()
        out = {sid: decode_host_residency(raw) for sid, raw in zip(wanted, raws, strict=True)}
        return {sid: per for sid, per in out.items() if per}

    async def clear_node_residency(self, node: str) -> None:
        """Drop every residency entry on ``node`` (it restarted or cleared its cache)."""
        nres = self.keys.node_residents(node)
        async with self._pipe(True) as pipe:
            while True:
                try:
                    await pipe.watch(nres)
                    sids = [as_str(s) for s in await pipe.smembers(nres)]
                    pipe.multi()
                    for sid in sids:
                        pipe.hdel(self.keys.residency(sid), node)
                    pipe.delete(nres)
                    await pipe.execute()
                    return
                except WatchError:
                    continue

    # --- chains -----------------------------------------------------------------------------

    async def put_chains(self, items: Iterable[tuple[str, int, Sequence[int], float]]) -> None:
        """Store each ``(sid, block_size, keys, stamp)`` chain, replacing the session's last
        one and renewing its :data:`CHAIN_TTL_S`."""
        expires = time.time() + CHAIN_TTL_S
        async with self._pipe(True) as pipe:
            n = 0
            for sid, block_size, keys, stamp in items:
                value = encode_chain(block_size, keys, stamp)
                pipe.set(self.keys.chain(sid), value, ex=int(CHAIN_TTL_S))
                pipe.zadd(self.keys.chains, {sid: expires})
                n += 1
            if n:
                # ids whose chain has expired leave the index here, not only on a restore
                pipe.zremrangebyscore(self.keys.chains, "-inf", time.time())
                await pipe.execute()

    async def chains(self) -> ChainsRead:
        """Every stored chain; ids whose chain expired are unlisted, corrupt ones dropped (and
        named in the result)."""
        members: list[Any] = await self._r.zrange(self.keys.chains, 0, -1)
        ids = sorted(as_str(m) for m in members)
        found: list[tuple[str, int, list[int], float]] = []
        gone: list[str] = []
        corrupt: list[str] = []
        for lo in range(0, len(ids), _CHAIN_PAGE):
            page = ids[lo : lo + _CHAIN_PAGE]
            raws = await self._r.mget([self.keys.chain(sid) for sid in page])
            for sid, raw in zip(page, raws, strict=True):
                entry = read_chain(sid, raw)
                if entry is None:
                    (gone if raw is None else corrupt).append(sid)
                else:
                    found.append(entry)
        if gone or corrupt:
            await self.drop_chains([*gone, *corrupt])
        return ChainsRead(found, corrupt)

    async def drop_chains(self, sids: Iterable[str]) -> None:
        """Forget the chains of ``sids`` (ended sessions)."""
        wanted = list(sids)
        if not wanted:
            return
        async with self._pipe(True) as pipe:
            pipe.delete(*(self.keys.chain(sid) for sid in wanted))
            pipe.zrem(self.keys.chains, *wanted)
            await pipe.execute()

    # --- tool statistics --------------------------------------------------------------------

    async def record_tool(self, tool: str, duration: float, *, censored: bool = False) -> None:
        """Add one completed duration (or one censored cut) to ``tool`` and to the global
        aggregate, atomically (concurrent recorders never lose an update)."""
        step = censor if censored else update
        step(ToolStats(), duration)  # validates before touching Redis
        key, field = self.keys.toolstats, tool_field(tool)
        self._stats = None  # (only saves a failed check of the next recording batch)
        async with self._pipe(True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    own, overall = await pipe.hmget(key, [field, GLOBAL_TOOL_FIELD])
                    new_own = step(decode_toolstats(own), duration)
                    new_all = step(decode_toolstats(overall), duration)
                    pipe.multi()
                    pipe.hset(
                        key,
                        mapping={
                            field: encode_toolstats(new_own),
                            GLOBAL_TOOL_FIELD: encode_toolstats(new_all),
                        },
                    )
                    await pipe.execute()
                    return
                except WatchError:
                    continue

    async def record_tools(self, items: Sequence[tuple[str, float, bool]]) -> None:
        """:meth:`record_tool` for a batch of ``(tool, duration, censored)``, folded in order,
        in one transaction; a bad tool name or duration refuses the whole batch."""
        if not items:
            return
        fold_tools(items, dict.fromkeys((t for t, _, _ in items), ToolStats()), ToolStats())
        key = self.keys.toolstats
        self._stats = None
        async with self._pipe(True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    mapping = await self._folded_toolstats(items)
                    pipe.multi()
                    pipe.hset(key, mapping=mapping)
                    await pipe.execute()
                    return
                except WatchError:
                    continue

    async def _folded_toolstats(self, items: Sequence[tuple[str, float, bool]]) -> dict[str, str]:
        """The tool-statistics fields after folding ``items`` into the stored ones (read on a
        pooled connection: the caller has ``WATCH``ed the hash); empty for no items. Raises
        StoreError / ValueError on a bad tool name or duration."""
        if not items:
            return {}
        fields = [*dict.fromkeys(tool_field(t) for t, _, _ in items), GLOBAL_TOOL_FIELD]
        got = await self._r.hmget(self.keys.toolstats, fields)
        stored = {f: as_str(v) for f, v in zip(fields, got, strict=True) if v is not None}
        return {f: new for f, _, new in folded_toolstats(items, stored)}

    async def history(self) -> History:
        raw = await self._r.hgetall(self.keys.toolstats)
        tools: dict[str, ToolStats] = {}
        overall = ToolStats()
        for k, v in raw.items():
            name = as_str(k)
            if name == GLOBAL_TOOL_FIELD:
                overall = decode_toolstats(v)
            elif name.startswith("tool:"):
                tools[name[5:]] = decode_toolstats(v)
        return History(tools=tools, overall=overall)

    # --- apply ------------------------------------------------------------------------------

    async def apply(self, decision: Decision, at: float, *, epoch: int = 0) -> Applied:
        """Verify-and-apply ``decision`` atomically: exactly
        ``apply_decision(decision, live sessions, live_free(views), at, nodes=views)`` with
        ``views = node_views()`` on the live state (the script recomputes each admit's live
        eligibility digest itself), plus reserved totals, indexes and the planner counters.
        An empty decision changes nothing and counts nothing. A non-zero ``epoch`` (the
        planner's lease, :mod:`shared.infra.lease`) below the domain's :meth:`fence` changes
        nothing either (``Applied.fenced``)."""
        moves = (*decision.interrupts, *decision.admits)
        if not moves:
            return Applied(discarded=False)
        index: dict[str, int] = {}
        for m in moves:
            index.setdefault(m.session, len(index) + 1)
            check_node_id(m.node)
        sids = list(index)
        keys = [self.keys.pool, self.keys.admitted_tool, self.keys.planner]
        keys += [self.keys.session(sid) for sid in sids]
        args: list[str | int] = [repr(float(at)), self.keys.node_prefix, len(sids)]
        args += [len(decision.interrupts), len(decision.admits), *sids]
        for m in moves:
            args += [index[m.session], m.node, int(m.weight), int(m.version), m.digest]
        args += [int(epoch), self.keys.nodes]
        reply = await self._apply(keys=keys, args=args)
        if int(reply[0]) == 2:
            return Applied(discarded=True, fenced=True)
        if int(reply[0]) == 0:
            changed = tuple(sids[int(i) - 1] for i in reply[1])
            return Applied(discarded=True, changed=changed)
        admitted, truncated, flat = int(reply[1]), int(reply[2]) == 1, reply[3]
        out: dict[str, Session] = {}
        for i in range(0, len(flat), 2):
            raw = flat[i + 1]
            pairs = dict(zip(raw[0::2], raw[1::2], strict=True))
            rec = decode_session(pairs)
            if rec is None:  # pragma: no cover - the script only returns written records
                raise StoreError("apply: a written session vanished")
            out[sids[int(flat[i]) - 1]] = rec
        return Applied(
            discarded=False,
            interrupted=decision.interrupts,
            admitted=decision.admits[:admitted],
            truncated=truncated,
            sessions=out,
        )

    async def rebuild_contexts(self) -> int:
        """Recount every node's ``contexts`` / ``held`` from the session records in one atomic
        script (``lua/rebuild_contexts.lua``); returns how many sessions hold a context. The
        session writes keep the totals as they go; this sets them where they were never kept
        (records written before they existed). O(stored sessions): run at start-up."""
        args = [self.keys.session_prefix, self.keys.node_prefix, self.keys.nodes]
        return int(await self._rebuild_contexts(keys=[self.keys.sessions], args=args))

    async def fence(self, epoch: int) -> bool:
        """Raise the domain's planner epoch to ``epoch`` (a new leader, on taking over), so
        plans of older epochs are refused; False when a newer one is already there."""
        return bool(await self._fence(keys=[self.keys.planner], args=[int(epoch)]))

    # --- counters and status ----------------------------------------------------------------

    async def incr(self, **counts: int) -> None:
        """Add to planner counters (``incr(ticks=1)``)."""
        if not counts:
            return
        async with self._pipe(True) as pipe:
            for name, n in counts.items():
                pipe.hincrby(self.keys.planner, name, int(n))
            await pipe.execute()

    async def record_solve(
        self, ms: float, method: str, exact: bool, *, fallback: bool | None = None
    ) -> None:
        """Keep one solve time (the last ``SOLVE_SAMPLES``) and count solves by kind:
        ``solves_exact`` when exact, ``fallbacks`` when ``fallback`` (None: not exact)."""
        async with self._pipe(True) as pipe:
            pipe.lpush(self.keys.solve_ms, repr(float(ms)))
            pipe.ltrim(self.keys.solve_ms, 0, SOLVE_SAMPLES - 1)
            pipe.hincrby(self.keys.planner, "solves", 1)
            if exact:
                pipe.hincrby(self.keys.planner, "solves_exact", 1)
            if (not exact) if fallback is None else fallback:
                pipe.hincrby(self.keys.planner, "fallbacks", 1)
            pipe.hincrby(self.keys.planner, f"method:{method}", 1)
            await pipe.execute()

    async def planner_stats(self) -> dict[str, object]:
        async with self._pipe(False) as pipe:
            pipe.hgetall(self.keys.planner)
            pipe.lrange(self.keys.solve_ms, 0, -1)
            counters, samples = await pipe.execute()
        return planner_stats_from(
            {as_str(k): int(v) for k, v in counters.items()},
            [float(as_str(x)) for x in samples],
        )

    async def put_planner_ready(self, record: PlannerReady) -> None:
        """Write the planner's readiness record; Redis drops it ``ttl_s`` later unless the
        next beat writes it again."""
        async with self._pipe(True) as pipe:
            pipe.delete(self.keys.ready)  # a record of another replica goes whole
            pipe.hset(self.keys.ready, mapping=record.as_hash())
            pipe.pexpire(self.keys.ready, max(1, round(record.ttl_s * 1000)))
            await pipe.execute()

    async def planner_ready(self) -> PlannerReady | None:
        """The planner's readiness record, ``None`` when none is current."""
        raw = await self._r.hgetall(self.keys.ready)
        return PlannerReady.from_hash({as_str(k): as_str(v) for k, v in raw.items()})

    async def status(self) -> dict[str, object]:
        """The shape of ``tao status --json`` (see :func:`store_stats.status_dict`)."""
        return status_dict(
            self.domain, await self.nodes(), await self.sessions(), await self.planner_stats()
        )

    async def clear(self) -> int:
        """Delete every key of this domain (tests, ``tao reset``); returns how many."""
        if self._cache is not None:
            self._cache.clear()
        self._stats = None
        n = 0
        batch: list[Any] = []
        async for key in self._r.scan_iter(match=self.keys.pattern(), count=500):
            batch.append(key)
            if len(batch) == 500:  # one DEL per scan page, not one per key
                n += int(await self._r.delete(*batch))
                batch.clear()
        if batch:
            n += int(await self._r.delete(*batch))
        return n
