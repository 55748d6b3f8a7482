"""The baseline placement policies of DESIGN 3.5, as pure functions on the dense snapshot.

Each ``f(d, problem, ...) -> list[int]`` returns a feasible choice vector (``choice[i]`` = node
index or -1): only eligible pairs, and no node's capacity (in quanta) exceeded. Each Policy class
wraps one and reports ``exact=False`` — baselines prove nothing. ``short-first`` lives in
:mod:`shared.core.heuristics`.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.core.policies.base import Policy
from shared.core.policies.cache_aware import CacheAwarePolicy, cache_aware
from shared.core.policies.kv_aware import KvAwarePolicy, kv_aware, kv_cost
from shared.core.policies.rr import RoundRobinPolicy, round_robin, round_robin_pointer
from shared.core.policies.thunderagent import (
    ThunderAgentPolicy,
    thunderagent,
)

BASELINES: dict[str, Callable[[], Policy]] = {
    RoundRobinPolicy.name: RoundRobinPolicy,
    CacheAwarePolicy.name: CacheAwarePolicy,
    KvAwarePolicy.name: KvAwarePolicy,
    "kv-aware-tiered": lambda: KvAwarePolicy(name="kv-aware-tiered"),
    "thunderagent": ThunderAgentPolicy,
    "thunderagent-ideal": lambda: ThunderAgentPolicy(name="thunderagent-ideal"),
    "thunderagent-decay": lambda: ThunderAgentPolicy(name="thunderagent-decay"),
}
"""Baseline name → factory with the authors' defaults."""

__all__ = [
    "BASELINES",
    "CacheAwarePolicy",
    "KvAwarePolicy",
    "RoundRobinPolicy",
    "ThunderAgentPolicy",
    "cache_aware",
    "kv_aware",
    "kv_cost",
    "round_robin",
    "round_robin_pointer",
    "thunderagent",
]
