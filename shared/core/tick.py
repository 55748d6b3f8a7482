"""One scheduling round, pure: value → interrupt → plan → verify-and-apply (DESIGN 3.2–3.4).

The live services split a round across processes — the valuation service calls
:func:`value_snapshot`, the planner calls :func:`decide` on the snapshot it received, and the
Redis apply script does what :func:`apply_decision` does — and the offline simulator calls the
three in a row on in-memory records. Either way the same code values, interrupts and plans.

Eligibility in the snapshot is health, model and the node's usable capacity (capacity × target,
empty) only (:attr:`TickCandidate.eligible`): whether the weight fits now is decided against the
free capacity the planner actually has, which the interrupt rule may have raised. The signature
digest is over that set, so a node going unhealthy or changing models invalidates plans about
the session, while capacity moving is handled by the apply step's longest-prefix rule instead.

Pure: ``now`` / ``at`` are arguments.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from shared.core.decay import decayed_credits
from shared.core.interrupt import InterruptCandidate
from shared.core.nodecost import DEFAULT_COST, NodeCost
from shared.core.policies.base import PlanOptions, Policy
from shared.core.predictor import History, expected_remaining_s, predict_end
from shared.core.readiness import ReadinessState, readiness
from shared.core.round import Decision, Move, RoundRecord, needs_gpu
from shared.core.round import decide as decide_round
from shared.core.rules import PAPER, RuleSet, expected_remaining, growth_reserve, rule_set
from shared.core.session import Session, admit, release
from shared.core.signature import set_digest
from shared.core.snapshot import TickCandidate, TickSnapshot
from shared.core.tiers import tiered_credits
from shared.core.valuation import (
    Ineligibility,
    NodeView,
    ValuationParams,
    build_nodes,
    free_capacity,
    ineligibility,
    session_weight,
)

__all__ = [
    "Applied",
    "Decision",
    "Move",
    "Residency",
    "RoundRecord",
    "TickCandidate",
    "TickSnapshot",
    "apply_decision",
    "context_pressure",
    "decide",
    "live_digest",
    "live_eligible",
    "live_free",
    "needs_gpu",
    "node_costs",
    "node_pressure",
    "policy_rules",
    "skip_reason",
    "usable_capacity",
    "value_snapshot",
]

_PARAMS = ValuationParams()
_OPTIONS = PlanOptions()

Residency = Mapping[str, Mapping[str, tuple[int, float]]]
"""session id → node id → ``(k0, t_obs)``: resident prefix tokens last observed, and when."""

HostResidency = Mapping[str, Mapping[str, int]]
"""session id → node id → tokens of the session's context, from its start, that the node's host
KV tier holds now (:mod:`shared.core.tiers`)."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What the verify-and-apply step did.

    ``discarded`` with ``changed`` naming the sessions whose version (or target node, or
    eligible set: :func:`apply_decision`) moved, or ``fenced`` when the plan came from a
    deposed leader (an older epoch than the store's); otherwise ``interrupted`` and the
    applied ``admitted`` prefix, ``truncated`` when live capacity cut the plan short.
    ``sessions`` holds the updated records.
    """

    discarded: bool
    changed: tuple[str, ...] = ()
    fenced: bool = False
    interrupted: tuple[Move, ...] = ()
    admitted: tuple[Move, ...] = ()
    truncated: bool = False
    sessions: Mapping[str, Session] = field(default_factory=dict)


def live_free(nodes: Sequence[NodeView]) -> dict[str, int]:
    """Room per healthy node for the apply step: ``usable - reserved``, negative while grown
    reservations over-commit the node, so that the room an interrupt frees there first pays
    the overflow back (unhealthy nodes are absent: nothing may go there)."""
    return {nv.id: usable_capacity(nv) - nv.reserved - nv.shared for nv in nodes if nv.healthy}


def live_eligible(nodes: Sequence[NodeView], model: str | None, weight: int) -> frozenset[str]:
    """The nodes a session of ``model`` reserving ``weight`` may go to: healthy, serving the
    model, usable capacity at least ``weight`` (:attr:`TickCandidate.eligible`'s rule)."""
    return frozenset(
        nv.id
        for nv in nodes
        if ineligibility(nv.healthy, nv.models, model, weight, usable_capacity(nv)) is None
    )


def live_digest(nodes: Sequence[NodeView], model: str | None, weight: int) -> str:
    """The eligibility digest of :func:`live_eligible` (what an admit's ``digest`` must equal
    at apply time; ``lua/apply.lua`` computes the same)."""
    return set_digest(live_eligible(nodes, model, weight))


def value_snapshot(
    sessions: Iterable[Session],
    nodes: Sequence[NodeView],
    residency: Residency,
    history: History,
    now: float,
    *,
    tick: int = 0,
    params: ValuationParams = _PARAMS,
    rules: RuleSet = PAPER,
    host: HostResidency | None = None,
) -> TickSnapshot:
    """Value the pool and the interrupt candidates at ``now`` (DESIGN 3.1–3.3).

    Each node's prices are its view's ``cost`` (:func:`node_costs`); they travel in the
    snapshot with the rule set's name, so the round prices as the valuation did.

    ``host``: what each node's host KV tier holds of each session (none: no host tier). Under
    the ``tier`` rule it adds the host credit of :func:`tiered_credits` and prices releases
    and readmissions by the load (:mod:`shared.core.nodecost`).

    ``rules`` decide the candidates' reservation (the growth rule); every other rule acts in
    :func:`decide`, which reads what the snapshot carries for them (the wait, the last node,
    each tool's expected remaining time)."""
    planned = tuple(
        nd if nv.healthy else replace(nd, free=0)
        for nv, nd in zip(nodes, build_nodes(nodes), strict=True)
    )
    usable = {nv.id: usable_capacity(nv) for nv in nodes}
    q = max(1, params.quantum)
    largest = max(usable.values(), default=0) // q * q  # what the planner's quanta can place
    overflow = {b: -room for b, room in live_free(nodes).items() if room < 0}
    sessions = list(sessions)
    healthy = {nv.id for nv in nodes if nv.healthy}
    cands: list[TickCandidate] = []
    inter: list[InterruptCandidate] = []
    versions: dict[str, int] = {}
    marks: dict[str, float | None] = {}
    skipped: dict[str, str] = {}

    costs = node_costs(nodes)
    tier = "tier" in rules
    load_rate = {b: c.load_s for b, c in costs.items()} if tier else {}
    hosted = host if host is not None and any(load_rate.values()) else {}
    slowest = max(costs.values(), key=lambda c: (c.prefill_s, c.attn_s), default=DEFAULT_COST)

    def credits_of(sid: str) -> dict[str, int]:
        gpu = residency.get(sid, {})
        credits = decayed_credits(gpu, now, half_life_s=params.half_life_s, unit=params.credit_unit)
        on_host = hosted.get(sid)
        if on_host:
            credits = tiered_credits(credits, gpu, on_host, costs, params.credit_unit)
        return credits

    def host_of(sid: str, node: str | None) -> tuple[int, float]:
        if node is None:
            return 0, 0.0
        return hosted.get(sid, {}).get(node, 0), load_rate.get(node, 0.0)

    for s in sessions:
        if s.ended:
            continue
        pooled = s.pooled
        in_tool = s.node is not None and (
            s.activity == "tool" or (s.activity == "idle" and s.node not in healthy)
        )  # an idle session on a dead node: listed to be released (stranded)
        if not pooled and not in_tool:
            continue
        pred = None if s.tool is None else predict_end(s.tool.view(), history, now)
        where = s.node if in_tool else s.home
        host_tokens, load_s = host_of(s.id, where)
        horizon = (
            costs.get(where or "", slowest).readmit_s(s.tokens, host_tokens, tier)
            if "cost" in rules
            else params.horizon_s
        )
        r = readiness(
            ReadinessState(pred, s.probe_mark),
            now,
            horizon_s=horizon,
            freshness_s=params.freshness_s,
        )
        marks[s.id] = r.probe_mark
        versions[s.id] = s.version
        if in_tool:
            node = s.node
            assert node is not None
            credits = credits_of(s.id)
            if pred is None or s.tool is None:
                remaining = math.inf
            elif "cost" in rules:  # the mean residual of its history (shared.core.predictor)
                remaining = expected_remaining_s(s.tool.view(), history, now, pred)
            else:
                remaining = expected_remaining(pred.predicted_end, s.tool.started_at, now)
            inter.append(
                InterruptCandidate(
                    id=s.id,
                    node=node,
                    weight=s.weight,
                    credit=credits.get(node, 0),
                    ready=r.r,
                    tokens=s.tokens,
                    remaining_s=0.0 if pred is not None and pred.observed else remaining,
                    host_tokens=host_tokens,
                    load_s_per_token=load_s,
                )
            )
            continue
        weight = session_weight(s.tokens, s.shared, params.reserve)
        if "growth" in rules:  # never so large that it fits nowhere the fixed reserve would fit
            reserve = growth_reserve(s.growth_n, s.growth_mean, s.growth_m2, params.reserve, rules)
            weight = max(weight, min(session_weight(s.tokens, s.shared, reserve), largest))
        why = [ineligibility(nv.healthy, nv.models, s.model, weight, usable[nv.id]) for nv in nodes]
        ok = frozenset(nv.id for nv, no in zip(nodes, why, strict=True) if no is None)
        # the credit on the nodes it may go to (none to value where it fits nowhere)
        credits = credits_of(s.id) if ok else {}
        if not ok:
            skipped[s.id] = skip_reason(why)
        cands.append(
            TickCandidate(
                id=s.id,
                version=s.version,
                weight=weight,
                tokens=s.tokens,
                ready=r.r,
                credit={b: k for b, k in credits.items() if b in ok and k > 0},
                eligible=ok,
                digest=set_digest(ok),
                phase=s.phase,
                rule=r.rule,
                waiting_since=s.waiting_since if s.activity == "waiting" else None,
                home=s.home,
            )
        )
    return TickSnapshot(
        tick=tick,
        now=now,
        quantum=params.quantum,
        nodes=planned,
        candidates=tuple(cands),
        interrupts=tuple(inter),
        versions=versions,
        probe_marks=marks,
        overflow=overflow,
        capacity={nv.id: nv.capacity_tokens for nv in nodes if nv.capacity_tokens > 0},
        running={nv.id: nv.running for nv in nodes if nv.running > 0},
        pressure=(
            context_pressure(sessions, nodes, rules.payback_headroom, full=True)
            if "payback" in rules
            else {}
        ),
        unhealthy=frozenset(nv.id for nv in nodes if not nv.healthy),
        costs=costs,
        rules=rules.name,
        skipped=skipped,
    )


def skip_reason(why: Iterable[Ineligibility | None]) -> str:
    """Why a session fits on no node, from each node's :func:`ineligibility` of it."""
    return "+".join(sorted({r for r in why if r is not None})) or "no nodes"


def context_pressure(
    sessions: Iterable[Session], nodes: Sequence[NodeView], headroom: int, *, full: bool = False
) -> dict[str, int]:
    """Per healthy node, how far the contexts of the sessions admitted there (each counted
    ``headroom`` tokens above its length, its shared prefix once per node: the largest
    :attr:`~shared.core.session.Session.shared` there) exceed its usable capacity (``full``:
    its whole KV capacity); only nodes where they do. ``sessions`` must hold every admitted
    session (a pooled one counts nowhere)."""
    held: dict[str, int] = {}
    once: dict[str, int] = {}
    for s in sessions:
        if not s.ended and s.node is not None:
            shared = min(s.shared, s.tokens)
            held[s.node] = held.get(s.node, 0) + s.tokens - shared + headroom
            once[s.node] = max(once.get(s.node, 0), shared)
    for b, tokens in once.items():  # the shared prefix, held once
        held[b] += tokens
    out: dict[str, int] = {}
    for nv in nodes:
        over = held.get(nv.id, 0) - (nv.capacity_tokens if full else usable_capacity(nv))
        if nv.healthy and over > 0:
            out[nv.id] = over
    return out


def node_pressure(
    nodes: Sequence[NodeView], headroom: int, *, full: bool = False
) -> dict[str, int]:
    """:func:`context_pressure` from the nodes' own totals (``contexts`` + ``headroom`` ×
    ``held``: the store keeps them beside ``reserved``), without the sessions: the same
    result when the totals count every admitted session."""
    out: dict[str, int] = {}
    for nv in nodes:
        cap = nv.capacity_tokens if full else usable_capacity(nv)
        over = nv.contexts + headroom * nv.held - cap
        if nv.held > 1 and nv.shared > 0:  # the prefix the sessions share, counted once
            over -= (nv.held - 1) * nv.shared
        if nv.healthy and over > 0:
            out[nv.id] = over
    return out


def usable_capacity(nv: NodeView) -> int:
    """The most a session may ever reserve on ``nv``: its capacity × target, empty."""
    return free_capacity(nv.capacity_tokens, nv.target_utilisation, ())


def policy_rules(policy: Policy) -> RuleSet:
    """The rules a policy plans under: its ``rules`` attribute, else the paper's round."""
    rules = getattr(policy, "rules", None)
    return rules if isinstance(rules, RuleSet) else PAPER


def node_costs(nodes: Sequence[NodeView]) -> dict[str, NodeCost]:
    """Each node's prices: its view's ``cost`` (measured, pinned or its profile's), else the
    default cost, with the node's host-tier load rate."""
    out: dict[str, NodeCost] = {}
    for nv in nodes:
        cost = nv.cost if nv.cost is not None else DEFAULT_COST
        if cost.load_s != nv.host_load_s_per_token:
            cost = replace(cost, load_s=nv.host_load_s_per_token)
        out[nv.id] = cost
    return out


def decide(
    snapshot: TickSnapshot,
    policy: Policy,
    options: PlanOptions = _OPTIONS,
    rules: RuleSet | None = None,
) -> Decision:
    """One priced round on ``snapshot`` (:func:`shared.core.round.decide`) under ``rules``:
    by default the rule set the snapshot was valued under (its name), else the policy's."""
    if rules is None:
        own = policy_rules(policy)
        rules = own if snapshot.rules in ("", own.name) else rule_set(snapshot.rules)
    return decide_round(snapshot, policy, options, rules)


def apply_decision(
    decision: Decision,
    live: Mapping[str, Session],
    free: Mapping[str, int],
    at: float,
    *,
    nodes: Sequence[NodeView] | None = None,
) -> Applied:
    """Verify-and-apply against live state (DESIGN 3.4); the Redis script mirrors this.

    The whole decision is discarded when any session it names has a different version now,
    or an admit's target node is no longer healthy (absent from ``free``), or an admit's
    candidate signature no longer holds: its ``digest`` differs from :func:`live_digest` of
    the session on ``nodes`` (the live node views ``free`` was taken from: a node went
    unhealthy or came back, stopped or started serving the session's model, or its usable
    capacity moved across the admit's weight). ``changed`` names the sessions in that order:
    version first (interrupts, then admits), then target node, then eligible set, each once.
    Admits without a digest, and every admit when ``nodes`` is None (a caller that sees no
    node views), skip the eligibility check. Otherwise the interrupts are applied (their room
    is freed), then the longest prefix of the admits that live free capacity admits, in plan
    order.
    """
    changed: list[str] = []
    for m in (*decision.interrupts, *decision.admits):
        s = live.get(m.session)
        if s is None or s.version != m.version:
            changed.append(m.session)
    changed.extend(m.session for m in decision.admits if m.node not in free)
    if nodes is not None:
        digests: dict[tuple[str | None, int], str] = {}
        for m in decision.admits:
            s = live.get(m.session)
            if not m.digest or s is None:
                continue
            key = (s.model, m.weight)
            if key not in digests:
                digests[key] = live_digest(nodes, s.model, m.weight)
            if digests[key] != m.digest:
                changed.append(m.session)
    if changed:
        return Applied(discarded=True, changed=tuple(dict.fromkeys(changed)))
    room = dict(free)
    out: dict[str, Session] = {}
    for m in decision.interrupts:
        out[m.session] = release(live[m.session], at)
        room[m.node] = room.get(m.node, 0) + m.weight
    admitted: list[Move] = []
    truncated = False
    for m in decision.admits:
        if m.weight > room[m.node]:
            truncated = True
            break
        room[m.node] -= m.weight
        out[m.session] = admit(live[m.session], m.node, m.weight, at)
        admitted.append(m)
    return Applied(
        discarded=False,
        interrupted=decision.interrupts,
        admitted=tuple(admitted),
        truncated=truncated,
        sessions=out,
    )
