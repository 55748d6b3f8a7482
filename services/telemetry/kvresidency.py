"""Residency from vLLM KV events: the default :class:`ResidencySource` of the telemetry service.

The full account: docs/internals.md, section ``services/telemetry/kvresidency.py``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final, Protocol

import anyio
from structlog.typing import FilteringBoundLogger

from services.telemetry.residency import UsageResidency, decode_response, usage_skip
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.errors import DecodeError
from shared.contracts.kv import KVEventBatch, decode_kv_batch
from shared.contracts.session import SessionEnd, SessionResponse
from shared.contracts.subjects import KV_SEQ_HEADER
from shared.contracts.subjects import RECEIVED_AT_HEADER as KV_RECEIVED_AT_HEADER
from shared.core.blockkeys import KEY_MAX
from shared.core.kvindex import ApplyResult, KvIndex
from shared.infra.busapi import Delivery, MessageBus, Subscription, received_at
from shared.infra.settings import NodeSpec
from shared.infra.shard import ONE, Shard
from shared.infra.store_types import NodeUpdate, StateStore

__all__ = ["KV_RECEIVED_AT_HEADER", "KV_SEQ_HEADER", "FeedFactory", "KvResidency", "t_obs_for"]

DEFAULT_FLUSH_S: Final = 0.05
DEFAULT_SKEW_S: Final = 5.0
DEFAULT_PATH_IDLE_S: Final = 5.0
DEFAULT_EVIDENCE_S: Final = 0.5
"""How often a node's ``kv_until`` is written while its batches flow (a new ``kv_since`` is
written at the next flush)."""
_RETRY_S: Final = 1.0
ENDED_MEMORY: Final = 65_536
"""Ended sessions remembered (id -> end time), so that a response processed after its session's
end (the two arrive on separate consumers) does not bring the chain back."""


def chain_fault(ev: SessionResponse) -> str | None:
    """Why ``ev``'s block keys cannot be a chain, or None (they can, or there are none)."""
    keys, bs = ev.block_keys, ev.block_size
    if keys is None:
        return None
    if bs is None or bs < 1:
        return f"block_size must be >= 1 with block_keys, got {bs!r}"
    if not math.isfinite(ev.finished_at):
        return f"finished_at must be finite, got {ev.finished_at!r}"
    if keys and (min(keys) < 0 or max(keys) > KEY_MAX):
        return f"block keys must lie in 0..{KEY_MAX}"
    return None


class KvMessageLike(Protocol):
    """What a feed yields (``shared.infra.kvzmq.KvMessage``)."""

    @property
    def node(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def payload(self) -> bytes: ...
    @property
    def received_at(self) -> float: ...
    @property
    def replayed(self) -> bool: ...


FeedFactory = Callable[[NodeSpec], AsyncIterator[KvMessageLike]]
"""Opens the ordered ZMQ stream of a node (injected in tests)."""


def zmq_feed(spec: NodeSpec) -> AsyncIterator[KvMessageLike]:
    """The live feed: ``KvFeed(...).messages()`` with a catch-up replay at start."""
    from shared.infra.kvzmq import KvFeed

    assert spec.kv_events is not None
    return KvFeed(spec.id, spec.kv_events, spec.kv_replay, catch_up=True).messages()


def t_obs_for(ts: float, received_at: float, skew_s: float = DEFAULT_SKEW_S) -> float:
    """The observation time of a batch: engine ``ts`` unless it is off by more than ``skew_s``."""
    return ts if abs(ts - received_at) <= skew_s else received_at


class _Resume:
    """The first messages of a reopened feed, checked against ``(seq, payload)``: the last batch
    applied from it (see the module docstring)."""

    def __init__(self, seq: int, payload: bytes) -> None:
        self.seq = seq
        self.payload = payload
        self.held: list[KvMessageLike] | None = []  # None: checked, pass everything on

    def take(self, msg: KvMessageLike) -> list[KvMessageLike]:
        """What to apply now: nothing while the replay is below ``seq``; then, for the same
        engine, nothing of the replay up to ``seq``, else what was held and ``msg``."""
        held = self.held
        if held is None:
            return [msg]
        if msg.replayed and msg.seq < self.seq:
            held.append(msg)
            return []
        self.held = None
        if msg.replayed and msg.seq == self.seq and msg.payload == self.payload:
            return []  # the same engine: all of this was applied before the feed failed
        return [*held, msg]


def decode_end(data: bytes) -> SessionEnd:
    ev = decode(data, SessionEnd)
    subjects.escape_token(ev.session_id)
    return ev


class KvResidency:
    """Residency from KV events, with :class:`UsageResidency` for what they cannot cover."""

    name = "kv-events"

    def __init__(
        self,
        store: StateStore,
        log: FilteringBoundLogger,
        nodes: Sequence[NodeSpec],
        *,
        feeds: FeedFactory | None = zmq_feed,
        flush_s: float = DEFAULT_FLUSH_S,
        skew_s: float = DEFAULT_SKEW_S,
        path_idle_s: float = DEFAULT_PATH_IDLE_S,
        monotonic: Callable[[], float] = time.monotonic,
        shard: Shard = ONE,
        evidence_s: float = DEFAULT_EVIDENCE_S,
    ) -> None:
        self.store = store
        self.shard = shard
        """This process's nodes (``TAO_SHARD``): ``nodes`` are its own; every response's chain
        is kept (walked against its nodes' blocks), bridged KV events of other nodes are
        dropped, and only shard 0 stores the chains."""
        self.log = log
        self.nodes = list(nodes)
        self.feeds = feeds
        self.flush_s = flush_s
        self.skew_s = skew_s
        self.path_idle_s = path_idle_s
        self.monotonic = monotonic
        self.index = KvIndex()
        self.usage = UsageResidency(store, log)
        self.counts: Counter[str] = Counter()
        self._paths: dict[str, tuple[str, float]] = {}
        self._zmq_last: dict[str, tuple[int, bytes]] = {}  # node -> last (seq, payload) from ZMQ
        self._seq_restart_at: dict[str, float] = {}  # node -> receive time of its last seq reset
        self._wake = asyncio.Event()
        self._retry: list[tuple[str, str, int, float, int]] = []
        self._retry_cleared: list[str] = []
        self._chains_out: dict[str, tuple[int, list[int], float]] = {}  # to store
        self._chains_gone: set[str] = set()  # to drop from the store
        self._ended: OrderedDict[str, float] = OrderedDict()  # see ENDED_MEMORY
        self.evidence_s = evidence_s
        self._configured = {spec.id for spec in self.nodes}
        # node -> the (kv_since, kv_until) last written and when (monotonic)
        self._evidence_out: dict[str, tuple[tuple[float, float], float]] = {}

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self, bus: MessageBus, service: str) -> list[Subscription]:
        """Restore the stored chains, then consume responses, session ends and bridged KV
        events (the ZMQ feeds and the flusher run in :meth:`run`)."""
        await self.restore()
        responses = await bus.consume(
            subjects.STREAM_SESSION,
            service,
            decode_response,
            self.on_response,
            filter_subject=subjects.session_events("response"),
        )
        ends = await bus.consume(
            subjects.STREAM_SESSION,
            service,
            decode_end,
            self.on_end,
            filter_subject=subjects.session_events("end"),
            durable=f"{service}-kv-ends",
        )
        bridged = await bus.consume_batch(
            subjects.STREAM_KV,
            service,
            decode_kv_batch,
            self.on_bridged,
            ephemeral=True,
            deliver="all",
        )
        return [responses, ends, bridged]

    async def run(self) -> None:
        """The ZMQ feed of every node with ``kv_events`` and the flusher, until cancelled."""
        async with anyio.create_task_group() as tg:
            if self.feeds is not None:
                for spec in self.nodes:
                    if spec.kv_events:
                        tg.start_soon(self._follow, spec)
            tg.start_soon(self._flusher)

    # --- sessions ---------------------------------------------------------------------------

    async def restore(self) -> int:
        """Register the chains a previous run stored (the KV events replayed next then give
        their prefixes again); the number restored. A store that cannot be read is logged and
        the chains come back with each session's next response."""
        try:
            found = await self.store.chains()
        except Exception as exc:
            self.counts["restore_failures"] += 1
            self.log.error("chains_restore_failed", error=f"{type(exc).__name__}: {exc}")
            return 0
        restored = 0
        for i, (sid, bs, keys, stamp) in enumerate(found.chains):
            restored += self.index.register(sid, keys, bs, stamp)
            if i % 256 == 255:
                await asyncio.sleep(0)  # long contexts take a while: let the loop breathe
        self.counts["chains_restored"] += restored
        if found.corrupt:
            self.counts["chains_corrupt"] += len(found.corrupt)
            self.log.warning("chains_corrupt_dropped", sessions=found.corrupt[:20])
        self.log.info("chains_restored", chains=restored, corrupt=len(found.corrupt))
        return restored

    def is_kv_node(self, node: str) -> bool:
        """Whether ``node``'s residency comes from KV events: some have arrived from it (a node
        configured with ``kv_events`` whose stream is silent stays on usage-based residency)."""
        return self.index.has_node(node)

    async def on_response(self, ev: SessionResponse, d: Delivery) -> None:
        """Register the response's chain; fall back to usage where KV events cannot tell."""
        sid = ev.session_id
        ended = self._ended.get(sid)
        if ended is not None:
            if ev.finished_at <= ended:
                self.counts["after_end"] += 1  # the session is over: nothing to keep
                return
            del self._ended[sid]  # the id was used again
        keys, bs = ev.block_keys, ev.block_size
        fault = chain_fault(ev)
        mine = self.shard.owns(ev.node_id)  # else its node's shard records the residency
        if fault is not None:
            if mine:  # one shard tells
                self.counts["bad_chains"] += 1
                self.log.warning("bad_chain", session=sid, node=ev.node_id, reason=fault)
        elif keys is not None and bs and ev.error is None:
            if not self.index.register(sid, keys, bs, ev.finished_at):
                self.counts["stale_chains"] += 1  # older than the chain we hold: nothing new
                return
            self.counts["chains"] += 1
            if self.shard.index == 0:  # one shard stores the chains
                self._chains_out[sid] = (bs, keys, ev.finished_at)
                self._chains_gone.discard(sid)
            self._wake.set()
            if mine and self.is_kv_node(ev.node_id):
                self.index.touch(sid, ev.node_id, ev.finished_at)
                self.log.info(
                    "residency",
                    source=self.name,
                    session=sid,
                    node=ev.node_id,
                    blocks=len(keys),
                    resident_tokens=self.index.prefix_tokens(sid, ev.node_id),
                )
                return
        if not mine:
            self.counts["foreign_responses"] += 1
            return
        self.counts["usage_fallbacks"] += 1
        if usage_skip(ev) is None:  # usage writes residency the events cannot confirm: the
            self.index.unconfirm(ev.node_id, ev.finished_at)  # node's evidence starts after it
            if self._evidence_due(ev.node_id) is not None:
                self._wake.set()
        await self.usage.on_response(ev, d)

    async def on_end(self, ev: SessionEnd, d: Delivery) -> None:
        sid = ev.session_id
        self.index.forget(sid)
        self._chains_out.pop(sid, None)
        if self.shard.index == 0:
            self._chains_gone.add(sid)
        self._ended[sid] = ev.ended_at
        self._ended.move_to_end(sid)
        if len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)
        self._wake.set()

    # --- KV events --------------------------------------------------------------------------

    def _claim(self, node: str, path: str) -> bool:
        """Whether ``path`` feeds ``node`` now (see the module docstring)."""
        now = self.monotonic()
        current = self._paths.get(node)
        if current is not None and current[0] != path:
            if now - current[1] <= self.path_idle_s:
                self.counts[f"ignored_{path}"] += 1
                return False
            self.log.warning("kv_path_switched", node=node, old=current[0], new=path)
            self.counts["path_switches"] += 1
        self._paths[node] = (path, now)
        return True

    async def _follow(self, spec: NodeSpec) -> None:
        """Apply one node's ZMQ feed forever (a feed that fails is opened again)."""
        assert self.feeds is not None
        while True:
            last = self._zmq_last.get(spec.id)
            resume = None
            if last is not None and self.index.last_seq(spec.id) == last[0]:
                resume = _Resume(*last)
            try:
                async for msg in self.feeds(spec):
                    if resume is None:
                        self.on_zmq(msg)
                        continue
                    for m in resume.take(msg):
                        self.on_zmq(m)
            except Exception as exc:
                self.counts["feed_failures"] += 1
                self.log.error("kv_feed_failed", node=spec.id, error=f"{type(exc).__name__}: {exc}")
            await anyio.sleep(_RETRY_S)

    def on_zmq(self, msg: KvMessageLike) -> None:
        """One ordered message of a node's ZMQ feed."""
        if not self._claim(msg.node, "zmq"):
            return
        try:
            batch = decode_kv_batch(msg.payload)
        except DecodeError as exc:
            self.counts["bad_payloads"] += 1
            self.log.warning(
                "kv_bad_payload", node=msg.node, seq=msg.seq, path="zmq", reason=str(exc)
            )
            batch = KVEventBatch(ts=msg.received_at, events=[])  # still advance the sequence
        self._apply("zmq", msg.node, msg.seq, batch, msg.received_at)
        self._zmq_last[msg.node] = (msg.seq, msg.payload)

    async def on_bridged(self, items: list[tuple[KVEventBatch, Delivery]]) -> None:
        """Batches from ``tao.v1.kv.<node>``; never raises (a retry would break the order)."""
        for batch, d in items:
            try:
                self._on_bridged_one(batch, d)
            except Exception as exc:  # a bug here must not stall or reorder the stream
                self.counts["errors"] += 1
                self.log.error(
                    "kv_apply_failed", subject=d.subject, error=f"{type(exc).__name__}: {exc}"
                )

    def _on_bridged_one(self, batch: KVEventBatch, d: Delivery) -> None:
        node = d.subject.rsplit(".", 1)[-1]
        if not self.shard.owns(node):
            self.counts["foreign_kv"] += 1  # its node's shard applies it
            return
        try:
            seq = int(d.headers[KV_SEQ_HEADER])
        except (KeyError, ValueError):
            self.counts["bad_seq"] += 1
            self.log.warning(
                "kv_bad_payload",
                node=node,
                path="nats",
                reason=f"header {KV_SEQ_HEADER} missing or not an integer: "
                f"{d.headers.get(KV_SEQ_HEADER)!r}",
            )
            return
        if not self._claim(node, "nats"):
            return
        if d.num_delivered > 1 and self.index.classify(node, seq) == "restart":
            self.counts["duplicates"] += 1  # a redelivery we already applied, not a restart
            return
        self._apply("nats", node, seq, batch, received_at(d))

    def _apply(
        self, path: str, node: str, seq: int, batch: KVEventBatch, received_at: float
    ) -> ApplyResult:
        last = self.index.last_seq(node)
        res = self.index.apply(node, seq, batch, t_obs_for(batch.ts, received_at, self.skew_s))
        counts = self.counts
        counts["batches"] += 1
        counts["blocks_stored"] += res.stored
        counts["blocks_removed"] += res.removed
        if res.host_stored or res.host_removed or res.host_unresolved or res.other_media:
            counts["host_blocks_stored"] += res.host_stored
            counts["host_blocks_removed"] += res.host_removed
            counts["host_unresolved"] += res.host_unresolved
            counts["other_media"] += res.other_media
        if res.action == "gap":
            counts[f"gaps_{path}"] += 1
            assert last is not None
            self.log.warning(
                "kv_gap",
                node=node,
                path=path,
                missing_from=last + 1,
                missing_to=seq - 1,
                replayed=path == "zmq",
            )
        elif res.action == "restart":
            counts["restarts"] += 1
            self._seq_restart_at[node] = received_at
            stats = self.index.stats(node)
            self.log.warning(
                "kv_restart",
                node=node,
                path=path,
                seq=seq,
                last=last,
                incarnation=None if stats is None else stats.incarnation,
            )
        if res.cleared:
            counts["clears"] += 1
        if res.bad_events or batch.unknown_events:
            counts["bad_events"] += res.bad_events + batch.unknown_events
        self.log.debug(
            "kv_batch",
            node=node,
            path=path,
            seq=seq,
            stored=res.stored,
            removed=res.removed,
            host_stored=res.host_stored or None,
            host_removed=res.host_removed or None,
            host_unresolved=res.host_unresolved or None,
            filtered=res.filtered or None,
            orphans=res.orphans or None,
            unknown_removals=res.unknown_removals or None,
            cleared=res.cleared or None,
        )
        if self.index.pending() or self._evidence_due(node) is not None:
            self._wake.set()
        return res

    async def engine_restarted(self, node: str, since: float | None, reason: str) -> bool:
        """The scraper saw ``node``'s engine restarted after ``since`` (wall time of the last
        scrape that saw the old engine; ``reason`` says how it knows). The new engine's cache is
        empty, but a restarted engine that has not published yet sends no ``seq`` reset, so its
        old blocks would stay in the index. Unless a batch numbered from the new engine already
        reset the node after ``since``, clear it now and start a new incarnation (its next
        batch, ``seq`` 0, is then read as the first of the new one); True if it was cleared."""
        done = self._seq_restart_at.get(node)
        if since is not None and done is not None and done >= since:
            return False
        self.index.clear(node, time.time(), restart=True)
        self._zmq_last.pop(node, None)
        self.counts["restarts_scraped"] += 1
        stats = self.index.stats(node)
        self.log.warning(
            "kv_restart",
            node=node,
            path="metrics",
            reason=reason,
            incarnation=None if stats is None else stats.incarnation,
        )
        self._wake.set()
        return True

    # --- writes -----------------------------------------------------------------------------

    async def _flusher(self) -> None:
        while True:
            # a node's latest kv_until held back by evidence_s is written when it is due
            with anyio.move_on_after(self.evidence_s if self._evidence_pending() else math.inf):
                await self._wake.wait()
            await anyio.sleep(self.flush_s)  # debounce: gather what the next events change
            self._wake.clear()
            if not await self.flush():
                await anyio.sleep(_RETRY_S)
                self._wake.set()

    async def flush(self) -> bool:
        """Write the changed prefixes (clears first), then the nodes' evidence, then the new or
        ended chains; False if the store failed (what failed is kept for the next try, each
        part on its own)."""
        wrote = await self._flush_residency()
        wrote = await self._flush_evidence() and wrote
        return await self._flush_chains() and wrote

    def _evidence_due(self, node: str) -> tuple[float, float] | None:
        """``node``'s evidence when it is to be written now: a configured node whose
        ``kv_since`` moved, or whose ``kv_until`` moved :attr:`evidence_s` after the last
        write."""
        if node not in self._configured:
            return None
        ev = self.index.evidence(node)
        if ev is None:
            return None
        last = self._evidence_out.get(node)
        if last is not None:
            (since, until), at = last
            if ev == (since, until):
                return None
            if ev[0] == since and self.monotonic() - at < self.evidence_s:
                return None
        return ev

    def _evidence_pending(self) -> bool:
        """Whether some configured node's evidence differs from what was last written."""
        out = self._evidence_out
        return any(
            (ev := self.index.evidence(n)) is not None and (n not in out or out[n][0] != ev)
            for n in self._configured
        )

    async def _flush_evidence(self) -> bool:
        """Write each node's due ``(kv_since, kv_until)``, after the residency it confirms."""
        due = [(n, ev) for n in self.index.nodes() if (ev := self._evidence_due(n)) is not None]
        try:
            for node, (since, until) in due:
                await self.store.put_node_status(node, NodeUpdate(kv_since=since, kv_until=until))
                self._evidence_out[node] = ((since, until), self.monotonic())
        except Exception as exc:
            self.counts["evidence_failures"] += 1
            self.log.error("kv_evidence_flush_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    async def _flush_residency(self) -> bool:
        cleared = self._retry_cleared + self.index.take_cleared()
        pairs = {(r[0], r[1]): r for r in self._retry}  # the latest per pair, no repeats
        for r in self.index.drain():
            pairs[(r.session, r.node)] = (r.session, r.node, r.tokens, r.stamp, r.host_tokens)
        items = list(pairs.values())
        self._retry, self._retry_cleared = [], []
        if not cleared and not items:
            return True
        try:
            for node in dict.fromkeys(cleared):
                await self.store.clear_node_residency(node)
            if items:
                await self.store.put_tiered_residencies(items)
        except Exception as exc:
            self._retry, self._retry_cleared = items, cleared
            self.counts["flush_failures"] += 1
            self.log.error("residency_flush_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        self.counts["written"] += len(items)
        self.log.info(
            "residency_flush", source=self.name, pairs=len(items), cleared=cleared or None
        )
        return True

    async def _flush_chains(self) -> bool:
        chains, gone = self._chains_out, self._chains_gone
        self._chains_out, self._chains_gone = {}, set()
        try:
            if gone:
                await self.store.drop_chains(sorted(gone))
            if chains:
                await self.store.put_chains((sid, *c) for sid, c in chains.items())
        except Exception as exc:
            self._keep_chains(chains, gone)
            self.counts["chain_flush_failures"] += 1
            self.log.error("chain_flush_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        self.counts["chains_written"] += len(chains)
        return True

    def _keep_chains(self, chains: dict[str, tuple[int, list[int], float]], gone: set[str]) -> None:
        """Put back what a failed flush did not write, under what arrived meanwhile: a newer
        chain or a later end of the same session wins."""
        chains.update(self._chains_out)
        gone |= self._chains_gone
        for sid in self._chains_out:
            gone.discard(sid)
        for sid in self._chains_gone:
            chains.pop(sid, None)
        self._chains_out, self._chains_gone = chains, gone
