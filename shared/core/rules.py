"""TAO's decision rules beyond the paper's placement, each switchable for its ablation.

The full account: docs/internals.md, section ``shared/core/rules.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

__all__ = [
    "ABLATIONS",
    "DEFAULT_RULES",
    "HOLD",
    "PAPER",
    "TaoRules",
    "expected_remaining",
    "growth_reserve",
    "move_cost_s",
    "readmit_horizon_s",
    "recompute_s",
    "release_cost_s",
    "release_net_s",
    "release_worth",
]


@dataclass(frozen=True, slots=True)
class TaoRules:
    """Which of TAO's rules act (module docstring), and their constants.

    ``use_cache`` / ``use_ready`` switch the credit and readiness signals off wherever they
    act: in the planner's values, in the interrupt order and ``r = 1`` protection, and (for
    readiness) in what counts as needing the GPU.
    """

    use_cache: bool = True
    use_ready: bool = True
    cost: bool = True
    """The time cost model (docs/internals.md, "The time a decision saves or costs"): a
    tool-running session's expected remaining time is the mean residual of its tool's history
    (:func:`shared.core.predictor.expected_remaining_s`); the pay-back releases the sessions
    whose release nets the most seconds first (:func:`release_net_s`); the readiness horizon
    of each session is the time its readmission takes (:func:`readmit_horizon_s`). Off: the
    paper's constant horizon, the ``(k, r, t)`` release order and "as long again"."""
    payback: bool = True
    need: bool = True
    hold: bool = True
    growth: bool = True
    aging: bool = False
    stay: bool = True
    evict: bool = True
    demand: bool = True
    payback_context: bool = True
    payback_smallest: bool = False
    readmit: bool = False
    payback_capacity: bool = True
    """The ``payback_context`` trigger's threshold: the node's whole KV capacity (as
    ThunderAgent's accounting, ``backend/state.py``), not capacity × target — the target
    leaves room for growth at *admission*; contexts inside the whole cache lose nothing, so
    paying back above the target only released sessions for no cache the engine needed.
    Off (``tao-payback-usable``): the trigger is capacity × ``TAO_TARGET_UTILISATION``. The
    simulator's nodes run at target 1.0, where the two are the same (docs/evaluation.md (k))."""
    payback_headroom: int = 100
    """Tokens a context is counted above its length by the ``payback_context`` trigger: the
    +100 per program of ThunderAgent's own accounting (``backend/state.py``)."""
    hold_s: float = 2.0
    hold_per_ktoken_s: float = 0.1
    growth_z: float = 2.0
    """Standard deviations of a session's per-turn growth reserved above its mean: 2, chosen
    by the sweep of docs/evaluation.md ("Tool-awareness that pays", defaults) once the shared
    prefix was counted once per node (z = 0 left 90–140 preemptions per run there)."""
    growth_min: int = 256
    growth_max: int = 16_384
    starve_s: float = 300.0
    """``aging``: how long a request waits before it is placed first (``tao-aging``: 300 s;
    ``tao-fair``: 200 s, chosen by the sweep of docs/evaluation.md, "The tail")."""
    starve_clear: bool = False
    """``aging``: a starving request that fits nowhere has a node cleared for it (releases of
    tool-running sessions, ascending value, until it fits)."""
    starve_block: bool = False
    """``starve_clear``: a node cleared for a request that still does not fit (its sessions in a
    model call hold the rest) takes no other admission that round."""
    evict_prefill_s: float = 50e-6
    """Seconds of prefill per recomputed token: ``prefill_b`` of the default engine profile
    (qwen3-32b-tp2: 2·32.8 GFLOP / (2·989 TFLOPS · 0.66 MFU)); deepseek-4xh100's is 26.5 µs."""
    evict_attn_s: float = 2.3e-9
    """Seconds per (recomputed token, context token) pair: the default profile's ``prefill_f``
    (deepseek-4xh100's is 2.7 ns)."""
    evict_requeue_s: float = 0.014
    """The control loop's round trip for the re-admission when the tool returns: debounce, hop,
    value, solve, apply and forward of :class:`shared.sim.des.ControlLatency` (≈ 13.8 ms)."""
    tier: bool = True
    """The host KV tier's pricing (docs/internals.md, "Tiered credit"): a prefix a node's host
    tier holds is credited by the fraction of its recompute its load saves
    (:func:`shared.core.tiers.host_credit`), and releasing or readmitting a session whose
    prefix the host holds costs its load, not its recompute (:func:`release_cost_s`,
    :func:`readmit_horizon_s`). Off (``tao-no-tier``): every tier but the GPU is ignored.
    Acts only on nodes with a host tier (``NodeView.host_load_s_per_token > 0``)."""
    home: bool = True
    """A pooled session whose last node (its *home*) holds more of its prefix than any other
    node (its credit there, over both tiers) and lacks the room for it there (docs/internals.md,
    "Staying home"): first the demand step releases, on that node, the tool-running sessions
    whose release is worth it anyway (:func:`releasable`), cheapest first, where they cover the
    shortfall; where they do not, the session is placed on another node only once it has
    waited there as long as the move costs (:func:`move_cost_s`: the recompute of the credit it
    leaves behind, times the requests it delays), the ski-rental rule: never more than twice
    the better of waiting and moving. Off (``tao-no-home``): the plan moves it as soon as
    another node has the room."""


DEFAULT_RULES: Final = TaoRules()
"""``tao``: the time cost model (``cost``) deciding which tool-running sessions release their
room, for the pool's demand (``demand`` with ``evict``: only where the room is worth the
release) and for a full node's pay-back on contexts (most seconds gained first), and when a
released session is taken back (readiness with a per-session horizon); no aging."""

HOLD: Final = TaoRules(cost=False, evict=False, demand=False, growth_z=0.0, home=False)
"""``tao-hold``: the rules before the cost model (the default until 2026-12-06): pay-back on
contexts in ``(k, r, t)`` order, no release for the pool's demand, the paper's 1 s horizon, the
mean growth reserved (z = 0)."""

PAPER: Final = TaoRules(
    cost=False,
    evict=False,
    payback=False,
    need=False,
    hold=False,
    growth=False,
    aging=False,
    stay=False,
    demand=True,
    payback_context=False,
    home=False,
)
"""``tao-paper``: the paper's round (DESIGN 3.2–3.3) with the over-commit pay-back of commit
32161fe, which protects ``r = 1`` sessions."""

ABLATIONS: Final[dict[str, TaoRules]] = {
    "tao-no-cache": replace(DEFAULT_RULES, use_cache=False),
    "tao-no-ready": replace(DEFAULT_RULES, use_ready=False),
    "tao-no-cost": replace(DEFAULT_RULES, cost=False),
    "tao-hold": HOLD,
    "tao-no-cache-no-ready": replace(DEFAULT_RULES, use_cache=False, use_ready=False),
    "tao-no-payback": replace(DEFAULT_RULES, payback=False),
    "tao-no-need": replace(DEFAULT_RULES, need=False),
    "tao-demand": replace(HOLD, demand=True),
    "tao-no-hold": replace(HOLD, demand=True, hold=False),
    "tao-no-growth": replace(DEFAULT_RULES, growth=False),
    "tao-aging": replace(DEFAULT_RULES, aging=True),
    "tao-no-stay": replace(DEFAULT_RULES, stay=False),
    "tao-paper": PAPER,
    "tao-evict": replace(HOLD, demand=True, hold=False, evict=True),
    "tao-payback-reserved": replace(HOLD, payback_context=False),
    "tao-prev": replace(HOLD, payback_context=False, demand=True),
    "tao-readmit": replace(HOLD, readmit=True),
    "tao-payback-usable": replace(HOLD, payback_capacity=False),
    "tao-no-tier": replace(DEFAULT_RULES, tier=False),
    "tao-no-home": replace(DEFAULT_RULES, home=False),
    "tao-fair": replace(DEFAULT_RULES, aging=True, starve_clear=True, starve_s=200.0),
}
"""Ablation policy name → its rules (each differs from ``tao`` in one rule or signal, but
``tao-paper``, which switches off every rule, and the variants of ``tao-hold``, the rules before
the cost model: ``tao-demand``, ``tao-no-hold``, ``tao-evict``, ``tao-payback-reserved``,
``tao-prev``, ``tao-readmit`` and ``tao-payback-usable`` each differ from ``tao-hold`` in the
rule they name, as they did from the default they were measured against).

``tao-fair`` is the default with a bounded tail (docs/evaluation.md, "The tail"): a request
that has waited 200 s is placed first and, where it fits nowhere, the node with the most free
plus releasable room releases tool-running sessions until it does. It costs mean latency where
the wait is the price of a KV-starved node (+1.8 to +8.5 % on claude-code), so it is named, not
the default."""


def growth_reserve(n: int, mean: float, m2: float, default: int, rules: TaoRules) -> int:
    """Tokens to reserve for the next turn from ``n`` observed per-turn growths (Welford's
    ``mean`` and ``m2``): ``mean + z·sd`` clipped to ``[growth_min, growth_max]``; ``default``
    with fewer than two observations or with the rule off."""
    if not rules.growth or n < 2:
        return default
    sd = (max(m2, 0.0) / (n - 1)) ** 0.5
    est = mean + rules.growth_z * sd
    return int(min(max(est, rules.growth_min), rules.growth_max) + 0.5)


def expected_remaining(predicted_end: float, started_at: float, now: float) -> float:
    """Expected remaining seconds of a running call: until its predicted end, or, once it has
    run past that, as long again as it has run so far (the hold rule's cost horizon)."""
    if now < predicted_end:
        return predicted_end - now
    return max(0.0, now - started_at)


def recompute_s(evicted: int, kept: int, rules: TaoRules) -> float:
    """Seconds of prefill to recompute ``evicted`` tokens after ``kept`` cached ones: the
    profile's ``b`` per token plus ``f`` per attended (token, context token) pair."""
    e, k = max(0, evicted), max(0, kept)
    return e * (rules.evict_prefill_s + rules.evict_attn_s * (k + e / 2))


def _refill(
    tokens: int, kept: int, host_tokens: int, load_s_per_token: float, rules: TaoRules
) -> tuple[float, float]:
    """(recompute seconds, load seconds) to make a ``tokens``-long context usable again when
    its first ``kept`` tokens stay on the GPU and the node's host tier holds its first
    ``host_tokens``: the host covers what it holds beyond ``kept`` (by its load, or by the
    recompute where that is faster), the rest is recomputed."""
    tokens, kept = max(0, tokens), min(max(0, kept), max(0, tokens))
    loaded = 0
    if rules.tier and load_s_per_token > 0.0:
        loaded = max(0, min(tokens, host_tokens) - kept)
    recomputed = tokens - kept - loaded
    load = min(loaded * load_s_per_token, recompute_s(loaded, kept, rules))
    return recompute_s(recomputed, kept + loaded, rules), load


def release_cost_s(
    tokens: int,
    slack: int,
    running: int,
    rules: TaoRules,
    host_tokens: int = 0,
    load_s_per_token: float = 0.0,
) -> float:
    """Expected seconds a release of a ``tokens``-long session costs (the ``evict`` rule):
    the recompute of the tail that the node's unclaimable cache ``slack`` (capacity − reserved −
    free tokens) cannot keep, times the ``1 + running`` requests it delays, plus the re-queue.
    With a host tier (``tier`` rule) the part of that tail the host holds (``host_tokens`` from
    the start) costs its load instead, which delays no other request (vLLM loads without
    stalling a step: docs/kv-tier.md §3)."""
    kept = max(0, tokens) - min(max(0, tokens), max(0, tokens - max(0, slack)))
    rec, load = _refill(tokens, kept, host_tokens, load_s_per_token, rules)
    return (1 + max(0, running)) * rec + load + rules.evict_requeue_s


def move_cost_s(home_credit: int, there_credit: int, running: int, rules: TaoRules) -> float:
    """Expected seconds a session loses by running on a node that holds ``there_credit``
    tokens of credit for it instead of its home, which holds ``home_credit`` (the ``home``
    rule): the recompute of the difference after what the node keeps, times the ``1 + running``
    requests that prefill delays there. Credit is in tokens of recompute saved (a GPU token
    counts whole, a host token by the fraction its load saves: :mod:`shared.core.tiers`), so
    the difference is what the move recomputes that staying would not."""
    gone = max(0, home_credit - there_credit)
    return (1 + max(0, running)) * recompute_s(gone, max(0, there_credit), rules)


def readmit_horizon_s(
    tokens: int, rules: TaoRules, host_tokens: int = 0, load_s_per_token: float = 0.0
) -> float:
    """How long before a released session's call returns it must be taken back so that it
    can run when it does (the ``cost`` rule's readiness horizon): the control loop's round
    trip plus the time to make its whole context usable again (a released prefix is assumed
    gone from the GPU): its load where the host tier holds it, its prefill where not."""
    rec, load = _refill(tokens, 0, host_tokens, load_s_per_token, rules)
    return rules.evict_requeue_s + rec + load


def release_net_s(
    remaining_s: float,
    tokens: int,
    slack: int,
    running: int,
    rules: TaoRules,
    host_tokens: int = 0,
    load_s_per_token: float = 0.0,
) -> float:
    """Seconds a release nets: the room's expected idle time ``remaining_s`` minus
    :func:`release_cost_s` (``inf`` when the remaining time is unknown)."""
    if math.isinf(remaining_s):
        return math.inf
    cost = release_cost_s(tokens, slack, running, rules, host_tokens, load_s_per_token)
    return remaining_s - cost


def release_worth(
    remaining_s: float,
    tokens: int,
    slack: int,
    running: int,
    rules: TaoRules,
    host_tokens: int = 0,
    load_s_per_token: float = 0.0,
) -> bool:
    """Whether the room of a tool-running session is worth more than releasing it costs:
    the release nets seconds (:func:`release_net_s` > 0; always, when the time is unknown)."""
    net = release_net_s(remaining_s, tokens, slack, running, rules, host_tokens, load_s_per_token)
    return net > 0
