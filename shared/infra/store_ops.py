"""Python halves of the session writes of :class:`shared.infra.store.Store`: which index-set
and ``reserved`` moves a write needs (only where membership, node or weight change), and the
argument of ``lua/batch_write.lua`` (only changed hash fields). Pure: no Redis calls here; the
pipeline is the caller's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from shared.core.session import Session
from shared.infra.keys import GLOBAL_TOOL_FIELD, Keys, tool_field
from shared.infra.store_codec import SESSION_FIELDS, decode_toolstats, encode_toolstats
from shared.infra.store_types import Folded, context_moves, fold_tools

__all__ = [
    "FIRST_SESSION_KEY",
    "folded_toolstats",
    "index_ops",
    "membership",
    "reserve_ops",
    "texts",
    "write_args",
]

_json: Final = msgspec.json.Encoder()
FIRST_SESSION_KEY: Final = 4
"""``KEYS`` index (1-based) of the first session hash in ``lua/batch_write.lua``."""


def texts(raw: Any) -> list[Any] | None:
    """One HMGET reply of :data:`SESSION_FIELDS`: the small fields as text, ``data`` as
    returned (msgspec decodes bytes or str); None when the hash is absent."""
    *small, data = raw
    if data is None:  # no ``data``: no record
        return None
    out: list[Any] = [x.decode() if isinstance(x, bytes) else x or "" for x in small]
    out.append(data)
    return out


def _pooled(s: Session | None) -> bool:
    return s is not None and s.pooled


def _in_tool(s: Session | None) -> bool:
    return s is not None and s.node is not None and s.activity == "tool"


def membership(old: Session | None, new: Session | None) -> tuple[int, int]:
    """Index-set moves for ``old -> new``: per set 1 add, 0 remove, -1 unchanged (the stored
    record's membership is consistent with it: every write keeps it so)."""
    p_old, p_new = _pooled(old), _pooled(new)
    t_old, t_new = _in_tool(old), _in_tool(new)
    return (-1 if p_old == p_new else int(p_new)), (-1 if t_old == t_new else int(t_new))


def index_ops(pipe: Any, keys: Keys, sid: str, old: Session | None, new: Session | None) -> None:
    """Queue the index-set writes that make ``pool`` / ``admitted_tool`` agree with ``new``
    (only where membership changes)."""
    pooled, in_tool = membership(old, new)
    if pooled >= 0:
        (pipe.sadd if pooled else pipe.srem)(keys.pool, sid)
    if in_tool >= 0:
        (pipe.sadd if in_tool else pipe.srem)(keys.admitted_tool, sid)


def reserve_ops(pipe: Any, keys: Keys, old: Session | None, new: Session | None) -> None:
    """Queue ``reserved`` moves: old node -old weight, new node +new weight (nothing when
    the node and the weight did not change), and the context totals' moves
    (:func:`~shared.infra.store_types.context_moves`: ``contexts`` and ``held``)."""
    for node, tokens, held in context_moves(old, new):
        pipe.hincrby(keys.node(node), "contexts", tokens)
        pipe.hincrby(keys.node(node), "held", held)
    if old is not None and new is not None and (old.node, old.weight) == (new.node, new.weight):
        return
    if old is not None and old.node is not None and old.weight:
        pipe.hincrby(keys.node(old.node), "reserved", -old.weight)
    if new is not None and new.node is not None and new.weight:
        pipe.hincrby(keys.node(new.node), "reserved", new.weight)


def folded_toolstats(
    items: Sequence[tuple[str, float, bool]], stored: Mapping[str, str]
) -> list[tuple[str, str | None, str]]:
    """``(field, stored text or None, new text)`` of every tool statistics field the samples
    ``items`` ``(tool, duration, censored)`` fold into (each touched tool's, then the global
    one), folded in order on ``stored`` (the hash as text); empty for no items. Raises
    StoreError / ValueError on a bad tool name or duration."""
    if not items:
        return []
    names = list(dict.fromkeys(tool for tool, _, _ in items))
    fields = [tool_field(t) for t in names]
    tools, total = fold_tools(
        items,
        {t: decode_toolstats(stored.get(f)) for t, f in zip(names, fields, strict=True)},
        decode_toolstats(stored.get(GLOBAL_TOOL_FIELD)),
    )
    out = [
        (f, stored.get(f), encode_toolstats(tools[t])) for t, f in zip(names, fields, strict=True)
    ]
    out.append((GLOBAL_TOOL_FIELD, stored.get(GLOBAL_TOOL_FIELD), encode_toolstats(total)))
    return out


_V, _PROBE, _UPDATED_AT = (SESSION_FIELDS.index(f) for f in ("v", "probe", "updated_at"))


def write_args(
    keys_of: Keys,
    keys: Mapping[str, str],
    olds: Mapping[str, list[Any] | None],
    stored: Mapping[str, Session | None],
    folded: Folded[dict[str, str]],
    stats: Sequence[tuple[str, str | None, str]] = (),
) -> list[Any]:
    """``numkeys, *KEYS, *ARGV`` of ``lua/batch_write.lua`` (ARGV: the batch, then
    :data:`SESSION_FIELDS`, the fields a moved hash is sent back with): the check of every
    session read (its ``v``, ``updated_at`` and ``probe`` as read, or absent) and of every
    statistics field ``stats`` folds into (``(field, old text or None, new text)``); per
    written session the fields that differ from the stored hash, its index moves (only where
    membership changes), and the net reserved and context-total moves."""
    index = {sid: i for i, sid in enumerate(keys, start=FIRST_SESSION_KEY)}
    nodes = list(dict.fromkeys([*folded.reserved, *folded.contexts]))
    node_keys = [keys_of.node(n) for n in nodes]
    checks: list[list[object]] = []
    for sid, old in olds.items():
        if old is None:
            checks.append([index[sid], False])
        else:
            checks.append([index[sid], old[_V], old[_UPDATED_AT], old[_PROBE]])
    writes: list[list[object]] = []
    for sid, (new, fields) in folded.writes.items():
        old, prev = olds[sid], stored[sid]
        pooled, in_tool = membership(prev, new)
        w: list[object] = [index[sid], sid, int(old is None), pooled, in_tool]
        if old is None:
            for name, value in fields.items():
                w += (name, value)
        else:  # ``data`` always (the record changed, so its JSON did)
            for name, was, value in zip(SESSION_FIELDS, old, fields.values(), strict=True):
                if was != value or name == "data":
                    w += (name, value)
        writes.append(w)
    first_node = FIRST_SESSION_KEY + len(keys)
    deltas: list[list[object]] = []
    for j, node in enumerate(nodes):  # false: no move of that total (the field stays unmade)
        r, c = folded.reserved.get(node), folded.contexts.get(node)
        deltas.append([first_node + j, False if r is None else str(r),
                       *([False, False] if c is None else [str(c[0]), str(c[1])])])  # fmt: skip
    all_keys = [keys_of.sessions, keys_of.pool, keys_of.admitted_tool]
    all_keys += [*keys.values(), *node_keys]
    batch: dict[str, object] = {"c": checks, "s": writes, "r": deltas, "t": []}
    if stats:
        all_keys.append(keys_of.toolstats)
        batch["k"] = len(all_keys)
        batch["t"] = [[f, False if was is None else was, now] for f, was, now in stats]
    return [len(all_keys), *all_keys, _json.encode(batch), *SESSION_FIELDS]
