"""Which blocks each vLLM node holds, and each session's resident prefix there (pure, no I/O).

The full account: docs/internals.md, section ``shared/core/kvindex.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
"""``medium`` values whose blocks count (``None``: older vLLM, which only reported GPU)."""

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


@dataclass(frozen=True, slots=True)
class Residency:
    """A dirty (session, node) pair: its resident prefix in tokens and the stamp of the change."""

    session: str
    node: str
    tokens: int
    stamp: float


@dataclass(slots=True)
class _Chain:
    keys: list[int]
    block_size: int
    stamp: float


@dataclass(slots=True)
class _Node:
    refs: dict[int, int] = field(default_factory=dict)
    engine: dict[BlockHash, Any] = field(default_factory=dict)  # int key, or list[int] keys
    prefix: dict[str, int] = field(default_factory=dict)  # session -> resident blocks (> 0)
    # Filters that spare most blocks the (large) reverse-map lookup; both are counts over the
    # sessions in ``prefix``: ``want`` of the key right after each prefix (the key that would
    # extend it), ``held`` of every key inside each prefix (a key whose eviction would cut it).
    want: dict[int, int] = field(default_factory=dict)
    held: dict[int, int] = field(default_factory=dict)
    group: object = _UNSET  # the counted group_idx (None: engine without groups)
    block_size: int | None = None
    tracker: SeqTracker = field(default_factory=SeqTracker)
    last_ts: float | None = None
    last_t_obs: float | None = None
    orphans: int = 0
    unknown_removals: int = 0
    since: float | None = None  # complete since (first batch, last gap, clear or unconfirm)
    until: float | None = None  # ... up to (the latest stamp applied since)

    def reset(self) -> None:
        self.refs = {}
        self.engine = {}
        self.group = _UNSET


def _orphan_root(parent: BlockHash) -> int:
    """A root no real chain starts from, derived from an unknown parent's engine hash."""
    raw = (
        b"b" + parent
        if isinstance(parent, bytes)
        else b"i" + parent.to_bytes(16, "little", signed=True)
    )
    return int.from_bytes(blake2b(b"tao-orphan:" + raw, digest_size=8).digest(), "little")


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
                self._store(state, ev, touched, result)
            elif type(ev) is BlockRemoved:
                self._remove(state, ev, touched, result)
            elif type(ev) is AllBlocksCleared:
                self._flush(node, touched, t_obs)
                self._clear(node, state, t_obs)
                result.cleared = True
        self._flush(node, touched, t_obs)
        state.orphans += result.orphans
        state.unknown_removals += result.unknown_removals
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
        state.reset()
        state.since = state.until = t_obs
        dirty = self._dirty
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
        if ev.medium not in COUNTED_MEDIA or (
            kind is not None and kind not in FULL_ATTENTION_KINDS
        ):
            result.filtered += 1
            return
        group = ev.group_idx
        counted = state.group
        if counted is _UNSET or (counted is None and group is not None):
            state.group = group  # learned from the first counted store that names a group
        elif group is not None and group != counted:
            result.filtered += 1
            return
        hashes = ev.block_hashes
        bs = ev.block_size
        tokens = ev.token_ids
        n = len(hashes)
        if bs < 1 or len(tokens) != n * bs:
            result.bad_events += 1
            if bs < 1:
                return
            n = min(n, len(tokens) // bs)
            tokens = tokens[: n * bs]
        state.block_size = bs
        parent = ev.parent_block_hash
        engine = state.engine
        engine_get = engine.get
        if parent is None:
            pkey = _lora_root(ev)
        else:
            found = engine_get(parent)
            if found is None:
                pkey = _orphan_root(parent)
                result.orphans += 1
            else:
                pkey = found if type(found) is int else found[-1]
        try:
            keys = chain_keys(tokens, bs, pkey)  # exactly n keys
        except ValueError:  # a token id outside uint32: nothing here can match a session
            result.bad_events += 1
            return
        extra = ev.extra_keys
        if extra:
            keys = _salt_chain(keys, tokens, bs, pkey, extra)
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

    def _remove(
        self, state: _Node, ev: BlockRemoved, touched: dict[str, None], result: ApplyResult
    ) -> None:
        """Count blocks out; a key leaving (count 1 -> 0) cuts the prefixes that contain it."""
        if ev.medium not in COUNTED_MEDIA:
            result.filtered += 1
            return
        group = ev.group_idx
        if group is not None and type(state.group) is int and group != state.group:
            result.filtered += 1
            return
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

    def _resident(self, state: _Node, key: int, touched: dict[str, None]) -> None:
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

    def _evicted(self, state: _Node, key: int, touched: dict[str, None]) -> None:
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
            before = state.prefix.get(session, 0)
            if c and before < c:
                continue  # the walk stops where it did, on a key both chains share
            blocks = c + self._walk(state.refs, new_keys[c:] if c else new_keys)
            _rechain(state, old_keys, before, new_keys, blocks, c)
            if blocks != before:
                if blocks:
                    state.prefix[session] = blocks
                else:
                    del state.prefix[session]
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
            blocks = state.prefix.pop(session, None)
            if blocks and chain is not None:
                _moved(state, chain.keys, blocks, 0)
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

    def prefix_blocks(self, session: str, node: str) -> int:
        """``session``'s resident prefix on ``node``, in blocks (kept incrementally)."""
        state = self._nodes.get(node)
        return 0 if state is None else state.prefix.get(session, 0)

    def prefix_tokens(self, session: str, node: str) -> int:
        chain = self._chains.get(session)
        return 0 if chain is None else self.prefix_blocks(session, node) * chain.block_size

    # --- queries ----------------------------------------------------------------------------

    @staticmethod
    def _walk(refs: dict[int, int], keys: Sequence[int]) -> int:
        n = 0
        for key in keys:
            if key not in refs:
                break
            n += 1
        return n

    def walk(self, node: str, keys: Sequence[int]) -> int:
        """How many leading ``keys`` are resident on ``node`` (blocks)."""
        state = self._nodes.get(node)
        return 0 if state is None else self._walk(state.refs, keys)

    def walk_tokens(self, node: str, tokens: Sequence[int], block_size: int) -> int:
        """Resident leading tokens of ``tokens`` on ``node``: their own keys (from the base
        root) walked block by block, times ``block_size``. ValueError for a bad token id."""
        return self.walk(node, chain_keys(tokens, block_size)) * block_size

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
        )

    def resident(self, node: str, key: int) -> int:
        """The reference count of own ``key`` on ``node`` (0: not resident)."""
        state = self._nodes.get(node)
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
            blocks = self.prefix_blocks(sid, node)
            out.append(Residency(sid, node, blocks * chain.block_size, stamp))
        return out


def _decrement(counts: dict[int, int], key: int) -> None:
    count = counts[key]
    if count > 1:
        counts[key] = count - 1
    else:
        del counts[key]


def _rechain(
    state: _Node, old: list[int], before: int, new: list[int], blocks: int, common: int
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


def _moved(state: _Node, chain: list[int], old: int, new: int) -> None:
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
