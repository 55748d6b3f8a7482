"""Per-tick valuation terms: weights, free capacity, eligibility, the planner's nodes (DESIGN 3.2).

:func:`shared.core.tick.value_snapshot` values each tick's pool with these small pure
functions (the valuation service and the simulator both call it):

- ``w_i = max(tokens - shared, 0) + reserve`` (:func:`session_weight`): a session that shares
  all of its context still needs the reserve for its next turn, so the weight is ≥ ``reserve``.
- ``C_b = max(0, floor(capacity × target) - Σ admitted weights - shared)`` (:func:`free_capacity`;
  ``shared``: the prefix the node holds once for its sessions, :attr:`NodeView.shared`): an
  over-committed node has no free capacity, never negative capacity. ``target`` is read as the
  decimal it was written as (0.7 means 7/10 exactly), so ``floor`` does not lose a token to
  binary rounding.
- ``e_ib`` (:func:`eligible`): node healthy, serves the session's model, ``w_i <= C_b``.
- ``k_ib``: decayed, rounded credit (:mod:`shared.core.decay`), kept only on eligible nodes;
  ``r_i``: readiness (:mod:`shared.core.readiness`) of the predicted tool end
  (:mod:`shared.core.predictor`); ``t_i``: the session's tokens.

Pure: no clock; ``now`` is an argument.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Final, Literal

from shared.core.decay import DEFAULT_HALF_LIFE_S
from shared.core.nodecost import NodeCost
from shared.core.problem import Node, ProblemError
from shared.core.readiness import (
    DEFAULT_FRESHNESS_S,
    DEFAULT_HORIZON_S,
)

__all__ = [
    "DEFAULT_CREDIT_UNIT",
    "DEFAULT_QUANTUM",
    "DEFAULT_RESERVE",
    "Ineligibility",
    "NodeView",
    "ValuationParams",
    "build_nodes",
    "eligible",
    "free_capacity",
    "ineligibility",
    "session_weight",
]

DEFAULT_RESERVE: Final = 512
"""Tokens reserved for a session's next turn on top of its unshared context."""
DEFAULT_QUANTUM: Final = 512
"""Capacity quantum Δ in tokens."""
DEFAULT_CREDIT_UNIT: Final = 256
"""Credit rounding unit U in tokens (half a default quantum)."""

Ineligibility = Literal["unhealthy", "model", "too-large"]


def session_weight(tokens: int, shared_tokens: int, reserve: int = DEFAULT_RESERVE) -> int:
    """``max(tokens - shared_tokens, 0) + reserve``: the capacity an admission reserves."""
    if tokens < 0 or shared_tokens < 0 or reserve < 0:
        got = f"{tokens}, {shared_tokens}, {reserve}"
        raise ValueError(f"tokens, shared_tokens, reserve: must be >= 0, got {got}")
    return max(tokens - shared_tokens, 0) + reserve


def free_capacity(
    capacity_tokens: int, target_utilisation: float, reserved_weights: Iterable[int]
) -> int:
    """``floor(capacity × target) - Σ reserved``, clamped at 0 when over-committed."""
    if capacity_tokens < 0:
        raise ValueError(f"capacity_tokens: must be >= 0, got {capacity_tokens}")
    if not 0.0 <= target_utilisation <= 1.0:
        raise ValueError(f"target_utilisation: must be in [0, 1], got {target_utilisation}")
    return max(0, _usable(capacity_tokens, float(target_utilisation)) - sum(reserved_weights))


@functools.lru_cache(maxsize=4096)
def _usable(capacity_tokens: int, target_utilisation: float) -> int:
    """``floor(capacity × target)`` with the target read as the decimal it prints as (exact:
    0.9 × 1000 is 900, not 899). Cached: a tick asks it several times per node, and the
    Fraction costs more than the rest of a tick's per-node work."""
    return math.floor(capacity_tokens * Fraction(repr(target_utilisation)))


def ineligibility(
    healthy: bool,
    node_models: frozenset[str] | None,
    session_model: str | None,
    weight: int,
    free: int,
) -> Ineligibility | None:
    """Why a session may not go to a node, or ``None`` when it may.

    ``node_models=None`` means the node serves any model; ``session_model=None`` means the
    session accepts any node. Checked in the order: health, model, size.
    """
    if not healthy:
        return "unhealthy"
    if node_models is not None and session_model is not None and session_model not in node_models:
        return "model"
    if weight > free:
        return "too-large"
    return None


def eligible(
    healthy: bool,
    node_models: frozenset[str] | None,
    session_model: str | None,
    weight: int,
    free: int,
) -> bool:
    """True when the node is healthy, serves the session's model and ``weight <= free``."""
    return ineligibility(healthy, node_models, session_model, weight, free) is None


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the store sees it: ``reserved`` = Σ weights of sessions admitted on it;
    ``running`` the requests its engine runs (telemetry's ``vllm:num_requests_running``);
    ``shared`` the shared prefix held once for its sessions;
    ``contexts`` = Σ tokens of the sessions admitted on it (not ended) and ``held`` how many
    they are (the ``payback_context`` rule's totals, :func:`shared.core.tick.node_pressure`)."""

    id: str
    capacity_tokens: int
    target_utilisation: float = 1.0
    reserved: int = 0
    healthy: bool = True
    models: frozenset[str] | None = None
    running: int = 0
    contexts: int = 0
    held: int = 0
    shared: int = 0
    """Tokens of the shared prefixes held once on the node for the sessions admitted there
    (their weights leave them out: :attr:`shared.core.session.Session.shared`); taken off its
    free capacity."""
    used: int = 0
    """The engine's KV in use, tokens (telemetry's ``used_tokens``: vLLM's
    ``kv_cache_usage_perc`` × capacity); read only by ``thunderagent-ideal``'s shared tokens."""
    waiting: int = 0
    """Requests queued in the engine (telemetry's ``vllm:num_requests_waiting``)."""
    host_load_s_per_token: float = 0.0
    """Seconds per token to load KV from the node's host tier (:class:`shared.core.tiers.HostLink`
    ``.load_s_per_token``); 0: the node has no host tier."""
    cost: NodeCost | None = None
    """The node's prices (:mod:`shared.core.nodecost`): measured from its metrics, pinned by
    the nodes file, or its profile's; ``None``: the default cost. Its ``load_s`` is replaced
    by :attr:`host_load_s_per_token`."""


@dataclass(frozen=True, slots=True)
class ValuationParams:
    """Knobs of one valuation; defaults are DESIGN 3.1–3.2."""

    half_life_s: float = DEFAULT_HALF_LIFE_S
    credit_unit: int = DEFAULT_CREDIT_UNIT
    quantum: int = DEFAULT_QUANTUM
    reserve: int = DEFAULT_RESERVE
    horizon_s: float = DEFAULT_HORIZON_S
    freshness_s: float = DEFAULT_FRESHNESS_S


def build_nodes(nodes: Sequence[NodeView]) -> tuple[Node, ...]:
    """Planner nodes with this tick's free capacity; ``load`` is the reserved tokens."""
    seen: set[str] = set()
    out: list[Node] = []
    for i, nv in enumerate(nodes):
        if nv.id in seen:
            raise ProblemError(f"nodes[{i}].id", f"duplicate node id {nv.id!r}")
        seen.add(nv.id)
        free = free_capacity(nv.capacity_tokens, nv.target_utilisation, (nv.reserved, nv.shared))
        out.append(Node(id=nv.id, free=free, load=nv.reserved))
    return tuple(out)
