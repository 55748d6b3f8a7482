"""KV tiers: where a prefix can live on a node, and what it takes to make it usable again.

One model, read by the engine model (:mod:`shared.core.engine`), the KV index
(:mod:`shared.core.kvindex`) and the valuation (:mod:`shared.core.tick`, :mod:`shared.core.rules`):

* A node's KV lives in **GPU** memory (usable at once) and, with vLLM's ``OffloadingConnector``,
  in a **host** tier (CPU DRAM) that vLLM fills write-through as prompt blocks are computed and
  empties by LRU when a store needs room (docs/kv-tier.md §1–§2).
* vLLM names the tiers in its KV events' ``medium``: ``"GPU"`` (or no medium, before 0.11) and
  ``"CPU"`` for the host tier; ``"STORAGE"`` (disk connectors) is not modelled
  (``vllm/distributed/kv_events.py:51-53@0.32``, docs/kv-tier.md §4).
* A prefix found in host memory is loaded asynchronously over the node's host link: every TP
  rank copies its own shard over its own PCIe link, so the load of ``T`` tokens takes
  ``T × bytes-per-token-per-GPU / H2D bandwidth`` (docs/kv-tier.md §3, §5).
* A prefix in no tier is recomputed: its prefill.

The **time to make a prefix usable** prices every tier the same way (docs/internals.md, "Tiered
credit"): GPU 0, host the load, none the recompute. A host-resident prefix is therefore worth the
fraction of its recompute that the load saves, ``1 − load/recompute``, in tokens of credit; a
GPU-resident one is worth all its tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from shared.core.decay import round_to


class Prices(Protocol):
    """What the credit of a host-held prefix reads of a node's prices
    (:class:`shared.core.nodecost.NodeCost` is one)."""

    @property
    def load_s(self) -> float: ...

    def recompute_s(self, evicted: int, kept: int) -> float: ...


__all__ = [
    "CPU",
    "GPU",
    "HostLink",
    "Prices",
    "Tier",
    "host_credit",
    "load_s_per_token",
    "tier_of",
    "tiered_credits",
]

Tier = Literal["GPU", "CPU"]

GPU: Final[Tier] = "GPU"
"""vLLM's ``MEDIUM_GPU``: the engine's own block pool."""
CPU: Final[Tier] = "CPU"
"""vLLM's ``MEDIUM_CPU``: the OffloadingConnector's host tier."""


def tier_of(medium: str | None) -> Tier | None:
    """The tier a KV event's ``medium`` names: ``None`` (vLLM before 0.11 reported GPU only)
    and ``"GPU"`` → GPU, ``"CPU"`` → the host tier; any other medium (``"STORAGE"``, a
    connector's own) → ``None``: a tier TAO does not model, whose events it skips."""
    if medium is None or medium == GPU:
        return GPU
    if medium == CPU:
        return CPU
    return None


@dataclass(frozen=True, slots=True)
class HostLink:
    """One node's host KV tier: its capacity and the link that fills and empties it.

    ``blocks``: host capacity in KV blocks of ``block_size`` tokens (vLLM sizes it from
    ``cpu_bytes_to_use``, docs/kv-tier.md §0; ``tao sim --host-kv F`` gives ``F ×`` the GPU
    blocks). ``bytes_per_token``: KV bytes per token that *one* GPU holds (its TP shard, or the
    whole latent under MLA's replicated layout): each rank moves its own over its own link, in
    parallel. ``h2d_bytes_s`` / ``d2h_bytes_s``: one GPU's host→device (load) and
    device→host (store) bandwidth.
    """

    blocks: int
    block_size: int
    bytes_per_token: int
    h2d_bytes_s: float
    d2h_bytes_s: float

    def __post_init__(self) -> None:
        if self.blocks < 1 or self.block_size < 1 or self.bytes_per_token < 1:
            raise ValueError(
                f"HostLink: blocks, block_size, bytes_per_token must be >= 1, got "
                f"{self.blocks}, {self.block_size}, {self.bytes_per_token}"
            )
        for name, bw in (("h2d_bytes_s", self.h2d_bytes_s), ("d2h_bytes_s", self.d2h_bytes_s)):
            if not (bw > 0 and math.isfinite(bw)):
                raise ValueError(f"HostLink: {name} must be finite and > 0, got {bw}")

    @property
    def tokens(self) -> int:
        """Host capacity in tokens."""
        return self.blocks * self.block_size

    @property
    def load_s_per_token(self) -> float:
        """Seconds to load one token's KV from the host (H2D)."""
        return load_s_per_token(self.bytes_per_token, self.h2d_bytes_s)

    def load_s(self, tokens: int) -> float:
        """Seconds the H2D link takes to load ``tokens`` (no queueing)."""
        return max(0, tokens) * self.load_s_per_token

    def store_s(self, tokens: int) -> float:
        """Seconds the D2H link takes to store ``tokens`` (no queueing)."""
        return max(0, tokens) * self.bytes_per_token / self.d2h_bytes_s


def host_credit(host_tokens: int, load_s: float, recompute_s: float) -> int:
    """Tokens of credit a host-resident run of ``host_tokens`` is worth: the fraction of its
    recompute (``recompute_s``) that loading it instead (``load_s``) saves, ``1 − load/recompute``,
    times its tokens (0 when the load is no faster than the recompute)."""
    if host_tokens <= 0 or recompute_s <= 0.0:
        return 0
    saved = 1.0 - load_s / recompute_s
    return int(host_tokens * saved) if saved > 0.0 else 0


def load_s_per_token(bytes_per_token: int, h2d_bytes_s: float) -> float:
    """Seconds one GPU's host link takes to load one token's KV: its shard of the token
    (``bytes_per_token``) over its host→device bandwidth (every rank loads its own in
    parallel). A live node states both (its nodes-file entry); :class:`HostLink` derives its
    own the same way."""
    if bytes_per_token < 1 or not (h2d_bytes_s > 0 and math.isfinite(h2d_bytes_s)):
        raise ValueError(
            f"load_s_per_token: bytes_per_token must be >= 1 and h2d_bytes_s finite and > 0, "
            f"got {bytes_per_token}, {h2d_bytes_s}"
        )
    return bytes_per_token / h2d_bytes_s


def tiered_credits(
    gpu_credits: Mapping[str, int],
    gpu: Mapping[str, tuple[int, float]],
    host: Mapping[str, int],
    costs: Mapping[str, Prices],
    unit: int,
) -> dict[str, int]:
    """Per-node credit of one session over both tiers: its decayed GPU credit
    (``gpu_credits``, from the GPU residency ``gpu``: node → ``(k0, t_obs)``) plus, on each node
    with a host tier (its ``costs`` entry's ``load_s`` > 0), the :func:`host_credit` of what
    the host holds beyond the GPU's ``k0`` (``host``: node → tokens from the start), rounded
    to ``unit``. The host residency is current evidence (the event stream announces every host
    store and eviction), so its credit does not decay."""
    out = dict(gpu_credits)
    for node, held in host.items():
        cost = costs.get(node)
        rate = 0.0 if cost is None else cost.load_s
        k0 = gpu[node][0] if node in gpu else 0
        extra = held - k0
        if cost is None or rate <= 0.0 or extra <= 0:
            continue
        credit = host_credit(extra, extra * rate, cost.recompute_s(extra, k0))
        add = round_to(unit, credit) if credit > 0 else 0
        if add > 0:
            out[node] = out.get(node, 0) + add
    return {node: out[node] for node in sorted(out)}
