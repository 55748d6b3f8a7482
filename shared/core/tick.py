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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from shared.core.decay import decayed_credits
from shared.core.interrupt import (
    InterruptCandidate,
    interrupt_key,
    select_interrupts,
    select_releases,
)
from shared.core.policies.base import PlanOptions, Policy
from shared.core.predictor import History, expected_remaining_s, predict_end
from shared.core.problem import Candidate, Node, Phase, PlanResult, Problem
from shared.core.readiness import ReadinessState, readiness
from shared.core.rules import (
    PAPER,
    TaoRules,
    expected_remaining,
    growth_reserve,
    move_cost_s,
    readmit_horizon_s,
    release_net_s,
    release_worth,
)
from shared.core.session import Session, admit, release
from shared.core.signature import set_digest
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
    "TickCandidate",
    "TickSnapshot",
    "apply_decision",
    "context_pressure",
    "decide",
    "live_digest",
    "live_eligible",
    "live_free",
    "needs_gpu",
    "node_pressure",
    "policy_rules",
    "releasable",
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
class TickCandidate:
    """A pooled session valued for this tick; ``eligible`` = healthy nodes serving its model
    whose usable capacity could hold its weight."""

    id: str
    version: int
    weight: int
    tokens: int
    ready: int
    credit: Mapping[str, int]
    eligible: frozenset[str]
    digest: str
    phase: Phase
    rule: str = ""
    waiting_since: float | None = None
    home: str | None = None


@dataclass(frozen=True, slots=True)
class TickSnapshot:
    """Everything the planner needs for one round (the core form of ``ValuationSnapshot``).

    ``nodes`` carry ``free`` (capacity × target − reserved; 0 when unhealthy) and ``load``;
    ``overflow`` maps a healthy node to the tokens its reservations exceed capacity × target
    by (admitted sessions' reservations grow with their context after admission, so a node
    can end up over-committed without any admission doing it); ``interrupts`` are admitted
    sessions in a tool with their value on their node.
    ``probe_marks`` are the readiness probe marks the caller persists (DESIGN 3.1 rule 2).
    ``capacity`` (KV tokens) and ``running`` (requests on the engine) per node are what the
    ``evict`` rule reads of a node's eviction pressure (absent: no unclaimed cache, no batch).
    ``pressure`` maps a healthy node to the tokens its admitted sessions' *contexts* (each plus
    the ``payback_headroom``) exceed capacity × target by: what the ``payback_context`` rule
    pays back (filled only under that rule). ``unhealthy`` are the nodes nothing may be placed
    on; the admitted sessions there that are not in a model call (in a tool, or idle) are
    listed in ``interrupts`` too, and :func:`decide` releases them all (:attr:`stranded`).
    """

    tick: int
    now: float
    quantum: int
    nodes: tuple[Node, ...]
    candidates: tuple[TickCandidate, ...]
    interrupts: tuple[InterruptCandidate, ...] = ()
    versions: Mapping[str, int] = field(default_factory=dict)
    probe_marks: Mapping[str, float | None] = field(default_factory=dict)
    overflow: Mapping[str, int] = field(default_factory=dict)
    capacity: Mapping[str, int] = field(default_factory=dict)
    running: Mapping[str, int] = field(default_factory=dict)
    pressure: Mapping[str, int] = field(default_factory=dict)
    unhealthy: frozenset[str] = frozenset()
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Why each candidate eligible on no node is so (the planner skips it): ``no nodes``, or
    the nodes' :func:`~shared.core.valuation.ineligibility` reasons joined by ``+`` (e.g.
    ``model+too-large``). For the valuation's log line; nothing plans by it."""

    @property
    def stranded(self) -> tuple[InterruptCandidate, ...]:
        """Interrupt candidates on a node that is unhealthy or no longer listed."""
        listed = {nd.id for nd in self.nodes}
        return tuple(c for c in self.interrupts if c.node in self.unhealthy or c.node not in listed)


@dataclass(frozen=True, slots=True)
class Move:
    """One decision about one session: admit it on (or interrupt it from) ``node``.

    ``digest`` (admits of :func:`decide` only) is the candidate's eligibility digest from the
    snapshot (:attr:`TickCandidate.digest`), which :func:`apply_decision` compares with the
    live one; empty (interrupts, ThunderAgent's resumes) means no eligibility check."""

    session: str
    node: str
    weight: int
    version: int
    digest: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """The planner's output for a snapshot: interrupts first, then admits in plan order."""

    tick: int
    interrupts: tuple[Move, ...]
    admits: tuple[Move, ...]
    result: PlanResult
    demand: int = 0
    free: int = 0
    released_by: tuple[tuple[str, int], ...] = ()
    """How many of ``interrupts`` each step released: ``payback`` (over-committed nodes),
    ``aging`` (cleared for a starving session), ``demand`` (the pool's demand)."""


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
    rules: TaoRules = PAPER,
    host: HostResidency | None = None,
) -> TickSnapshot:
    """Value the pool and the interrupt candidates at ``now`` (DESIGN 3.1–3.3).

    ``host``: what each node's host KV tier holds of each session (none: no host tier). Under
    the ``tier`` rule it adds the host credit of :func:`tiered_credits` and prices releases
    and readmissions by the load (:mod:`shared.core.rules`).

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

    load_rate = {nv.id: nv.host_load_s_per_token for nv in nodes} if rules.tier else {}
    hosted = host if host is not None and any(load_rate.values()) else {}

    def credits_of(sid: str) -> dict[str, int]:
        gpu = residency.get(sid, {})
        credits = decayed_credits(gpu, now, half_life_s=params.half_life_s, unit=params.credit_unit)
        on_host = hosted.get(sid)
        if on_host:
            credits = tiered_credits(credits, gpu, on_host, load_rate, rules, params.credit_unit)
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
        host_tokens, load_s = host_of(s.id, s.node if in_tool else s.home)
        horizon = (
            readmit_horizon_s(s.tokens, rules, host_tokens, load_s)
            if rules.cost
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
            elif rules.cost:  # the mean residual of its history (shared.core.predictor)
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
        if rules.growth:  # never so large that it fits nowhere the fixed reserve would fit
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
            context_pressure(sessions, nodes, rules.payback_headroom, full=rules.payback_capacity)
            if rules.payback_context
            else {}
        ),
        unhealthy=frozenset(nv.id for nv in nodes if not nv.healthy),
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


def policy_rules(policy: Policy) -> TaoRules:
    """The rules a policy plans under: its ``rules`` attribute, else the paper's round."""
    rules = getattr(policy, "rules", None)
    return rules if isinstance(rules, TaoRules) else PAPER


def _ablated(snapshot: TickSnapshot, rules: TaoRules) -> TickSnapshot:
    """The snapshot with the credit or readiness signal switched off everywhere it acts."""
    if rules.use_cache and rules.use_ready:
        return snapshot
    cands = tuple(
        replace(
            c,
            credit=c.credit if rules.use_cache else {},
            ready=c.ready if rules.use_ready else 0,
        )
        for c in snapshot.candidates
    )
    inter = tuple(
        replace(
            ic,
            credit=ic.credit if rules.use_cache else 0,
            ready=ic.ready if rules.use_ready else 0,
            remaining_s=ic.remaining_s if rules.use_ready else 0.0,  # tool-blind: none known
        )
        for ic in snapshot.interrupts
    )
    return replace(snapshot, candidates=cands, interrupts=inter)


def needs_gpu(c: TickCandidate) -> bool:
    """A pooled session that will use the GPU now: a request is pending, or ``r = 1``."""
    return c.phase != "acting" or c.ready == 1


def hold_threshold(ic: InterruptCandidate, rules: TaoRules) -> float:
    """The expected remaining tool time below which the hold rule keeps ``ic`` admitted."""
    return rules.hold_s + rules.hold_per_ktoken_s * ic.tokens / 1000.0


def releasable(ic: InterruptCandidate, snapshot: TickSnapshot, rules: TaoRules) -> bool:
    """Whether the demand step may release ``ic``: with ``evict`` when its room is worth the
    release's expected cost on its node (:func:`shared.core.rules.release_worth`; the cache no
    reservation can claim is ``capacity − reserved − free``, since the demand step releases
    only when the pool's demand exceeds every node's free room, which it then fills), else with
    ``hold`` when its tool will run :func:`hold_threshold` longer, else always. Under the
    cost model nothing of the released prefix is counted as kept (``slack = 0``): the pool
    that takes the room prefills into the node's cache, whose LRU evicts the idle released
    blocks first, so the release costs the whole context's recompute, as a pay-back's does."""
    if rules.evict:
        slack = 0 if rules.cost else _slack(snapshot, ic.node)
        running = snapshot.running.get(ic.node, 0)
        return release_worth(
            ic.remaining_s,
            ic.tokens,
            slack,
            running,
            rules,
            ic.host_tokens,
            ic.load_s_per_token,
        )
    if rules.hold:
        return ic.remaining_s >= hold_threshold(ic, rules)
    return True


def _slack(snapshot: TickSnapshot, node: str) -> int:
    """The cache on ``node`` no reservation can claim once the pool takes the free room:
    ``capacity − reserved − free`` (the ``evict`` rule)."""
    nd = next((nd for nd in snapshot.nodes if nd.id == node), None)
    claimed = 0 if nd is None else nd.load + nd.free  # the pool takes the free room too
    return snapshot.capacity.get(node, 0) - claimed


def decide(
    snapshot: TickSnapshot,
    policy: Policy,
    options: PlanOptions = _OPTIONS,
    rules: TaoRules | None = None,
) -> Decision:
    """Interrupts, then the policy on the room the pool actually has (DESIGN 3.2–3.3, and
    the rules of :mod:`shared.core.rules`; ``rules`` default to the policy's own).

    0. *Evacuation*: every session admitted on an unhealthy (or unlisted) node and not in a
       model call is released (:attr:`TickSnapshot.stranded`), whatever the policy's rules.
    1. *Pay-back*: on every over-committed node, tool-running sessions are released in
       ascending value order until the reservations fit (``payback``: whatever their
       readiness; else ``r = 1`` is protected); with ``payback_context`` instead only where
       the contexts themselves (each plus ``payback_headroom``) exceed the usable capacity,
       until they fit. Any release's room pays a node's over-commit back before it is free.
    2. *Aging* (``aging``): sessions whose request has waited ``starve_s`` are placed first,
       oldest first, each on the eligible node where it fits with the most credit (its last
       node, then the most room, on ties); one that fits nowhere clears the node where free
       plus releasable room is largest, and that node takes no other admission this round.
    3. *Demand*: while the pool's demand exceeds the free room, tool-running sessions are
       released lowest value first (``r = 1`` protected). With ``need`` only sessions that will
       use the GPU now count as demand and only they are placed; with ``hold`` a session is
       released only when its tool is expected to run at least :func:`hold_threshold` longer;
       with ``evict`` instead only when its room is worth the release (:func:`releasable`).
       With ``home`` the demand of a session whose last node holds the most of its prefix is
       met there first, by the releasable sessions of that node (:meth:`_Round.release_home`).
    4. The policy places the pool on the free room; with ``stay`` an admitted session goes to
       its last node instead of a node of equal value when the room there allows; with
       ``home`` a session whose last node holds the most of its prefix but lacks the room may
       go elsewhere only once it has waited as long as the move costs
       (:func:`shared.core.rules.move_cost_s`).
    """
    rules = policy_rules(policy) if rules is None else rules
    snapshot = _ablated(snapshot, rules)
    rnd = _Round(snapshot, rules)
    # 0. Sessions admitted on a node that died: released, so their next request is placed
    #    on a healthy node (an engine that is unreachable or frozen serves nobody).
    rnd.take((c.id for c in snapshot.stranded), "evacuate")
    rnd.pay_back()
    pool = (
        [c for c in snapshot.candidates if needs_gpu(c)]
        if rules.need
        else list(snapshot.candidates)
    )
    early: list[Move] = []
    if rules.aging:
        early = rnd.age(pool)
        placed = {m.session for m in early}
        pool = [c for c in pool if c.id not in placed]
    demand = sum(c.weight for c in pool)
    total_free = sum(rnd.free.values())
    if pool and rules.demand and rules.home:
        rnd.release_home(pool)
    if pool and rules.demand:
        rnd.release_for(demand)
    free = rnd.free
    for b in rnd.blocked:
        free[b] = 0
    result = policy.plan(rnd.problem(pool), options)
    by_id = {c.id: c for c in snapshot.candidates}
    admits = [
        Move(
            a.session,
            a.node,
            by_id[a.session].weight,
            snapshot.versions[a.session],
            by_id[a.session].digest,
        )
        for a in result.assignments
    ]
    if rules.stay:
        admits = _stay_home(admits, {c.id: c for c in pool}, free)
    if rules.readmit and rules.need:
        admits += _readmit_home(admits, snapshot, free)
    return Decision(
        tick=snapshot.tick,
        interrupts=tuple(rnd.interrupts),
        admits=(*early, *admits),
        result=result,
        demand=demand,
        free=total_free,
        released_by=tuple(sorted(rnd.released.items())),
    )


class _Round:
    """The room and the releases of one :func:`decide` round, step by step."""

    def __init__(self, snapshot: TickSnapshot, rules: TaoRules) -> None:
        self.snapshot = snapshot
        self.rules = rules
        self.free = {nd.id: nd.free for nd in snapshot.nodes}
        self.interrupts: list[Move] = []
        self.by_id = {c.id: c for c in snapshot.interrupts}
        self.chosen: set[str] = set()
        self.released: dict[str, int] = {}
        self.debt = {b: over for b, over in snapshot.overflow.items() if over > 0}
        self.blocked: set[str] = set()
        """Nodes cleared for a starving session that fits there only later: no admission."""

    def take(self, ids: Iterable[str], step: str) -> None:
        """Release ``ids`` (interrupt candidates), counted under ``step``."""
        for sid in ids:
            ic = self.by_id[sid]
            self.chosen.add(sid)
            self.interrupts.append(Move(sid, ic.node, ic.weight, self.snapshot.versions[sid]))
            self.released[step] = self.released.get(step, 0) + 1

    def freed(self, node: str, tokens: int) -> None:
        """Room a release freed on ``node``: it pays the node's over-commit back first."""
        paid = min(tokens, self.debt.get(node, 0))
        if paid:
            self.debt[node] -= paid
        if node in self.free:
            self.free[node] += tokens - paid

    def net_key(self) -> Callable[[InterruptCandidate], tuple[object, ...]]:
        """The cost model's release order (``cost``): most seconds a release nets first
        (:func:`shared.core.rules.release_net_s`: expected idle time of the room minus the
        recompute and re-queue it causes; nothing of a released prefix is counted as kept, as
        :func:`releasable` reads it), then the ``(k, r, t)`` order on ties."""
        snapshot, rules = self.snapshot, self.rules

        def key(ic: InterruptCandidate) -> tuple[object, ...]:
            running = snapshot.running.get(ic.node, 0)
            net = release_net_s(
                ic.remaining_s, ic.tokens, 0, running, rules, ic.host_tokens, ic.load_s_per_token
            )
            return (-net, *interrupt_key(ic))

        return key

    def pay_back(self) -> None:
        """1. Over-committed nodes first: on reservations, or (``payback_context``) on
        contexts."""
        snapshot, rules = self.snapshot, self.rules
        owed = snapshot.pressure if rules.payback_context else self.debt
        for node, need in sorted(owed.items()):
            on_node = [c for c in snapshot.interrupts if c.node == node]
            if need <= 0 or not on_node:
                continue
            if rules.payback_context:  # what a release frees of the contexts: tokens + headroom
                on_node = [replace(c, weight=c.tokens + rules.payback_headroom) for c in on_node]
                if rules.payback_smallest:  # value order without credit and readiness: by tokens
                    on_node = [replace(c, credit=0, ready=0) for c in on_node]
            key = self.net_key() if rules.cost else interrupt_key
            if rules.payback:
                first = select_releases(on_node, need, key)
            else:
                first = select_interrupts(on_node, need, 0, key=key)
            self.take(first.interrupt, "payback")
            for sid in first.interrupt:
                self.freed(node, self.by_id[sid].weight)

    def age(self, pool: Sequence[TickCandidate]) -> list[Move]:
        """2. Sessions waiting too long go first: their admissions, oldest first."""
        snapshot, rules, free, blocked = self.snapshot, self.rules, self.free, self.blocked
        starving = sorted(
            (
                c
                for c in pool
                if c.waiting_since is not None and snapshot.now - c.waiting_since >= rules.starve_s
            ),
            key=lambda c: (c.waiting_since, c.id),
        )
        early: list[Move] = []
        for c in starving:
            room = [
                b for b in sorted(c.eligible) if b not in blocked and c.weight <= free.get(b, 0)
            ]
            if not room and not rules.starve_clear:
                continue
            if not room:
                target = _clear_for(c, snapshot.interrupts, self.chosen, free, blocked)
                if target is None:
                    continue
                node, release_ids = target
                self.take(release_ids, "aging")
                for sid in release_ids:
                    self.freed(node, self.by_id[sid].weight)
                if c.weight > free[node]:
                    if rules.starve_block:
                        blocked.add(node)  # room accumulates here for the starving session
                    continue
                room = [node]
            node = max(room, key=lambda b: (c.credit.get(b, 0), b == c.home, free[b], b))
            free[node] -= c.weight
            early.append(Move(c.id, node, c.weight, snapshot.versions[c.id], c.digest))
        return early

    def release_for(self, demand: int) -> None:
        """3. The pool's demand (DESIGN 3.3), from the sessions not released above."""
        snapshot, blocked = self.snapshot, self.blocked
        rest = [
            c
            for c in snapshot.interrupts
            if c.id not in self.chosen
            and c.node not in blocked
            and releasable(c, snapshot, self.rules)
        ]
        second = select_interrupts(
            rest,
            demand,
            sum(v for b, v in self.free.items() if b not in blocked),
            key=self.net_key() if self.rules.cost else interrupt_key,
        )
        self.take(second.interrupt, "demand")
        for node, tokens in second.freed_per_node.items():
            self.freed(node, tokens)

    def release_home(self, pool: Sequence[TickCandidate]) -> None:
        """3a. (``home``) Each pooled session whose home (last node) holds more of its prefix
        than any other node and lacks the room there, most home credit first: the releasable
        tool-running sessions on its home (:func:`releasable`, in the demand step's order)
        are released for it where together they cover its shortfall, so that it runs where
        its prefix is; where they do not, none is released for it."""
        snapshot, rules = self.snapshot, self.rules
        room = dict(self.free)
        homed = sorted(
            (c for c in pool if _home_edge(c) > 0 and c.home not in self.blocked),
            key=lambda c: (-c.credit.get(c.home or "", 0), c.id),
        )
        releasable_on: dict[str, list[InterruptCandidate]] = {}
        if homed:
            for ic in snapshot.interrupts:
                if ic.id not in self.chosen and releasable(ic, snapshot, rules):
                    releasable_on.setdefault(ic.node, []).append(ic)
        key = self.net_key() if rules.cost else interrupt_key
        for c in homed:
            home = c.home or ""
            if c.weight > room.get(home, 0):
                there = [ic for ic in releasable_on.get(home, ()) if ic.id not in self.chosen]
                pick = select_interrupts(there, c.weight, room.get(home, 0), key=key)
                if not pick.satisfied:
                    continue
                self.take(pick.interrupt, "home")
                for sid in pick.interrupt:
                    w = self.by_id[sid].weight
                    self.freed(home, w)
                    room[home] = room.get(home, 0) + w
            room[home] = room.get(home, 0) - c.weight

    def moves_allowed(self, c: TickCandidate, fits: frozenset[str]) -> frozenset[str]:
        """(``home``) The nodes of ``fits`` that ``c`` may go to: all of them, unless its home
        holds more of its prefix than any other node and is not among them; then only those
        where its wait so far covers what the move costs (:func:`move_cost_s`)."""
        home = c.home
        if not self.rules.home or home is None or home in fits or _home_edge(c) <= 0:
            return fits
        snapshot = self.snapshot
        waited = 0.0 if c.waiting_since is None else snapshot.now - c.waiting_since
        at_home = c.credit.get(home, 0)
        return frozenset(
            b
            for b in fits
            if waited
            >= move_cost_s(at_home, c.credit.get(b, 0), snapshot.running.get(b, 0), self.rules)
        )

    def problem(self, pool: Sequence[TickCandidate]) -> Problem:
        """4. The placement problem of ``pool`` on the room left."""
        free = self.free
        nodes = tuple(replace(nd, free=free[nd.id]) for nd in self.snapshot.nodes)
        planned: list[Candidate] = []
        for c in pool:
            fits = frozenset(b for b in c.eligible if c.weight <= free.get(b, 0))
            fits = self.moves_allowed(c, fits)
            planned.append(
                Candidate(
                    id=c.id,
                    weight=c.weight,
                    tokens=c.tokens,
                    ready=c.ready,
                    credit={b: k for b, k in c.credit.items() if b in fits},
                    eligible=fits,
                    phase=c.phase,
                )
            )
        return Problem(quantum=self.snapshot.quantum, nodes=nodes, candidates=tuple(planned))


def _home_edge(c: TickCandidate) -> int:
    """How much more credit ``c``'s home (its last node, eligible) holds for it than any
    other node: 0 when it has no home or another node holds as much."""
    home = c.home
    if home is None or home not in c.eligible:
        return 0
    best_else = max((k for b, k in c.credit.items() if b != home), default=0)
    return max(0, c.credit.get(home, 0) - best_else)


def _clear_for(
    c: TickCandidate,
    running: Sequence[InterruptCandidate],
    chosen: set[str],
    free: Mapping[str, int],
    blocked: set[str],
) -> tuple[str, list[str]] | None:
    """The node to clear for a starving candidate and whom to release there: the eligible
    node with the most free plus releasable room (non-ready tool sessions not yet released),
    and its releasable sessions in ascending value order until the candidate fits."""
    best: tuple[int, str] | None = None
    per_node: dict[str, list[InterruptCandidate]] = {}
    for ic in running:
        if ic.id not in chosen and not ic.ready:
            per_node.setdefault(ic.node, []).append(ic)
    for b in sorted(c.eligible):
        if b in blocked:
            continue
        room = free.get(b, 0) + sum(ic.weight for ic in per_node.get(b, ()))
        if best is None or room > best[0]:
            best = (room, b)
    if best is None:
        return None
    node = best[1]
    need = c.weight - free.get(node, 0)
    out: list[str] = []
    for ic in sorted(per_node.get(node, ()), key=interrupt_key):
        if need <= 0:
            break
        out.append(ic.id)
        need -= ic.weight
    return node, out


def _room_after(free: Mapping[str, int], admits: Iterable[Move]) -> dict[str, int]:
    """Each node's free room once ``admits`` took theirs."""
    room = dict(free)
    for m in admits:
        room[m.node] = room.get(m.node, 0) - m.weight
    return room


def _readmit_home(
    admits: Sequence[Move], snapshot: TickSnapshot, free: Mapping[str, int]
) -> list[Move]:
    """Released sessions still in their tool (pooled, not needing the GPU), admitted again on
    their last node, most credit first, into the room the plan left there: never room a
    session that needs the GPU was given this round, and only where the prefix may still be."""
    room = _room_after(free, admits)
    idle = sorted(
        (
            c
            for c in snapshot.candidates
            if not needs_gpu(c)
            and c.home is not None
            and c.home in c.eligible
            and c.credit.get(c.home, 0) > 0
        ),
        key=lambda c: (-c.credit.get(c.home or "", 0), c.id),
    )
    out: list[Move] = []
    for c in idle:
        home = c.home or ""
        if c.weight <= room.get(home, 0):
            room[home] -= c.weight
            out.append(Move(c.id, home, c.weight, snapshot.versions[c.id], c.digest))
    return out


def _stay_home(
    admits: list[Move], cands: Mapping[str, TickCandidate], free: Mapping[str, int]
) -> list[Move]:
    """Move each admit to its session's last node when that node is of equal value (same
    credit) and its room left after the plan allows; the plan's value is unchanged."""
    room = _room_after(free, admits)
    out: list[Move] = []
    for m in admits:
        c = cands.get(m.session)
        home = None if c is None else c.home
        if (
            c is not None
            and home is not None
            and home != m.node
            and home in c.eligible
            and c.credit.get(home, 0) == c.credit.get(m.node, 0)
            and room.get(home, 0) >= m.weight
        ):
            room[home] -= m.weight
            room[m.node] += m.weight
            m = replace(m, node=home)
        out.append(m)
    return out


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
