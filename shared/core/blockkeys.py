"""TAO's own block keys: a hash chain over token ids, one key per full KV block.

vLLM names each cached block by an engine hash that usually cannot be reproduced off-engine
(it is seeded per process and, in newer vLLM, a sha256 over pickled or CBOR-encoded tuples; see
``vllm/v1/core/kv_cache_utils.py``). TAO therefore keys blocks its own way, from what both sides
can see: the block's token ids and its parent's key. The telemetry service computes the key of
every ``BlockStored`` block from the event's ``token_ids`` (mapping the engine hash to it, so a
later ``BlockRemoved`` resolves), and the gateway computes the keys of a session's prompt and
completion token ids. A session's resident prefix on a node is then the number of leading keys
of its chain that the node holds.

Key of block ``j``: the first 8 bytes (little-endian unsigned) of
``blake2b(key[j-1].to_bytes(8, "little") + tokens[j*B:(j+1)*B] as little-endian uint32)``,
with ``key[-1] = root``. Only full blocks get a key (vLLM caches only full blocks). ``root`` is
:data:`ROOT` for the base model; :func:`root_for` gives a distinct root per LoRA adapter, so an
adapter's blocks never match a base-model prompt.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b
from typing import Final

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "KEY_MAX",
    "ROOT",
    "TOKEN_MAX",
    "block_key",
    "chain_keys",
    "common_prefix",
    "root_for",
]

ROOT: Final = 0
"""The parent key of a chain's first block (base model, no LoRA)."""

KEY_MAX: Final = 2**64 - 1
"""The largest block key (keys are 8-byte little-endian unsigned digests)."""

TOKEN_MAX: Final = 2**32 - 1
"""The largest token id a block key takes (ids are hashed as little-endian uint32)."""

DEFAULT_BLOCK_SIZE: Final = 16
"""vLLM's default KV block size in tokens (``--block-size``, ``vllm/config/cache.py``): assumed
for a node that has not said its own."""

_EMPTY: Final = blake2b(digest_size=8)
"""An empty 8-byte blake2b state; :func:`chain_keys` copies it per block (never updated)."""


def root_for(lora: int | str | None) -> int:
    """The root key for blocks computed under LoRA adapter ``lora`` (``None``: :data:`ROOT`)."""
    if lora is None:
        return ROOT
    digest = blake2b(f"lora:{lora}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _tokens_bytes(tokens: Sequence[int]) -> bytes:
    try:
        return array("I", tokens).tobytes()
    except OverflowError:
        bad = next(t for t in tokens if not 0 <= t <= TOKEN_MAX)
        raise ValueError(f"token id {bad} is outside 0..{TOKEN_MAX}") from None


def block_key(parent: int, tokens: Sequence[int]) -> int:
    """The key of one block of ``tokens`` whose parent block has key ``parent``."""
    h = blake2b(parent.to_bytes(8, "little"), digest_size=8)
    h.update(_tokens_bytes(tokens))
    return int.from_bytes(h.digest(), "little")


def chain_keys(tokens: Sequence[int], block_size: int, root: int = ROOT) -> list[int]:
    """Keys of the full blocks of ``tokens`` in order (a trailing partial block has none).

    Raises :class:`ValueError` for a block size below 1 or a token id outside uint32.
    The same values as :func:`block_key` block by block, computed faster: each block's hash
    state is a ``copy()`` of one empty 8-byte blake2b (the constructor's keyword parsing costs
    more than the hashing), and the parent's digest is fed as bytes, without the int round trip.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    raw = _tokens_bytes(tokens)
    step = 4 * block_size
    keys: list[int] = []
    append = keys.append
    from_bytes = int.from_bytes
    fresh = _EMPTY.copy
    parent = root.to_bytes(8, "little")
    for start in range(0, len(tokens) // block_size * step, step):
        h = fresh()
        h.update(parent)
        h.update(raw[start : start + step])
        parent = h.digest()
        append(from_bytes(parent, "little"))
    return keys


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of two key chains (lists or arrays)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (an extended chain), compared in C
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
