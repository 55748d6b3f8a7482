"""The valuation snapshot published each tick on ``tao.v1.valuation.snapshot``.

It is the frozen input of one planning round (DESIGN §3.2): free capacity per node, and per
pooled candidate its weight, values and eligibility, plus the tool-running admitted sessions the
interrupt rule may release (§3.3). Field names follow ``shared.core.problem`` (``id``, ``free``,
``load``, ``weight``, ``tokens``, ``ready``, ``credit``, ``eligible``) so the planner maps a
snapshot to a ``Problem`` field by field. Capacities, weights and credits are in tokens; the
planner discretises them by ``quantum``.

Each candidate carries its :class:`WireSignature`; just before publishing, the planner compares the
signatures of the selected sessions with live state and discards the plan if any differs (§3.4).
"""

from __future__ import annotations

import msgspec

from .base import Message, Record

__all__ = [
    "AdmittedSession",
    "ValuationSnapshot",
    "WireCandidate",
    "WireInterruptCandidate",
    "WireNodeCost",
    "WireNodeView",
    "WireSignature",
]


class WireNodeView(Record, frozen=True, kw_only=True):
    """A node as the planner sees it this tick.

    ``free`` is admissible capacity (capacity × target utilisation − admitted weights), ``load``
    the tokens already reserved (read only by load-aware baselines), ``capacity`` the node's
    KV capacity. Unhealthy nodes stay listed so that the reason a candidate is ineligible shows.
    ``overflow`` is how far the admitted reservations, grown with their sessions' context since
    admission, exceed capacity × target (0 when they fit): the planner releases tool-running
    sessions there first. ``running`` is the requests the node's engine runs (telemetry's
    ``vllm:num_requests_running``); with ``capacity − load − free`` it is the eviction pressure
    that a release rule may weigh. ``pressure`` is how far the admitted sessions'
    contexts, each plus the rule's headroom, exceed capacity × target (0 when they fit, and
    always 0 unless the policy's ``payback_context`` rule is on): what that rule pays back.
    ``used`` is the engine's KV in use, tokens (telemetry's ``vllm:kv_cache_usage_perc`` ×
    capacity) and ``waiting`` the requests queued in the engine
    (``vllm:num_requests_waiting``): ``thunderagent-ideal``'s shared tokens.
    """

    id: str
    free: int
    load: int = 0
    capacity: int = 0
    healthy: bool = True
    overflow: int = 0
    running: int = 0
    pressure: int = 0
    used: int = 0
    waiting: int = 0
    cost: WireNodeCost | None = None
    """The node's prices (``shared.core.nodecost.NodeCost``); ``None``: the default cost."""


class WireNodeCost(Record, frozen=True, kw_only=True):
    """A node's prices, in seconds: prefill per recomputed token (``prefill_s``), attention per
    (recomputed token, context token) pair (``attn_s``), the control loop's round trip for a
    readmission (``requeue_s``), host-tier load per token (``load_s``, 0: no host tier);
    ``source`` is ``profile``, ``measured`` or ``pinned``; ``observed_tokens`` the computed
    prompt tokens a measurement rests on."""

    prefill_s: float
    attn_s: float
    requeue_s: float
    load_s: float = 0.0
    source: str = "profile"
    observed_tokens: int = 0


class WireSignature(Record, frozen=True, kw_only=True):
    """What must be unchanged for a plan about this session to still apply.

    ``version`` increments on every change of the session record; ``eligibility_digest`` is a
    short hash of the candidate's eligible node set, so a node going unhealthy also invalidates.
    """

    session_id: str
    version: int
    eligibility_digest: str = ""


class WireCandidate(Record, frozen=True, kw_only=True):
    """A pooled session that wants admission.

    ``credit`` maps node id → decayed, rounded cache credit k in tokens (absent = 0); ``ready``
    is r ∈ {0, 1}; ``tokens`` is t. ``eligible`` lists the node ids it may go to (``None`` =
    every node). ``phase`` (``reasoning`` | ``new`` | ``acting``) is read only by the
    ``thunderagent`` baseline. ``waiting_since`` (epoch s; its request waits since then) and
    ``home`` (the node it last ran on) are read by TAO's aging and stay rules
    (``shared.core.rules``).
    """

    id: str
    weight: int
    tokens: int
    signature: WireSignature
    ready: int = 0
    credit: dict[str, int] = msgspec.field(default_factory=dict)
    eligible: list[str] | None = None
    phase: str | None = None
    model: str | None = None
    waiting_since: float | None = None
    home: str | None = None


class WireInterruptCandidate(Record, frozen=True, kw_only=True):
    """A tool-running admitted session that the interrupt rule may release from ``node``.

    Ordered for interruption ascending by (``credit`` on its node, ``ready``, ``tokens``);
    sessions with ``ready == 1`` are never interrupted. Releasing it frees ``weight`` tokens.
    ``remaining_s`` is its tool's expected remaining time (``None`` = unknown), which TAO's
    hold rule reads. ``host_tokens``: tokens of its context, from the start, that its node's
    host KV tier holds; ``load_s_per_token``: that node's host-tier load seconds per token (0:
    no host tier); the release rule prices a host-held context by its load (``tier`` rule).
    """

    id: str
    node: str
    weight: int
    tokens: int
    signature: WireSignature
    ready: int = 0
    credit: int = 0
    remaining_s: float | None = None
    host_tokens: int = 0
    load_s_per_token: float = 0.0


class AdmittedSession(Record, frozen=True, kw_only=True):
    """An admitted session outside a tool, read only by the ``thunderagent`` baseline.

    ``activity`` is ``running`` (a model call in flight: ThunderAgent's REASONING) or ``idle``
    (between turns: ACTING, like a session in a tool). ``tokens`` is the last response's total
    (or the pending prompt's estimate); releasing it frees ``weight`` tokens.
    """

    id: str
    node: str
    weight: int
    tokens: int
    activity: str
    signature: WireSignature


class ValuationSnapshot(Message, tag="ValuationSnapshot", frozen=True, kw_only=True):
    """Everything the planner needs for tick ``tick``, valued at time ``now``.

    ``admitted`` lists the admitted sessions outside a tool only when the policy is
    ``thunderagent`` (its pause rule needs every admitted program); ``None`` otherwise.
    """

    tick: int
    now: float
    quantum: int = 512
    nodes: list[WireNodeView] = msgspec.field(default_factory=list)
    candidates: list[WireCandidate] = msgspec.field(default_factory=list)
    interrupt_candidates: list[WireInterruptCandidate] = msgspec.field(default_factory=list)
    admitted: list[AdmittedSession] | None = None
    rules: str = ""
    """The rule set the snapshot was valued under (``shared.core.rules``): the planner decides
    under the same one. Empty: the planner's own policy's."""
