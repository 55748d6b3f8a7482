"""Baseline ``cache-aware``: the SGLang / vLLM router's cache-aware policy, made capacity-safe.

Source: SGLang model gateway ``src/policies/cache_aware.rs`` (the vLLM router is a fork of it)
and its ``CacheAwareConfig::default()`` in ``src/policies/mod.rs``: ``cache_threshold = 0.5``,
``balance_abs_threshold = 32``, ``balance_rel_threshold = 1.1``. Per request: when the load is
balanced and the best prefix match rate exceeds ``cache_threshold`` (strictly), route to the
worker holding the longest matched prefix; otherwise route to the least-burdened worker (the one
with the smallest prefix tree); when the load is imbalanced — ``max − min > abs`` *and*
``max > rel × min`` — route to the least-loaded worker regardless of cache.

Here, per candidate in arrival order (FCFS):

* the match on node b is the credit ``k[i, b]`` and the match rate is ``k / tokens``;
* the rule is applied to the nodes that can take the candidate now (eligible and with room), so
  when the preferred node is full the choice falls through to the best node that fits, by the
  same rule;
* above the threshold the most credit wins, ties to the least load; otherwise the least load
  wins, ties to the most credit; remaining ties go to the lower node index;
* load is ``node.load`` plus the tokens of candidates already placed on the node this tick.
  Load in tokens (not the free fraction) is used because it is what the router balances (queued
  work and cached tree size are both token-proportional), while room is already enforced as a
  hard constraint; balancing on the free fraction would count capacity twice;
* the imbalance switch is available with ``balance_abs_tokens`` (tokens, since the snapshot
  has no request counts) and ``balance_rel``, over the loads of the candidate's eligible
  nodes; it is off by default (``None``) because SGLang's
  thresholds are in requests and have no faithful token equivalent.
"""

from __future__ import annotations

from shared.core.policies.base import PlanOptions
from shared.core.policies.routing import route_fcfs
from shared.core.problem import (
    Dense,
    PlanDiagnostics,
    PlanResult,
    Problem,
    densify,
    result_from_choice,
)

DEFAULT_CACHE_THRESHOLD = 0.5
DEFAULT_BALANCE_REL = 1.1


def _imbalanced(loads: list[int], abs_tokens: int | None, rel: float) -> bool:
    if abs_tokens is None or not loads:
        return False
    hi, lo = max(loads), min(loads)
    return hi - lo > abs_tokens and hi > rel * lo


def cache_aware(
    d: Dense,
    problem: Problem,
    *,
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
    balance_abs_tokens: int | None = None,
    balance_rel: float = DEFAULT_BALANCE_REL,
) -> list[int]:
    """Choice vector of the cache-aware router applied FCFS to the pool."""
    del problem  # everything needed is in the dense snapshot

    def pick(i: int, fits: list[int], load: list[int]) -> int:
        ti = int(d.t[i])
        allowed_loads = [load[b] for b in range(d.m) if d.elig[i, b]]
        best_k = max(int(d.k[i, b]) for b in fits)
        by_cache = ti > 0 and best_k > cache_threshold * ti
        if by_cache and not _imbalanced(allowed_loads, balance_abs_tokens, balance_rel):
            return min(fits, key=lambda b: (-int(d.k[i, b]), load[b], b))
        return min(fits, key=lambda b: (load[b], -int(d.k[i, b]), b))

    return route_fcfs(d, pick)


class CacheAwarePolicy:
    """``cache-aware``: most prefix credit above ``cache_threshold``, else least load."""

    name = "cache-aware"

    def __init__(
        self,
        cache_threshold: float = DEFAULT_CACHE_THRESHOLD,
        balance_abs_tokens: int | None = None,
        balance_rel: float = DEFAULT_BALANCE_REL,
    ) -> None:
        if not 0.0 <= cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold: must lie in [0, 1], got {cache_threshold}")
        if balance_abs_tokens is not None and balance_abs_tokens < 0:
            raise ValueError(f"balance_abs_tokens: must be >= 0, got {balance_abs_tokens}")
        self.cache_threshold = cache_threshold
        self.balance_abs_tokens = balance_abs_tokens
        self.balance_rel = balance_rel

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        choice = cache_aware(
            d,
            problem,
            cache_threshold=self.cache_threshold,
            balance_abs_tokens=self.balance_abs_tokens,
            balance_rel=self.balance_rel,
        )
        skipped = tuple(d.cand_ids[i] for i, b in enumerate(choice) if b < 0)
        return result_from_choice(
            d, choice, exact=False, method=self.name, diagnostics=PlanDiagnostics(skipped=skipped)
        )
