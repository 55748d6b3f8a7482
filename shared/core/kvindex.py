"""Which blocks each vLLM node holds, and each session's resident prefix there (pure, no I/O).

The full account: docs/internals.md, section ``shared/core/kvindex.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, Final

from shared.contracts.inspect import NodeInspect
from shared.contracts.kv import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from shared.core.blockkeys import ROOT, block_key, chain_keys, common_prefix, root_for
from shared.core.kvseq import SeqAction, SeqTracker
from shared.core.tiers import CPU, GPU, Tier, tier_of

__all__ = [
    "COUNTED_MEDIA",
    "FULL_ATTENTION_KINDS",
    "ApplyResult",
    "KvIndex",
    "NodeStats",
    "Residency",
]

FULL_ATTENTION_KINDS: Final = frozenset({"full_attention", "mla_attention", "sink_full_attention"})
"""``kv_cache_spec_kind`` values whose blocks count (``None`` counts too: an engine that does
not report kinds has one group)."""

COUNTED_MEDIA: Final = frozenset({None, "GPU"})
"""``medium`` values whose blocks count as GPU residency (``None``: older vLLM, which only
reported GPU). ``"CPU"`` counts in the host tier (:func:`shared.core.tiers.tier_of`); any other
medium is skipped and counted (``ApplyResult.other_media``)."""

GONE_MAX: Final = 65_536
"""Engine hashes of GPU blocks removed lately, remembered (hash -> own key) per node with a host
tier: a host store completes after its GPU block was computed and may be announced after that
block left the GPU (docs/internals.md, "Host tier")."""

_UNSET: Final = object()


@dataclass(frozen=True, slots=True)
class NodeStats:
    """What :meth:`KvIndex.stats` reports for one node."""

    node: str
    blocks: int
    """Distinct own keys resident (a key stored twice counts once)."""
    resident_tokens: int
    """``blocks × block_size``."""
    block_size: int | None
    seq: int | None
    """The last applied batch sequence number (``None``: none since the last restart)."""
    incarnation: int
    """Restarts seen (sequence going backwards)."""
    last_ts: float | None
    """Engine time ``ts`` of the last applied batch."""
    last_t_obs: float | None
    """The caller's stamp of the last applied batch."""
    orphans: int
    unknown_removals: int
    since: float | None = None
    """The stream has been complete since this stamp (:meth:`KvIndex.evidence`)."""
    host_blocks: int = 0
    """Distinct own keys resident in the host tier (``medium="CPU"``)."""
    host_resident_tokens: int = 0
    """``host_blocks × block_size``."""
    host_unresolved: int = 0
    """Host stores waiting now for a GPU store to name their engine hash."""
    other_media: int = 0
    """Events of a medium no tier models (``"STORAGE"``, a connector's own), skipped."""


@dataclass(slots=True)
class ApplyResult:
    """What one :meth:`KvIndex.apply` did (the shell logs and counts it)."""

    action: SeqAction
    cleared: bool = False
    """The node was cleared (restart or ``AllBlocksCleared``): drop its stored residency."""
    stored: int = 0
    """Blocks counted in (after filters)."""
    removed: int = 0
    """Blocks counted out."""
    filtered: int = 0
    """Events skipped by the medium / group filters."""
    orphans: int = 0
    """Stored blocks whose parent engine hash was unknown (first block of each such run)."""
    unknown_removals: int = 0
    bad_events: int = 0
    """Stores whose token ids do not fill ``len(block_hashes) × block_size`` or are not uint32
    (the whole blocks that are there are still indexed)."""
    host_stored: int = 0
    """Host-tier blocks counted in (placeholders resolved, or self-describing)."""
    host_removed: int = 0
    """Host-tier blocks counted out."""
    host_unresolved: int = 0
    """Host stores of an engine hash no GPU store named: held by hash (see GONE_MAX)."""
    other_media: int = 0
    """Events of a medium no tier models, skipped (also counted in ``filtered``)."""


@dataclass(frozen=True, slots=True)
class Residency:
    """A dirty (session, node) pair: its resident prefix in tokens (GPU, and the host tier's
    own leading run) and the stamp of the change."""

    session: str
    node: str
    tokens: int
    stamp: float
    host_tokens: int = 0


@dataclass(slots=True)
class _Chain:
    keys: list[int]
    block_size: int
    stamp: float


@dataclass(slots=True)
class _Tier:
    """One tier's residency on a node: own keys counted, and each session's leading run."""

    refs: dict[int, int] = field(default_factory=dict)
    prefix: dict[str, int] = field(default_factory=dict)  # session -> resident blocks (> 0)
    # Filters that spare most blocks the (large) reverse-map lookup; both are counts over the
    # sessions in ``prefix``: ``want`` of the key right after each prefix (the key that would
    # extend it), ``held`` of every key inside each prefix (a key whose eviction would cut it).
    want: dict[int, int] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Host(_Tier):
    """The host tier (``medium="CPU"``) of a node, named by the engine hashes of its events."""

    engine: dict[BlockHash, Any] = field(default_factory=dict)  # int key, or list[int] keys
    unknown: dict[BlockHash, int] = field(default_factory=dict)  # unresolved hash -> stores
    gone: dict[BlockHash, int] = field(default_factory=dict)  # see GONE_MAX


@dataclass(slots=True)
class _Node(_Tier):
    engine: dict[BlockHash, Any] = field(default_factory=dict)  # int key, or list[int] keys
    host: _Host | None = None  # from the node's first host-tier event on
    group: object = _UNSET  # the counted group_idx (None: engine without groups)
    block_size: int | None = None
    tracker: SeqTracker = field(default_factory=SeqTracker)
    last_ts: float | None = None
    last_t_obs: float | None = None
    orphans: int = 0
    unknown_removals: int = 0
    other_media: int = 0
    since: float | None = None  # complete since (first batch, last gap, clear or unconfirm)
    until: float | None = None  # ... up to (the latest stamp applied since)

    def reset(self) -> None:
        self.refs = {}
        self.engine = {}
        self.group = _UNSET
        if self.host is not None:
            self.host = _Host()


def _orphan_root(parent: BlockHash) -> int:
    """A root no real chain starts from, derived from an unknown parent's engine hash."""
    raw = (
        b"b" + parent
        if isinstance(parent, bytes)
        else b"i" + parent.to_bytes(16, "little", signed=True)
    )
    return int.from_bytes(blake2b(b"tao-orphan:" + raw, digest_size=8).digest(), "little")


def _own_keys(
    ev: BlockStored, lookup: Callable[[BlockHash], Any], result: ApplyResult
) -> list[int] | None:
    """The own keys of a stored run (one per whole block of token ids), chained from its
    parent's key (``lookup``: engine hash -> key, or list of keys, or None: an orphan); None
    when nothing in it can be keyed (counted in ``result``)."""
    hashes = ev.block_hashes
    bs = ev.block_size
    tokens = ev.token_ids
    n = len(hashes)
    if bs < 1 or len(tokens) != n * bs:
        result.bad_events += 1
        if bs < 1:
            return None
        n = min(n, len(tokens) // bs)
        tokens = tokens[: n * bs]
    parent = ev.parent_block_hash
    if parent is None:
        pkey = _lora_root(ev)
    else:
        found = lookup(parent)
        if found is None:
            pkey = _orphan_root(parent)
            result.orphans += 1
        else:
            pkey = found if type(found) is int else found[-1]
    try:
        keys = chain_keys(tokens, bs, pkey)  # exactly n keys
    except ValueError:  # a token id outside uint32: nothing here can match a session
        result.bad_events += 1
        return None
    extra = ev.extra_keys
    if extra:
        keys = _salt_chain(keys, tokens, bs, pkey, extra)
    return keys


def _name(state: _Node, host: _Host, h: BlockHash) -> int | None:
    """The own key an engine hash names on a node: from its GPU store (resident, or removed
    lately), else from an earlier host announcement."""
    found: Any = state.engine.get(h)
    if found is None:
        found = host.gone.get(h)
        if found is None:
            found = host.engine.get(h)
            if found is None:
                return None
    return found if type(found) is int else int(found[-1])


def _trim(d: dict[Any, Any], keep: int) -> None:
    """Drop the oldest entries of ``d`` (insertion order) until ``keep`` are left."""
    for k in list(itertools.islice(d, len(d) - keep)):
        del d[k]


def _salted(key: int, extra: object) -> int:
    """``key`` with a block's ``extra_keys`` entry mixed in (never equal to a token-only key)."""
    h = blake2b(key.to_bytes(8, "little"), digest_size=8)
    h.update(b"tao-extra:" + repr(extra).encode())
    return int.from_bytes(h.digest(), "little")


def _lora_root(ev: BlockStored) -> int:
    lora: int | str | None = ev.lora_name if ev.lora_name is not None else ev.lora_id
    return ROOT if lora is None else root_for(lora)


class KvIndex:
    """Resident blocks per node and resident prefixes per (session, node); see the module."""

    def __init__(self) -> None:
        self._nodes: dict[str, _Node] = {}
        self._chains: dict[str, _Chain] = {}
        self._rev: dict[int, dict[str, int]] = {}  # own key -> {session: position in chain}
        self._firsts: dict[int, int] = {}  # first key of a chain -> chains starting with it
        self._dirty: dict[tuple[str, str], float] = {}
        self._cleared: list[str] = []

    # --- nodes ------------------------------------------------------------------------------

    def nodes(self) -> list[str]:
        """Every node that has had a batch applied (or was cleared)."""
        return list(self._nodes)

    def has_node(self, node: str) -> bool:
        return node in self._nodes

    def _node(self, node: str) -> _Node:
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        return state

    def classify(self, node: str, seq: int) -> SeqAction:
        """What :meth:`apply` would do with ``seq`` on ``node`` (next, gap or restart)."""
        state = self._nodes.get(node)
        return "next" if state is None else state.tracker.classify(seq)

    def last_seq(self, node: str) -> int | None:
        state = self._nodes.get(node)
        return None if state is None else state.tracker.last

    def apply(self, node: str, seq: int | None, batch: KVEventBatch, t_obs: float) -> ApplyResult:
        """Apply one batch of ``node`` numbered ``seq``; changes are stamped ``t_obs``.

        ``seq`` going backwards clears the node and starts a new incarnation first; a gap is
        reported in the result (the caller replays or counts it) and the batch applied anyway.
        ``seq=None`` applies without sequence checks.
        """
        state = self._node(node)
        tracker = state.tracker
        action: SeqAction = "next" if seq is None else tracker.classify(seq)
        result = ApplyResult(action)
        if action == "restart":
            self._clear(node, state, t_obs)
            tracker.restart()
            result.cleared = True
        if seq is not None:
            tracker.accept(seq)
        state.last_ts = batch.ts
        state.last_t_obs = t_obs
        if action == "gap" or state.since is None:
            state.since = state.until = t_obs  # what came before may miss a removal
        elif state.until is None or t_obs > state.until:
            state.until = t_obs
        # Sessions whose prefix on this node changed, first change first; written to the
        # dirty map (all stamped t_obs) before a clear and at the end, so its order is as if
        # each change had been written at once.
        touched: dict[str, None] = {}
        for ev in batch.events:
            if type(ev) is BlockStored:
                tier = tier_of(ev.medium)
                if tier == GPU:
                    self._store(state, ev, touched, result)
                elif tier == CPU:
                    self._host_store(state, ev, touched, result)
                else:
                    result.other_media += 1
                    result.filtered += 1
            elif type(ev) is BlockRemoved:
                tier = tier_of(ev.medium)
                if tier == GPU:
                    self._remove(state, ev, touched, result)
                elif tier == CPU:
                    self._host_remove(state, ev, touched, result)
                else:
                    result.other_media += 1
                    result.filtered += 1
            elif type(ev) is AllBlocksCleared:
                self._flush(node, touched, t_obs)
                self._clear(node, state, t_obs)
                result.cleared = True
        self._flush(node, touched, t_obs)
        state.orphans += result.orphans
        state.unknown_removals += result.unknown_removals
        state.other_media += result.other_media
        return result

    def clear(self, node: str, t_obs: float, *, restart: bool = False) -> None:
        """Drop everything of ``node``; ``restart`` also starts a new incarnation."""
        state = self._node(node)
        self._clear(node, state, t_obs)
        if restart:
            state.tracker.restart()

    def evidence(self, node: str) -> tuple[float, float] | None:
        """``(since, until)``: ``node``'s stream has been complete from ``since`` (its first
        batch, its last gap, clear or restart, or :meth:`unconfirm`) to ``until`` (the latest
        stamp applied since), so a prefix the index shows resident, observed at or after
        ``since``, is still resident at ``until`` (:func:`shared.core.decay.with_evidence`).
        ``None`` for a node never heard from."""
        state = self._nodes.get(node)
        if state is None or state.since is None or state.until is None:
            return None
        return state.since, state.until

    def unconfirm(self, node: str, stamp: float) -> None:
        """Residency written on ``node`` at ``stamp`` from elsewhere (usage, not these events)
        is not the stream's to confirm: its stretch now starts just after ``stamp``."""
        state = self._nodes.get(node)
        if state is None or state.since is None:
            return
        after = math.nextafter(stamp, math.inf)
        if after > state.since:
            state.since = after

    def _clear(self, node: str, state: _Node, t_obs: float) -> None:
        """Drop both tiers of ``node``: a restarted engine has neither, and vLLM's
        ``AllBlocksCleared`` cannot say whether the host tier went too (docs/internals.md,
        "Host tier")."""
        dirty = self._dirty
        if state.host is not None:
            for sid in state.host.prefix:
                dirty[(sid, node)] = t_obs
        state.reset()
        state.since = state.until = t_obs
        for sid in state.prefix:
            dirty[(sid, node)] = t_obs
        state.prefix = {}
        state.want = {}
        state.held = {}
        self._cleared.append(node)

    def _flush(self, node: str, touched: dict[str, None], t_obs: float) -> None:
        if touched:
            dirty = self._dirty
            for sid in touched:
                dirty[(sid, node)] = t_obs
            touched.clear()

    def _store(
        self, state: _Node, ev: BlockStored, touched: dict[str, None], result: ApplyResult
    ) -> None:
        """Count a run of blocks in; a key becoming resident (count 0 -> 1) extends the
        prefixes that end right before it (walking on while keys are resident)."""
        kind = ev.kv_cache_spec_kind
        if kind is not None and kind not in FULL_ATTENTION_KINDS:
            result.filtered += 1
            return
        group = ev.group_idx
        counted = state.group
        if counted is _UNSET or (counted is None and group is not None):
            state.group = group  # learned from the first counted store that names a group
        elif group is not None and group != counted:
            result.filtered += 1
            return
        engine = state.engine
        engine_get = engine.get
        keys = _own_keys(ev, engine_get, result)
        if keys is None:
            return
        hashes = ev.block_hashes
        n = len(keys)
        state.block_size = ev.block_size
        refs = state.refs
        refs_get = refs.get
        firsts = self._firsts
        want = state.want
        for key, h in zip(keys, hashes, strict=False):  # hashes may run past n
            old = engine_get(h)
            if old is None:
                engine[h] = key
            elif type(old) is int:
                engine[h] = [old, key]
            else:
                old.append(key)
            count = refs_get(key)
            if count:
                refs[key] = count + 1
                continue
            refs[key] = 1
            # Only a key right after a prefix (a chain's first key for an empty one) extends
            # it; any other key skips the reverse map.
            if key in firsts or key in want:
                self._resident(state, key, touched)
        result.stored += n
        host = state.host
        if host is not None and host.unknown:  # host stores that waited for these hashes
            unknown = host.unknown
            for key, h in zip(keys, hashes, strict=False):
                waiting = unknown.pop(h, 0)
                for _ in range(waiting):
                    self._host_in(host, key, h, touched)
                result.host_stored += waiting

    def _remove(
        self, state: _Node, ev: BlockRemoved, touched: dict[str, None], result: ApplyResult
    ) -> None:
        """Count blocks out; a key leaving (count 1 -> 0) cuts the prefixes that contain it."""
        group = ev.group_idx
        if group is not None and type(state.group) is int and group != state.group:
            result.filtered += 1
            return
        gone = None if state.host is None else state.host.gone
        engine = state.engine
        engine_pop = engine.pop
        refs = state.refs
        held = state.held
        hashes = ev.block_hashes
        unknown = 0
        for h in hashes:
            found = engine_pop(h, None)
            if found is None:
                unknown += 1
                continue
            if type(found) is int:
                key: int = found
                if gone is not None:
                    gone[h] = key
            else:
                key = found.pop()
                engine[h] = found[0] if len(found) == 1 else found
            count = refs[key]
            if count > 1:
                refs[key] = count - 1
                continue
            del refs[key]
            if key in held:  # only a key inside some prefix cuts it
                self._evicted(state, key, touched)
        result.unknown_removals += unknown
        result.removed += len(hashes) - unknown
        if gone is not None and len(gone) > GONE_MAX:
            _trim(gone, GONE_MAX // 2)

    # --- the host tier ----------------------------------------------------------------------

    def _host_of(self, state: _Node) -> _Host:
        host = state.host
        if host is None:
            host = state.host = _Host()
        return host

    def _host_store(
        self, state: _Node, ev: BlockStored, touched: dict[str, None], result: ApplyResult
    ) -> None:
        """A store to the host tier completed: vLLM's placeholder (one engine hash, no tokens,
        ``block_size`` 0) is named through the hashes GPU stores taught; a self-describing one
        (its tokens, parent and block size) is keyed as a GPU store is. A hash nobody named
        yet waits, counted, for the GPU store that names it."""
        kind = ev.kv_cache_spec_kind
        if kind is not None and kind not in FULL_ATTENTION_KINDS:
            result.filtered += 1
            return
        group = ev.group_idx
        counted = state.group
        if group is not None and type(counted) is int and group != counted:
            result.filtered += 1
            return
        host = self._host_of(state)
        hashes = ev.block_hashes
        if ev.block_size < 1 and not ev.token_ids:  # the placeholder (oevents:337-357)
            for h in hashes:
                key = _name(state, host, h)
                if key is None:
                    host.unknown[h] = host.unknown.get(h, 0) + 1
                    result.host_unresolved += 1
                else:
                    self._host_in(host, key, h, touched)
                    result.host_stored += 1
            return
        keys = _own_keys(ev, lambda h: _name(state, host, h), result)
        if keys is None:
            return
        if state.block_size is None:
            state.block_size = ev.block_size
        for key, h in zip(keys, hashes, strict=False):
            self._host_in(host, key, h, touched)
        result.host_stored += len(keys)

    def _host_in(self, host: _Host, key: int, h: BlockHash, touched: dict[str, None]) -> None:
        """One announcement of ``key`` (engine hash ``h``) in the host tier, reference-counted:
        a self-describing chunk re-announces shared hashes (oevents:10-13)."""
        old = host.engine.get(h)
        if old is None:
            host.engine[h] = key
        elif type(old) is int:
            host.engine[h] = [old, key]
        else:
            old.append(key)
        refs = host.refs
        count = refs.get(key)
        if count:
            refs[key] = count + 1
            return
        refs[key] = 1
        if key in self._firsts or key in host.want:
            self._resident(host, key, touched)

    def _host_remove(
        self, state: _Node, ev: BlockRemoved, touched: dict[str, None], result: ApplyResult
    ) -> None:
        """Host blocks evicted: counted out by their engine hashes (a hash still waiting to be
        named is forgotten; one never announced is an unknown removal)."""
        group = ev.group_idx
        if group is not None and type(state.group) is int and group != state.group:
            result.filtered += 1
            return
        host = self._host_of(state)
        engine = host.engine
        refs = host.refs
        for h in ev.block_hashes:
            found = engine.pop(h, None)
            if found is None:
                waiting = host.unknown.get(h, 0)
                if waiting > 1:
                    host.unknown[h] = waiting - 1
                elif waiting:
                    del host.unknown[h]
                else:
                    result.unknown_removals += 1
                continue
            if type(found) is int:
                key: int = found
            else:
                key = found.pop()
                engine[h] = found[0] if len(found) == 1 else found
            result.host_removed += 1
            count = refs[key]
            if count > 1:
                refs[key] = count - 1
                continue
            del refs[key]
            if key in host.held:
                self._evicted(host, key, touched)

    def _resident(self, state: _Tier, key: int, touched: dict[str, None]) -> None:
        """``key`` became resident: extend the prefixes that end right before it."""
        sessions = self._rev.get(key)
        if not sessions:
            return
        prefix = state.prefix
        refs = state.refs
        held = state.held
        want = state.want
        chains = self._chains
        for sid, pos in sessions.items():
            if prefix.get(sid, 0) == pos:  # then chain[pos] is key (its first position)
                chain = chains[sid].keys
                size = len(chain)
                held[key] = held.get(key, 0) + 1
                end = pos + 1
                while end < size:
                    nxt = chain[end]
                    if nxt not in refs:
                        break
                    held[nxt] = held.get(nxt, 0) + 1
                    end += 1
                prefix[sid] = end
                if pos:  # _moved(state, chain, pos, end), inline (a hot loop)
                    count = want[key]
                    if count > 1:
                        want[key] = count - 1
                    else:
                        del want[key]
                if end < size:
                    nxt = chain[end]
                    want[nxt] = want.get(nxt, 0) + 1
                touched[sid] = None

    def _evicted(self, state: _Tier, key: int, touched: dict[str, None]) -> None:
        """``key`` left: cut the prefixes that contain it."""
        sessions = self._rev.get(key)
        if not sessions:
            return
        prefix = state.prefix
        chains = self._chains
        for sid, pos in sessions.items():
            blocks = prefix.get(sid, 0)
            if pos < blocks:
                if pos:
                    prefix[sid] = pos
                else:
                    del prefix[sid]
                _moved(state, chains[sid].keys, blocks, pos)
                touched[sid] = None

    # --- sessions ---------------------------------------------------------------------------

    def register(self, session: str, keys: Sequence[int], block_size: int, stamp: float) -> bool:
        """Set ``session``'s chain (own keys of its latest token ids, ``block_size`` tokens
        each, from a response finished at ``stamp``), replacing the previous one; pairs whose
        prefix changed are marked dirty. A chain older than the registered one (a redelivered
        response, or a stored chain restored after a newer one arrived) is ignored: False."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        old = self._chains.get(session)
        if old is not None and stamp < old.stamp:
            return False
        chain = _Chain(list(keys), block_size, stamp)
        new_keys = chain.keys
        # A session's next chain usually extends its last one: only the keys past the common
        # prefix c change in the reverse map and in the node counts, so a turn costs its new
        # blocks, not the whole context.
        old_keys: list[int] = [] if old is None else old.keys
        c = 0 if old is None or old.block_size != block_size else common_prefix(old_keys, new_keys)
        rev = self._rev
        if c:
            for key in old_keys[c:]:
                holders = rev.get(key)
                if holders is not None and holders.get(session, -1) >= c:
                    del holders[session]  # (a key also met before c keeps its first position)
                    if not holders:
                        del rev[key]
        else:
            self._unlink(session)
            if new_keys:
                first = new_keys[0]
                self._firsts[first] = self._firsts.get(first, 0) + 1
        for pos in range(c, len(new_keys)):
            rev.setdefault(new_keys[pos], {}).setdefault(session, pos)
        self._chains[session] = chain
        for node, state in self._nodes.items():
            changed = _rewalk(state, session, old_keys, new_keys, c)
            if state.host is not None:
                changed = _rewalk(state.host, session, old_keys, new_keys, c) or changed
            if changed:
                self._dirty[(session, node)] = stamp
        return True

    def touch(self, session: str, node: str, stamp: float) -> None:
        """Mark (``session``, ``node``) dirty even if its prefix did not change (a response
        served there: its stored observation, perhaps usage-based, is replaced)."""
        if session in self._chains and node in self._nodes:
            self._dirty[(session, node)] = stamp

    def forget(self, session: str) -> None:
        """Drop ``session`` (it ended); its dirty pairs are dropped too."""
        self._unlink(session)
        chain = self._chains.pop(session, None)
        for node, state in self._nodes.items():
            for tier in (state, state.host):
                if tier is None:
                    continue
                blocks = tier.prefix.pop(session, None)
                if blocks and chain is not None:
                    _moved(tier, chain.keys, blocks, 0)
            self._dirty.pop((session, node), None)

    def _unlink(self, session: str) -> None:
        old = self._chains.get(session)
        if old is None:
            return
        if old.keys:
            first = old.keys[0]
            left = self._firsts[first] - 1
            if left:
                self._firsts[first] = left
            else:
                del self._firsts[first]
        rev = self._rev
        for key in old.keys:
            holders = rev.get(key)
            if holders is not None:
                holders.pop(session, None)
                if not holders:
                    del rev[key]

    def sessions(self) -> int:
        """How many sessions have a chain."""
        return len(self._chains)

    def _tier(self, node: str, tier: Tier) -> _Tier | None:
        state = self._nodes.get(node)
        if state is None or tier == GPU:
            return state
        return state.host

    def prefix_blocks(self, session: str, node: str, tier: Tier = GPU) -> int:
        """``session``'s resident prefix on ``node`` in ``tier``, in blocks: the leading run of
        its chain resident there (kept incrementally)."""
        state = self._tier(node, tier)
        return 0 if state is None else state.prefix.get(session, 0)

    def prefix_tokens(self, session: str, node: str, tier: Tier = GPU) -> int:
        chain = self._chains.get(session)
        return 0 if chain is None else self.prefix_blocks(session, node, tier) * chain.block_size

    def tiers(self, session: str) -> dict[str, dict[Tier, int]]:
        """``session``'s resident prefix in tokens per node and tier (only non-zero ones)."""
        chain = self._chains.get(session)
        out: dict[str, dict[Tier, int]] = {}
        if chain is None:
            return out
        for node, state in self._nodes.items():
            per: dict[Tier, int] = {}
            if blocks := state.prefix.get(session, 0):
                per[GPU] = blocks * chain.block_size
            if state.host is not None and (blocks := state.host.prefix.get(session, 0)):
                per[CPU] = blocks * chain.block_size
            if per:
                out[node] = per
        return out

    # --- queries ----------------------------------------------------------------------------

    @staticmethod
    def _walk(refs: dict[int, int], keys: Sequence[int]) -> int:
        n = 0
        for key in keys:
            if key not in refs:
                break
            n += 1
        return n

    def walk(self, node: str, keys: Sequence[int], tier: Tier = GPU) -> int:
        """How many leading ``keys`` are resident on ``node`` in ``tier`` (blocks)."""
        state = self._tier(node, tier)
        return 0 if state is None else self._walk(state.refs, keys)

    def walk_tokens(
        self, node: str, tokens: Sequence[int], block_size: int, tier: Tier = GPU
    ) -> int:
        """Resident leading tokens of ``tokens`` on ``node`` in ``tier``: their own keys (from
        the base root) walked block by block, times ``block_size``. ValueError for a bad token
        id."""
        return self.walk(node, chain_keys(tokens, block_size), tier) * block_size

    def inspect_node(self, node: str, healthy: bool, capacity_tokens: int | None) -> NodeInspect:
        """The ``tao inspect node`` reply for ``node`` (zeros for a node never heard from)."""
        st = self.stats(node)
        return NodeInspect(
            node=node,
            blocks=0 if st is None else st.blocks,
            resident_tokens=0 if st is None else st.resident_tokens,
            seq=None if st is None else st.seq,
            incarnation=0 if st is None else st.incarnation,
            healthy=healthy,
            capacity_tokens=capacity_tokens,
            host_blocks=0 if st is None else st.host_blocks,
            host_resident_tokens=0 if st is None else st.host_resident_tokens,
        )

    def resident(self, node: str, key: int, tier: Tier = GPU) -> int:
        """The reference count of own ``key`` on ``node`` in ``tier`` (0: not resident)."""
        state = self._tier(node, tier)
        return 0 if state is None else state.refs.get(key, 0)

    def block_size(self, node: str) -> int | None:
        """The block size of ``node``'s last counted store (``None``: none yet)."""
        state = self._nodes.get(node)
        return None if state is None else state.block_size

    def stats(self, node: str) -> NodeStats | None:
        """Counts for ``node``, or ``None`` if it never had a batch."""
        state = self._nodes.get(node)
        if state is None:
            return None
        blocks = len(state.refs)
        host = state.host
        host_blocks = 0 if host is None else len(host.refs)
        return NodeStats(
            node=node,
            blocks=blocks,
            resident_tokens=blocks * (state.block_size or 0),
            block_size=state.block_size,
            seq=state.tracker.last,
            incarnation=state.tracker.incarnation,
            last_ts=state.last_ts,
            last_t_obs=state.last_t_obs,
            orphans=state.orphans,
            unknown_removals=state.unknown_removals,
            since=state.since,
            host_blocks=host_blocks,
            host_resident_tokens=host_blocks * (state.block_size or 0),
            host_unresolved=0 if host is None else sum(host.unknown.values()),
            other_media=state.other_media,
        )

    # --- output -----------------------------------------------------------------------------

    def pending(self) -> bool:
        """Whether :meth:`drain` or :meth:`take_cleared` has something."""
        return bool(self._dirty or self._cleared)

    def take_cleared(self) -> list[str]:
        """Nodes cleared since the last call, in order (drop their stored residency first)."""
        cleared, self._cleared = self._cleared, []
        return list(dict.fromkeys(cleared))

    def drain(self) -> list[Residency]:
        """The (session, node) pairs whose prefix changed since the last drain, with their
        current prefix in tokens (0: nothing resident) and the stamp of the last change."""
        dirty, self._dirty = self._dirty, {}
        out: list[Residency] = []
        for (sid, node), stamp in dirty.items():
            chain = self._chains.get(sid)
            if chain is None:
                continue
            bs = chain.block_size
            gpu = self.prefix_blocks(sid, node)
            host = self.prefix_blocks(sid, node, CPU)
            out.append(Residency(sid, node, gpu * bs, stamp, host * bs))
        return out


def _rewalk(tier: _Tier, session: str, old: list[int], new: list[int], common: int) -> bool:
    """Walk ``session``'s new chain in ``tier`` after it went from ``old`` to ``new`` (sharing
    their first ``common`` keys); whether its resident run changed."""
    before = tier.prefix.get(session, 0)
    if common and before < common:
        return False  # the walk stops where it did, on a key both chains share
    blocks = common + KvIndex._walk(tier.refs, new[common:] if common else new)
    _rechain(tier, old, before, new, blocks, common)
    if blocks == before:
        return False
    if blocks:
        tier.prefix[session] = blocks
    else:
        del tier.prefix[session]
    return True


def _decrement(counts: dict[int, int], key: int) -> None:
    count = counts[key]
    if count > 1:
        counts[key] = count - 1
    else:
        del counts[key]


def _rechain(
    state: _Tier, old: list[int], before: int, new: list[int], blocks: int, common: int
) -> None:
    """Keep ``state.want`` and ``state.held`` counting after a session's chain went from
    ``old`` (``before`` blocks resident) to ``new`` (``blocks`` resident), the two sharing
    their first ``common`` keys and both prefixes reaching that far (so the held counts of the
    shared keys stand as they are)."""
    held = state.held
    for key in old[common:before]:
        _decrement(held, key)
    for key in new[common:blocks]:
        held[key] = held.get(key, 0) + 1
    want = state.want
    if before and before < len(old):
        _decrement(want, old[before])
    if blocks and blocks < len(new):
        key = new[blocks]
        want[key] = want.get(key, 0) + 1


def _moved(state: _Tier, chain: list[int], old: int, new: int) -> None:
    """Keep ``state.want`` and ``state.held`` counting after a session's prefix on the node
    went from ``old`` to ``new`` blocks of ``chain``."""
    _rechain(state, chain, old, chain, new, min(old, new))


def _salt_chain(
    keys: list[int], tokens: Sequence[int], bs: int, root: int, extra: list[Any]
) -> list[int]:
    """Re-key a run whose ``extra_keys`` are set: a block with an entry gets its token key
    salted with it, and later blocks chain from the salted keys (rare: multimodal, cache_salt)."""
    if not any(extra[: len(keys)]):
        return keys
    out: list[int] = []
    parent = root
    for j in range(len(keys)):
        key = block_key(parent, tokens[j * bs : (j + 1) * bs])
        entry = extra[j] if j < len(extra) else None
        if entry:
            key = _salted(key, entry)
        out.append(key)
        parent = key
    return out
