"""Baseline ``kv-aware``: NVIDIA Dynamo's KV router cost, made capacity-safe.

Source: Dynamo ``docs/design_docs/router_design.md`` ("Cost formula: ``cost =
overlap_score_weight * prefill_blocks + decode_blocks``; lower costs indicate better routing
choices") and ``lib/llm/src/kv_router/scheduler.rs`` (``DefaultWorkerSelector``: ``logit =
overlap_score_weight * potential_prefill_block + decode_block``, then ``softmax_sample`` which
at ``router_temperature == 0`` returns the minimum-logit worker). Defaults from
``KvRouterConfig::default()``: ``overlap_score_weight = 1.0``, ``router_temperature = 0.0``.

Here, per candidate in arrival order (FCFS), over the nodes that can take it now (eligible and
with room), the lowest cost wins, ties to the lower node index (Dynamo picks a random minimum;
a baseline must be deterministic, so temperature is fixed at 0 and ties are broken by index):

* ``prefill_blocks = ceil(max(tokens − credit, 0) / block_size)`` — the tokens the node would
  have to prefill, credit being the prefix already resident there;
* ``decode_blocks = ceil((node.load + tokens already placed on the node this tick) /
  block_size)`` — the node's active blocks, updated as this tick places candidates (Dynamo's
  router adds a routed request's blocks to its worker at once).

Dynamo's "potential" decode blocks also count the request's own new blocks; for a pooled
session they are the same on every node (its prefix is cached, not active), so omitting them
changes no decision. When the cheapest node lacks room the choice falls through to the next
cheapest that fits (Dynamo itself never refuses; the engine would queue).
"""

from __future__ import annotations

from shared.core.policies.base import PlanOptions
from shared.core.policies.routing import route_fcfs
from shared.core.problem import (
    Dense,
    PlanDiagnostics,
    PlanResult,
    Problem,
    ceil_div,
    densify,
    result_from_choice,
)

DEFAULT_OVERLAP_SCORE_WEIGHT = 1.0
DEFAULT_BLOCK_SIZE = 16


def kv_cost(
    tokens: int,
    credit: int,
    node_load: int,
    *,
    overlap_score_weight: float = DEFAULT_OVERLAP_SCORE_WEIGHT,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> float:
    """Dynamo's routing cost of one request on one node (lower is better)."""
    prefill_blocks = ceil_div(max(tokens - credit, 0), block_size)
    decode_blocks = ceil_div(max(node_load, 0), block_size)
    return overlap_score_weight * prefill_blocks + decode_blocks


def kv_aware(
    d: Dense,
    problem: Problem,
    *,
    overlap_score_weight: float = DEFAULT_OVERLAP_SCORE_WEIGHT,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> list[int]:
    """Choice vector of Dynamo's KV router (temperature 0) applied FCFS to the pool."""
    del problem  # everything needed is in the dense snapshot

    def pick(i: int, fits: list[int], load: list[int]) -> int:
        def cost(b: int) -> tuple[float, int]:
            c = kv_cost(
                int(d.t[i]),
                int(d.k[i, b]),
                load[b],
                overlap_score_weight=overlap_score_weight,
                block_size=block_size,
            )
            return (c, b)

        return min(fits, key=cost)

    return route_fcfs(d, pick)


TIER_WEIGHTS: dict[str, float] = {"GPU": 1.0, "CPU": 0.8}
"""Credit per resident block by tier, as llm-d's precise prefix-cache scorer weights them (a
host-tier hit is worth 0.8 of a GPU hit; docs/kv-tier.md, "Peers' tier credit")."""


class KvAwarePolicy:
    """``kv-aware``: argmin of ``overlap_score_weight × prefill_blocks + decode_blocks``.

    ``kv-aware-tiered`` is the same router fed a tiered credit: the simulator credits each
    node's GPU-resident prefix at :data:`TIER_WEIGHTS` ``["GPU"]`` and what its host tier holds
    beyond that at ``["CPU"]`` (:meth:`shared.sim.des.Simulator.resident_now`), as llm-d does;
    the routing cost is Dynamo's either way."""

    name = "kv-aware"

    def __init__(
        self,
        overlap_score_weight: float = DEFAULT_OVERLAP_SCORE_WEIGHT,
        block_size: int = DEFAULT_BLOCK_SIZE,
        name: str = "kv-aware",
    ) -> None:
        self.name = name
        if overlap_score_weight < 0:
            raise ValueError(f"overlap_score_weight: must be >= 0, got {overlap_score_weight}")
        if block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {block_size}")
        self.overlap_score_weight = overlap_score_weight
        self.block_size = block_size

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        d = densify(problem)
        choice = kv_aware(
            d,
            problem,
            overlap_score_weight=self.overlap_score_weight,
            block_size=self.block_size,
        )
        skipped = tuple(d.cand_ids[i] for i, b in enumerate(choice) if b < 0)
        return result_from_choice(
            d, choice, exact=False, method=self.name, diagnostics=PlanDiagnostics(skipped=skipped)
        )
