"""How records are written into Redis hashes and read back, exactly (layout: :mod:`keys`).

Floats are written as Python ``repr`` strings (shortest round-trip form) or through msgspec
JSON (which writes the same form), so every float reads back bit for bit; Lua never formats a
float (it only copies strings and adds integers). Redis returns ``bytes`` or ``str`` depending
on the client's ``decode_responses``; every reader here accepts both.
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from shared.core.predictor import ToolStats
from shared.core.session import Session
from shared.infra.keys import StoreError
from shared.infra.store_types import NodeRecord

__all__ = [
    "SESSION_FIELDS",
    "as_str",
    "decode_chain",
    "decode_host_residency",
    "decode_node",
    "decode_residency",
    "decode_session",
    "decode_session_fields",
    "decode_session_values",
    "decode_toolstats",
    "encode_chain",
    "encode_node_fields",
    "encode_residency",
    "encode_session",
    "encode_toolstats",
    "parse_residency",
    "read_chain",
    "str_map",
]

SESSION_FIELDS: Final = ("v", "node", "weight", "activity", "ended", "probe", "updated_at", "data")

_encoder: Final = msgspec.json.Encoder()
_session_decoder: Final = msgspec.json.Decoder(Session)
_models_decoder: Final = msgspec.json.Decoder(list[str] | None)


def as_str(value: bytes | str) -> str:
    """A Redis reply as text."""
    return value.decode() if isinstance(value, bytes) else value


def str_map(raw: Mapping[Any, Any]) -> dict[str, str]:
    """An HGETALL reply as ``str -> str``."""
    return {as_str(k): as_str(v) for k, v in raw.items()}


def _float(x: float, what: str) -> str:
    if not math.isfinite(x):
        raise StoreError(f"{what}: must be finite, got {x!r}")
    return repr(float(x))


def _opt_float(text: str) -> float | None:
    return None if text == "" else float(text)


# --- sessions -------------------------------------------------------------------------------


def encode_session(s: Session) -> dict[str, str]:
    """The session hash: Lua-visible fields apart, the whole record as JSON in ``data``."""
    for name in ("created_at", "updated_at"):
        _float(getattr(s, name), name)
    return {
        "v": str(s.version),
        "node": s.node or "",
        "weight": str(s.weight),
        "activity": s.activity,
        "ended": "1" if s.ended else "0",
        "probe": "" if s.probe_mark is None else _float(s.probe_mark, "probe_mark"),
        "updated_at": repr(float(s.updated_at)),
        "data": _encoder.encode(s).decode(),
    }


def decode_session(raw: Mapping[Any, Any]) -> Session | None:
    """Read a session hash (None for an empty reply); the separate fields win over ``data``."""
    return decode_session_fields(str_map(raw)) if raw else None


def decode_session_fields(f: Mapping[str, str]) -> Session | None:
    """:func:`decode_session` of a hash already read as ``str -> str``."""
    if not f:
        return None
    try:
        base = _session_decoder.decode(f["data"])
        return msgspec.structs.replace(
            base,
            version=int(f["v"]),
            node=f["node"] or None,
            weight=int(f["weight"]),
            activity=f["activity"],
            ended=f["ended"] == "1",
            probe_mark=_opt_float(f["probe"]),
            updated_at=float(f["updated_at"]),
        )
    except (KeyError, ValueError, msgspec.DecodeError) as exc:
        raise StoreError(f"corrupt session record: {exc}") from None


def decode_session_values(values: list[Any]) -> Session:
    """A session from its hash's :data:`SESSION_FIELDS` values in order (present; the small
    fields as text, ``data`` as text or bytes).

    The separate fields win over ``data``; when they all agree with it (the record was last
    written whole, the common case) the record decoded from ``data`` is returned as is."""
    v, node, weight, activity, ended, probe, updated_at, data = values
    try:
        base = _session_decoder.decode(data)
        probe_mark = _opt_float(probe)
        if (
            base.version == int(v)
            and (base.node or "") == node
            and base.weight == int(weight)
            and base.activity == activity
            and base.ended == (ended == "1")
            and base.probe_mark == probe_mark
            and base.updated_at == float(updated_at)
        ):
            return base
        return msgspec.structs.replace(
            base,
            version=int(v),
            node=node or None,
            weight=int(weight),
            activity=activity,
            ended=ended == "1",
            probe_mark=probe_mark,
            updated_at=float(updated_at),
        )
    except (ValueError, TypeError, msgspec.DecodeError) as exc:
        raise StoreError(f"corrupt session record: {exc}") from None


# --- nodes ----------------------------------------------------------------------------------


def encode_node_fields(rec: NodeRecord) -> dict[str, str]:
    """Telemetry's fields of a node hash plus ``usable`` (never ``reserved``, ``contexts`` or
    ``held``: the session writes keep those)."""
    models = None if rec.models is None else sorted(rec.models)
    return {
        "url": rec.url or "",
        "capacity_tokens": str(rec.capacity_tokens),
        "target_utilisation": _float(rec.target_utilisation, "target_utilisation"),
        "usable": str(rec.usable),
        "healthy": "1" if rec.healthy else "0",
        "models": _encoder.encode(models).decode(),
        "block_size": str(rec.block_size),
        "used_tokens": str(rec.used_tokens),
        "usage": _float(rec.usage, "usage"),
        "running": str(rec.running),
        "waiting": str(rec.waiting),
        "prefix_cache_queries": ""
        if rec.prefix_cache_queries is None
        else str(rec.prefix_cache_queries),
        "prefix_cache_hits": "" if rec.prefix_cache_hits is None else str(rec.prefix_cache_hits),
        "updated_at": _float(rec.updated_at, "updated_at"),
        "failures": str(rec.failures),
        "kv_since": "" if rec.kv_since is None else _float(rec.kv_since, "kv_since"),
        "kv_until": "" if rec.kv_until is None else _float(rec.kv_until, "kv_until"),
        "prefill_s": "" if rec.prefill_s is None else _float(rec.prefill_s, "prefill_s"),
        "attn_s": "" if rec.attn_s is None else _float(rec.attn_s, "attn_s"),
        "cost_tokens": "" if rec.cost_tokens is None else str(rec.cost_tokens),
        "cost_source": rec.cost_source,
    }


def _opt_int(text: str | None) -> int | None:
    return None if text is None or text == "" else int(text)


def decode_node(node_id: str, raw: Mapping[Any, Any]) -> NodeRecord | None:
    """Read a node hash (None for an empty reply). A hash holding only ``reserved`` and the
    context totals (a reservation on a node telemetry never reported) reads as unhealthy
    with capacity 0."""
    if not raw:
        return None
    f = str_map(raw)
    try:
        models = _models_decoder.decode(f["models"]) if "models" in f else None
        return NodeRecord(
            id=node_id,
            url=f.get("url") or None,
            capacity_tokens=int(f.get("capacity_tokens", "0")),
            target_utilisation=float(f.get("target_utilisation", "1.0")),
            reserved=int(f.get("reserved", "0")),
            healthy=f.get("healthy") == "1",
            models=None if models is None else frozenset(models),
            block_size=int(f.get("block_size", "16")),
            used_tokens=int(f.get("used_tokens", "0")),
            usage=float(f.get("usage", "0.0")),
            running=int(f.get("running", "0")),
            waiting=int(f.get("waiting", "0")),
            prefix_cache_queries=_opt_int(f.get("prefix_cache_queries")),
            prefix_cache_hits=_opt_int(f.get("prefix_cache_hits")),
            updated_at=float(f.get("updated_at", "0.0")),
            failures=int(f.get("failures", "0")),
            contexts=int(f.get("contexts", "0")),
            held=int(f.get("held", "0")),
            kv_since=_opt_float(f.get("kv_since", "")),
            kv_until=_opt_float(f.get("kv_until", "")),
            prefill_s=_opt_float(f.get("prefill_s", "")),
            attn_s=_opt_float(f.get("attn_s", "")),
            cost_tokens=_opt_int(f.get("cost_tokens")),
            cost_source=f.get("cost_source", ""),
        )
    except (ValueError, msgspec.DecodeError) as exc:
        raise StoreError(f"corrupt node record {node_id!r}: {exc}") from None


# --- residency and tool statistics ----------------------------------------------------------


def encode_residency(k0: int, t_obs: float, host: int = 0) -> str:
    """``"k0 t_obs"``, or ``"k0 t_obs host"`` when the node's host KV tier holds ``host`` > 0
    tokens of the session's context from its start (an entry may then have ``k0`` 0)."""
    text = f"{int(k0)} {_float(t_obs, 't_obs')}"
    return f"{text} {int(host)}" if host > 0 else text


def parse_residency(value: str) -> tuple[int, float, int]:
    """One residency value as ``(k0, t_obs, host)`` (``host`` 0 when absent)."""
    k0, _, rest = value.partition(" ")
    t_obs, _, host = rest.partition(" ")
    return int(k0), float(t_obs), int(host) if host else 0


def decode_residency(raw: Mapping[Any, Any]) -> dict[str, tuple[int, float]]:
    """A residency hash as ``node -> (k0, t_obs)``: the GPU residency (entries that only hold
    host-tier tokens left out)."""
    out: dict[str, tuple[int, float]] = {}
    for node, value in str_map(raw).items():
        k0, t_obs, _ = parse_residency(value)
        if k0 > 0:
            out[node] = (k0, t_obs)
    return out


def decode_host_residency(raw: Mapping[Any, Any]) -> dict[str, int]:
    """A residency hash as ``node -> host-tier tokens`` (nodes with none left out)."""
    out: dict[str, int] = {}
    for node, value in str_map(raw).items():
        host = parse_residency(value)[2]
        if host > 0:
            out[node] = host
    return out


def encode_chain(block_size: int, keys: Sequence[int], stamp: float) -> str:
    """``"block_size stamp base64"``: the keys as little-endian uint64, base64 (text-safe for
    clients that decode replies)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    try:
        packed = array("Q", keys)
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"block keys must be unsigned 64-bit integers: {exc}") from None
    if sys.byteorder != "little":
        packed.byteswap()
    blob = base64.b64encode(packed.tobytes()).decode("ascii")
    return f"{int(block_size)} {_float(stamp, 'stamp')} {blob}"


def decode_chain(sid: str, text: bytes | str) -> tuple[int, list[int], float]:
    """Inverse of :func:`encode_chain`: ``(block_size, keys, stamp)``; StoreError if corrupt."""
    try:
        bs, stamp, blob = as_str(text).split(" ")
        raw = base64.b64decode(blob, validate=True)
        packed = array("Q")
        packed.frombytes(raw)
        if sys.byteorder != "little":
            packed.byteswap()
        block_size, at = int(bs), float(stamp)
        if block_size < 1 or not math.isfinite(at):
            raise ValueError(f"block size {block_size}, stamp {at}")
    except (ValueError, binascii.Error) as exc:
        raise StoreError(f"corrupt chain of session {sid!r}: {exc}") from None
    return block_size, packed.tolist(), at


def read_chain(sid: str, raw: bytes | str | None) -> tuple[str, int, list[int], float] | None:
    """A stored chain as ``(sid, block_size, keys, stamp)``; None if absent or corrupt."""
    if raw is None:
        return None
    try:
        block_size, keys, stamp = decode_chain(sid, raw)
    except StoreError:
        return None
    return sid, block_size, keys, stamp


def encode_toolstats(st: ToolStats) -> str:
    """``"count mean m2 min max censored censored_max"``, floats as repr (``inf`` included)."""
    return " ".join(
        (
            str(st.count),
            repr(st.mean),
            repr(st.m2),
            repr(st.min_s),
            repr(st.max_s),
            str(st.censored),
            repr(st.censored_max_s),
        )
    )


def decode_toolstats(text: bytes | str | None) -> ToolStats:
    """Inverse of :func:`encode_toolstats`; absent -> empty statistics."""
    if text is None:
        return ToolStats()
    parts = as_str(text).split(" ")
    if len(parts) != 7:
        raise StoreError(f"corrupt tool statistics {as_str(text)!r}")
    return ToolStats(
        count=int(parts[0]),
        mean=float(parts[1]),
        m2=float(parts[2]),
        min_s=float(parts[3]),
        max_s=float(parts[4]),
        censored=int(parts[5]),
        censored_max_s=float(parts[6]),
    )
