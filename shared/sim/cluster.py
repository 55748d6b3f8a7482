"""Scheduler glue: how each policy family drives admission in the simulator.

Three families, all calling the real core code (never a re-implementation):

* **Pooled** — ``tao``, its ablations, ``tao-bfd``, ``short-first`` and ``oracle``: the TAO
  pipeline. A request of an admitted session goes to its node at once; otherwise the session
  waits in the pool. Every ``tick_s`` (1 s), and early on wake-up events (a tool end, an arrival,
  a session leaving its node), one round runs: :func:`shared.core.tick.value_snapshot` →
  :func:`~shared.core.tick.decide` (interrupt rule, then the policy) →
  :func:`~shared.core.tick.apply_decision`, and admitted sessions with a pending request are
  submitted. Rounds with an empty pool are skipped (the interrupt rule only acts for a pool).
* **Routers** — ``rr``, ``cache-aware``, ``kv-aware``: vLLM / SGLang / Dynamo routers hold
  nothing. Each request is routed at once by the policy on a one-candidate problem whose nodes
  have their whole capacity free (so it always fits: the engine queues internally, as vLLM
  does); ``load`` is the node's in-flight prompt tokens, credit the prefix resident there.
* **ThunderAgent** — ``thunderagent``, ``thunderagent-ideal``, ``thunderagent-decay``: the
  state machine of :mod:`shared.core.thunder` (the one the live planner drives) in the request
  path, with its periodic check every ``ta_interval_s`` and a timer per blocked request for
  the 1800 s forced resume (:class:`ThunderAgentScheduler`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

import msgspec

from shared.core.domains import DomainLoad, choose_domain, session_demand
from shared.core.nodecost import from_profile
from shared.core.policies import PlanOptions, Policy, get_policy
from shared.core.policies.kv_aware import TIER_WEIGHTS
from shared.core.problem import Candidate, Node, PlanResult, Problem
from shared.core.session import Session, admit, release, set_probe_mark
from shared.core.thunder import (
    BUFFER_PER_PROGRAM,
    VARIANTS,
    WAIT_TIMEOUT_S,
    Check,
    ThunderAgent,
    variant_for,
)
from shared.core.tick import (
    Applied,
    Decision,
    TickSnapshot,
    apply_decision,
    decide,
    live_free,
    policy_rules,
    usable_capacity,
    value_snapshot,
)
from shared.core.valuation import NodeView, session_weight
from shared.sim.des import Simulator
from shared.sim.records import TickRecord

__all__ = [
    "ROUTERS",
    "DomainScheduler",
    "PooledScheduler",
    "RouterScheduler",
    "ThunderAgentScheduler",
    "scheduler",
]

ROUTERS = frozenset({"rr", "cache-aware", "kv-aware", "kv-aware-tiered"})
"""Policies simulated as request routers (no pool)."""
THUNDERAGENT = frozenset(VARIANTS)
"""Policies simulated by the ThunderAgent state machine (:mod:`shared.core.thunder`)."""
DP_POLICIES = frozenset({"tao", "tao-no-cache", "tao-no-ready", "tao-no-cache-no-ready", "oracle"})
"""Policies whose plan is the DP (their non-exact plans are fallbacks)."""


class _Base:
    def __init__(self, sim: Simulator, policy_name: str) -> None:
        self.sim = sim
        self.policy = get_policy(policy_name)
        self.options = PlanOptions(budget=sim.config.budget)
        self.node_ids: tuple[str, ...] = sim.node_ids
        self.cost = from_profile(
            sim.profile,
            sim.config.latency,
            0.0 if sim.host_link is None else sim.host_link.load_s_per_token,
        )
        """Every simulated node's prices: its engine profile's prefill terms, its host link,
        the simulated control loop's round trip (:func:`shared.core.nodecost.from_profile`)."""
        """The nodes this scheduler places on (a domain's, under :class:`DomainScheduler`)."""

    def node_views(self) -> list[NodeView]:
        sim = self.sim
        reserved = dict.fromkeys(self.node_ids, 0)
        shared = dict.fromkeys(self.node_ids, 0)
        for s in sim.sessions.values():
            if s.node is not None and s.node in reserved:
                reserved[s.node] += s.weight
                shared[s.node] = max(shared[s.node], min(s.shared, s.tokens))
        return [
            NodeView(
                id=n,
                capacity_tokens=sim.profile.kv_tokens,
                target_utilisation=sim.config.target_utilisation,
                reserved=reserved[n],
                running=sim.engines[n].running,
                shared=shared[n],
                host_load_s_per_token=self.cost.load_s,
                cost=self.cost,
            )
            for n in self.node_ids
        ]

    def record_tick(
        self,
        t: float,
        snap: TickSnapshot,
        decision: Decision,
        applied: Applied,
        nodes: Sequence[NodeView],
        solve_s: float,
        interrupts: int,
    ) -> None:
        """Append the :class:`TickRecord` of one planning round."""
        self.sim.result.ticks.append(
            TickRecord(
                t=t,
                pool=len(snap.candidates),
                demand=decision.demand,
                free=decision.free,
                capacity=sum(usable_capacity(nv) for nv in nodes),
                exact=decision.result.exact,
                method=decision.result.method,
                solve_s=solve_s,
                interrupts=interrupts,
                admits=len(applied.admitted),
                truncated=applied.truncated,
            )
        )

    def on_timer(self, name: str, t: float) -> None:
        return None

    def on_response(self, sid: str, t: float) -> None:
        return None

    def on_tool_end(self, sid: str, t: float) -> None:
        return None


class RouterScheduler(_Base):
    """Route every request at once; no pool, no reservation."""

    def on_request(self, sid: str, t: float) -> None:
        sim = self.sim
        s = sim.sessions[sid]
        agent = sim.agents[sid]
        if self.policy.name == "rr":
            credit: dict[str, int] = {}
        elif self.policy.name == "kv-aware-tiered":
            credit = sim.resident_now(sid, host_weight=TIER_WEIGHTS["CPU"] / TIER_WEIGHTS["GPU"])
        else:
            credit = sim.resident_now(sid)
        cap = usable_capacity(self.node_views()[0])
        nodes = tuple(Node(id=n, free=cap, load=sim.inflight_tokens[n]) for n in sim.node_ids)
        tokens = agent.prompt_len
        cand = Candidate(
            id=sid,
            weight=min(session_weight(tokens, 0, sim.config.params.reserve), cap),
            tokens=tokens,
            ready=1,
            credit=credit,
            phase=s.phase,
        )
        problem = Problem(quantum=sim.config.params.quantum, nodes=nodes, candidates=(cand,))
        result = self.policy.plan(problem, self.options)
        node = result.assignments[0].node if result.assignments else sim.node_ids[0]
        sim.submit(sid, node)

    def on_task_end(self, sid: str, t: float) -> None:
        return None


class _Recording:
    """Wraps a policy to keep the last problem it was asked to plan (the snapshot study)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.last: Problem | None = None

    def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
        self.last = problem
        return self.inner.plan(problem, options)


class PooledScheduler(_Base):
    """The TAO pipeline (value → interrupt → plan → apply) on a 1 s tick plus wake-ups, with
    the live control loop's latency (:class:`shared.sim.des.ControlLatency`) in virtual time.

    A wake-up event (a request that has to wait, a task ending) asks for a snapshot after the
    debounce and the hop to the store; a periodic tick takes one at once. The plan of a
    snapshot applies ``value + solve + apply`` later, against the live state at that moment
    (the signature check discards it when a session it names has changed meanwhile), and an
    admitted session's held request reaches its node ``forward_s`` after that. One round is in
    flight at a time, as in the planner; a wake-up or tick meanwhile takes a new snapshot as
    soon as the plan in flight is applied (the planner keeps only the newest snapshot)."""

    def __init__(
        self,
        sim: Simulator,
        policy_name: str,
        *,
        nodes: Sequence[str] | None = None,
        tag: str = "",
    ) -> None:
        super().__init__(sim, "tao" if policy_name == "oracle" else policy_name)
        if nodes is not None:
            self.node_ids = tuple(nodes)
        self.members: dict[str, None] | None = None if nodes is None else {}
        """The sessions of this scheduler's domain, in arrival order (None: every session)."""
        self.tag = tag
        """Prefix of this scheduler's timer names (a domain's, so they reach it)."""
        self.name = policy_name
        self.rules = policy_rules(self.policy)
        self.latency = sim.config.latency
        self.tick_no = 0
        self.next_wake: float | None = None
        self.inflight: tuple[TickSnapshot, Decision, list[NodeView], float] | None = None
        self.dirty = False
        self.forwards: deque[tuple[str, ...]] = deque()
        self.recorder = _Recording(self.policy)

    def timer(self, t: float, name: str) -> None:
        self.sim.timer(t, self.tag + name)

    def start(self) -> None:
        self.timer(0.0, "tick")

    def wake(self, t: float) -> None:
        lat = self.latency
        at = t + lat.debounce_s + lat.hop_in_s
        if self.next_wake is None or at < self.next_wake:
            self.next_wake = at
            self.timer(at, "wake")

    def on_timer(self, name: str, t: float) -> None:
        sim = self.sim
        if name == "apply":
            self.apply(t)
            return
        if name == "forward":
            self.forward(self.forwards.popleft())
            return
        if name == "tick":
            if not sim.finished:
                self.timer(t + sim.config.tick_s, "tick")
        elif self.next_wake is None or t != self.next_wake:
            return  # a superseded wake-up
        else:
            self.next_wake = None
        if self.inflight is not None:
            self.dirty = True
            return
        self.round(t)

    def on_request(self, sid: str, t: float) -> None:
        s = self.sim.sessions[sid]
        if s.node is not None:
            self.sim.submit(sid, s.node)
        else:
            self.wake(t)

    def on_tool_end(self, sid: str, t: float) -> None:
        return None  # the request issued right after wakes the scheduler

    def on_task_end(self, sid: str, t: float) -> None:
        self.wake(t)

    def sessions(self) -> list[Session]:
        """The live sessions this scheduler values (its domain's, or all)."""
        live = self.sim.sessions
        if self.members is None:
            return list(live.values())
        return [live[sid] for sid in self.members if sid in live]

    def round(self, t: float) -> None:
        """Take a snapshot at ``t``, decide, and apply after the loop's latency."""
        sim = self.sim
        live = sim.sessions
        mine = self.sessions()
        involved = [
            (s.id, s.node)
            for s in mine
            if s.pooled or (s.node is not None and s.activity == "tool")
        ]
        if not involved:
            return  # nothing to admit and nobody to release
        nodes = self.node_views()
        started = time.perf_counter()
        residency = {sid: sim.residency(sid, node) for sid, node in involved}
        host = (
            {sid: sim.host_residency(sid, node) for sid, node in involved}
            if sim.host_link is not None and "tier" in self.rules
            else None
        )
        snap = value_snapshot(
            mine,
            nodes,
            residency,
            sim.history,
            t,
            tick=self.tick_no,
            params=sim.config.params,
            rules=self.rules,
            host=host,
        )
        self.tick_no += 1
        if not sim.config.interrupts:
            snap = replace(snap, interrupts=())
        for sid, mark in snap.probe_marks.items():
            live[sid] = set_probe_mark(live[sid], mark)
        if not snap.candidates and not snap.overflow and not snap.pressure:
            return  # an empty pool and no over-committed node: the round would do nothing
        self.recorder.last = None
        decision = decide(snap, self.recorder, self.options, self.rules)
        solve_s = time.perf_counter() - started
        problem = self.recorder.last
        capture = len(sim.result.snapshots) < sim.config.capture_snapshots
        if capture and problem is not None and len(problem.candidates) > 1:
            sim.result.snapshots.append((t, problem))
        lat = self.latency
        delay = lat.value_s + lat.solve_time(len(involved)) + lat.apply_s
        self.inflight = (snap, decision, nodes, solve_s)
        if delay <= 0:
            self.apply(t)
        else:
            self.timer(t + delay, "apply")

    def apply(self, t: float) -> None:
        """Verify-and-apply the plan in flight against the live state at ``t``."""
        assert self.inflight is not None
        sim = self.sim
        snap, decision, nodes, solve_s = self.inflight
        self.inflight = None
        live = sim.sessions
        applied = apply_decision(decision, live, live_free(self.node_views()), t)
        if sim.config.record_rounds and decision.record is not None:
            sim.result.rounds.append(
                {
                    **decision.record.to_dict(),
                    "applied_at": t,
                    "discarded": applied.discarded,
                    "truncated": applied.truncated,
                }
            )
        if applied.discarded:
            sim.bump("plans_discarded")
        else:
            live.update(applied.sessions)
            sim.bump("interrupts", len(applied.interrupted))
            for m in applied.interrupted:
                over = max(snap.overflow.get(m.node, 0), snap.pressure.get(m.node, 0)) > 0
                sim.note_release(m.session, "payback" if over else "demand")
            sim.bump("admits", len(applied.admitted))
            if applied.truncated:
                sim.bump("plans_truncated")
            self.record_tick(t, snap, decision, applied, nodes, solve_s, len(applied.interrupted))
            held = tuple(m.session for m in applied.admitted if sim.agents[m.session].pending)
            if held:
                if self.latency.forward_s <= 0:
                    self.forward(held)
                else:
                    self.forwards.append(held)
                    self.timer(t + self.latency.forward_s, "forward")
        if self.dirty or applied.discarded:
            self.dirty = False
            if not sim.finished:
                self.round(t)

    def forward(self, sids: tuple[str, ...]) -> None:
        """The gateway forwards the held requests of sessions just admitted."""
        sim = self.sim
        for sid in sids:
            s = sim.sessions.get(sid)
            agent = sim.agents.get(sid)
            if s is not None and s.node is not None and agent is not None and agent.pending:
                sim.submit(sid, s.node)


class ThunderAgentScheduler(_Base):
    """ThunderAgent (:data:`THUNDERAGENT`): the core state machine of
    :mod:`shared.core.thunder` in the request path, as its router runs it — no control-loop
    hops (the router is the proxy), the periodic check every ``ta_interval_s``, a blocked
    request's 1800 s forced resume. The session records mirror its placement (admitted on
    the program's backend with ``tokens + 100`` reserved) so the same samples and metrics
    apply; TAO's interrupt rule and valuation play no part. Each check sees each engine's KV
    in use (``kv_usage × kv_tokens``, vLLM's ``kv_cache_usage_perc``) and the sessions whose
    requests hold it (the engine's running set: the requests the proxy has seen start), which
    a variant with ``shared_tokens`` turns into its shared tokens."""

    def __init__(self, sim: Simulator, policy_name: str) -> None:
        super().__init__(sim, policy_name)
        self.variant = variant_for(
            policy_name, sim.config.ta_interval_s, sim.config.ta_decay_half_life_s
        )
        self.ta = ThunderAgent(
            capacity=dict.fromkeys(sim.node_ids, sim.profile.kv_tokens), variant=self.variant
        )
        self.blocked_since: dict[str, float] = {}

    def start(self) -> None:
        self.sim.timer(self.variant.interval_s, "check")

    def on_timer(self, name: str, t: float) -> None:
        sim = self.sim
        if name == "check":
            if not sim.finished:
                sim.timer(t + self.variant.interval_s, "check")
            cap = sim.profile.kv_tokens
            used: dict[str, int | None] = {
                n: int(sim.engines[n].kv_usage * cap) for n in self.node_ids
            }
            holding = {n: sim.engines[n].running_sessions for n in self.node_ids}
            self._apply(self.ta.check(t, used, holding), t)
        elif name.startswith("force "):
            _, sid, since = name.split(" ")
            if self.blocked_since.get(sid) == float(since):
                node = self.ta.force(sid)
                if node is not None:
                    sim.bump("forced_resumes")
                    self._place(sid, node, t)

    def _apply(self, check: Check, t: float) -> None:
        sim = self.sim
        for sid in check.paused:
            self._unplace(sid, t)
        sim.bump("marks", len(check.marked))
        for sid, node in check.resumed:
            self._place(sid, node, t)
        if check.paused and self.variant.resume_on_event:
            self._apply(self.ta.resume(t), t)

    def _place(self, sid: str, node: str, t: float) -> None:
        sim = self.sim
        s = sim.sessions[sid]
        weight = self.ta.programs[sid].tokens + BUFFER_PER_PROGRAM
        if s.node != node:
            sim.sessions[sid] = admit(s, node, weight, t)
            sim.bump("admits")
        self.blocked_since.pop(sid, None)
        if sim.agents[sid].pending:
            sim.submit(sid, node)

    def _unplace(self, sid: str, t: float) -> None:
        sim = self.sim
        s = sim.sessions[sid]
        if s.node is not None:
            sim.sessions[sid] = release(s, t)
            sim.bump("interrupts")
            sim.note_release(sid, "pause")

    def on_request(self, sid: str, t: float) -> None:
        sim = self.sim
        node = self.ta.on_request(sid, sim.agents[sid].prompt_len)
        if node is not None:
            self._place(sid, node, t)
            return
        self.blocked_since[sid] = t
        sim.timer(t + WAIT_TIMEOUT_S, f"force {sid} {t!r}")
        if self.variant.resume_on_event:
            self._apply(self.ta.resume(t), t)

    def on_response(self, sid: str, t: float) -> None:
        sim = self.sim
        if self.ta.on_response(sid, sim.agents[sid].ctx, t):
            self._unplace(sid, t)
            if self.variant.resume_on_event:
                self._apply(self.ta.resume(t), t)
        else:
            s = sim.sessions[sid]
            if s.node is not None:
                sim.sessions[sid] = msgspec.structs.replace(
                    s, weight=sim.agents[sid].ctx + BUFFER_PER_PROGRAM
                )

    def on_task_end(self, sid: str, t: float) -> None:
        self.ta.release(sid)
        self.blocked_since.pop(sid, None)
        if self.variant.resume_on_event:
            self._apply(self.ta.resume(t), t)


class DomainScheduler:
    """``domains`` scheduling domains, each a :class:`PooledScheduler` (its own planner, tick and
    control loop) over a contiguous share of the nodes, with the upper-level choice of
    :func:`shared.core.domains.choose_domain` for each new session: least loaded after it by
    demand over capacity. A session stays in its domain for its life."""

    def __init__(self, sim: Simulator, policy_name: str, domains: int) -> None:
        n = len(sim.node_ids)
        if not 1 <= domains <= n:
            raise ValueError(
                f"domains: must be in [1, {n}] (one node at least each), got {domains}"
            )
        bounds = [round(i * n / domains) for i in range(domains + 1)]
        self.sim = sim
        self.parts = [
            PooledScheduler(
                sim, policy_name, nodes=sim.node_ids[bounds[i] : bounds[i + 1]], tag=f"d{i}:"
            )
            for i in range(domains)
        ]
        self.rules = self.parts[0].rules
        self.domain_of: dict[str, PooledScheduler] = {}

    def start(self) -> None:
        for part in self.parts:
            part.start()

    def on_timer(self, name: str, t: float) -> None:
        tag, _, inner = name.partition(":")
        self.parts[int(tag[1:])].on_timer(inner, t)

    def _choose(self, sid: str) -> PooledScheduler:
        sim = self.sim
        reserve = sim.config.params.reserve
        loads = [
            DomainLoad(
                part.tag,
                sum(usable_capacity(nv) for nv in part.node_views() if nv.healthy),
                session_demand(part.sessions(), reserve),
            )
            for part in self.parts
        ]
        s = sim.sessions[sid]
        chosen = choose_domain(loads, session_weight(s.tokens, 0, reserve), s.model)
        part = next(p for p in self.parts if p.tag == chosen)
        assert part.members is not None
        part.members[sid] = None
        self.domain_of[sid] = part
        return part

    def on_request(self, sid: str, t: float) -> None:
        part = self.domain_of.get(sid) or self._choose(sid)
        part.on_request(sid, t)

    def on_response(self, sid: str, t: float) -> None:
        self.domain_of[sid].on_response(sid, t)

    def on_tool_end(self, sid: str, t: float) -> None:
        self.domain_of[sid].on_tool_end(sid, t)

    def on_task_end(self, sid: str, t: float) -> None:
        part = self.domain_of.pop(sid)
        assert part.members is not None
        part.members.pop(sid, None)
        part.on_task_end(sid, t)


def scheduler(policy_name: str) -> type[_Base]:
    """The scheduler class that simulates ``policy_name``."""
    if policy_name in ROUTERS:
        return RouterScheduler
    if policy_name in THUNDERAGENT:
        return ThunderAgentScheduler
    return PooledScheduler
