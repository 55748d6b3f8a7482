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
* **ThunderAgent** — ``thunderagent``: program-level admission with its own pause rules
  (:mod:`shared.core.policies.thunderagent`). Every 5 s (``thunderagent_due``) ACTING programs
  are paused smallest first on over-full backends and REASONING ones marked to pause when
  their call ends (``thunderagent_pause``); programs waiting 1800 s are force-resumed
  (``thunderagent_overdue``). Resume (the policy's greedy BFD on the pool) runs at each check and
  also at once whenever a program waits or leaves a backend — at least as responsive as the
  authors' loop, never less.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from shared.core.policies import PlanOptions, Policy, get_policy
from shared.core.policies.thunderagent import (
    TABackend,
    TAProgram,
    thunderagent_due,
    thunderagent_overdue,
    thunderagent_pause,
)
from shared.core.problem import Candidate, Node, PlanResult, Problem
from shared.core.session import admit, release, set_probe_mark
from shared.core.tick import (
    Applied,
    Decision,
    TickSnapshot,
    apply_decision,
    decide,
    live_free,
    usable_capacity,
    value_snapshot,
)
from shared.core.valuation import NodeView, session_weight
from shared.sim.des import Simulator
from shared.sim.records import TickRecord

__all__ = ["ROUTERS", "PooledScheduler", "RouterScheduler", "ThunderAgentScheduler", "scheduler"]

ROUTERS = frozenset({"rr", "cache-aware", "kv-aware"})
"""Policies simulated as request routers (no pool)."""
DP_POLICIES = frozenset({"tao", "tao-no-cache", "tao-no-ready", "tao-no-cache-no-ready", "oracle"})
"""Policies whose plan is the DP (their non-exact plans are fallbacks)."""


class _Base:
    def __init__(self, sim: Simulator, policy_name: str) -> None:
        self.sim = sim
        self.policy = get_policy(policy_name)
        self.options = PlanOptions(budget=sim.config.budget)

    def node_views(self) -> list[NodeView]:
        sim = self.sim
        reserved = dict.fromkeys(sim.node_ids, 0)
        for s in sim.sessions.values():
            if s.node is not None:
                reserved[s.node] += s.weight
        return [
            NodeView(
                id=n,
                capacity_tokens=sim.profile.kv_tokens,
                target_utilisation=sim.config.target_utilisation,
                reserved=reserved[n],
            )
            for n in sim.node_ids
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
        credit = sim.resident_now(sid) if self.policy.name != "rr" else {}
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
    """The TAO pipeline (value → interrupt → plan → apply) on a 1 s tick plus wake-ups."""

    def __init__(self, sim: Simulator, policy_name: str) -> None:
        super().__init__(sim, "tao" if policy_name == "oracle" else policy_name)
        self.name = policy_name
        self.tick_no = 0
        self.next_wake: float | None = None
        self.recorder = _Recording(self.policy)

    def start(self) -> None:
        self.sim.timer(0.0, "tick")

    def wake(self, t: float) -> None:
        at = t + self.sim.config.wake_delay_s
        if self.next_wake is None or at < self.next_wake:
            self.next_wake = at
            self.sim.timer(at, "wake")

    def on_timer(self, name: str, t: float) -> None:
        sim = self.sim
        if name == "tick":
            if not sim.finished:
                sim.timer(t + sim.config.tick_s, "tick")
        elif self.next_wake is None or t != self.next_wake:
            return  # a superseded wake-up
        else:
            self.next_wake = None
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

    def round(self, t: float) -> None:
        sim = self.sim
        live = sim.sessions
        involved = [
            (sid, s.node)
            for sid, s in live.items()
            if s.pooled or (s.node is not None and s.activity == "tool")
        ]
        if not involved:
            return  # nothing to admit and nobody to release
        nodes = self.node_views()
        started = time.perf_counter()
        residency = {sid: sim.residency(sid, node) for sid, node in involved}
        snap = value_snapshot(
            live.values(),
            nodes,
            residency,
            sim.history,
            t,
            tick=self.tick_no,
            params=sim.config.params,
        )
        self.tick_no += 1
        if not sim.config.interrupts:
            snap = replace(snap, interrupts=())
        for sid, mark in snap.probe_marks.items():
            live[sid] = set_probe_mark(live[sid], mark)
        if not snap.candidates and not any(v > 0 for v in snap.overflow.values()):
            return  # an empty pool and no over-committed node: the round would do nothing
        self.recorder.last = None
        decision = decide(snap, self.recorder, self.options)
        solve_s = time.perf_counter() - started
        applied = apply_decision(decision, live, live_free(nodes), t)
        problem = self.recorder.last
        capture = len(sim.result.snapshots) < sim.config.capture_snapshots
        if capture and problem is not None and len(problem.candidates) > 1:
            sim.result.snapshots.append((t, problem))
        if applied.discarded:
            sim.bump("plans_discarded")
            return
        live.update(applied.sessions)
        sim.bump("interrupts", len(applied.interrupted))
        sim.bump("admits", len(applied.admitted))
        self.record_tick(t, snap, decision, applied, nodes, solve_s, len(applied.interrupted))
        for m in applied.admitted:
            if sim.agents[m.session].pending:
                sim.submit(m.session, m.node)


class ThunderAgentScheduler(PooledScheduler):
    """ThunderAgent: greedy resume on the pool, 5 s pause checks, 1800 s forced resume."""

    def __init__(self, sim: Simulator, policy_name: str) -> None:
        super().__init__(sim, policy_name)
        self.last_check: float | None = None
        self.marked: set[str] = set()
        self.waiting_since: dict[str, float] = {}

    def start(self) -> None:
        self.sim.timer(0.0, "check")

    def on_timer(self, name: str, t: float) -> None:
        sim = self.sim
        if name == "check":
            if not sim.finished:
                sim.timer(t + sim.config.ta_interval_s, "check")
            if thunderagent_due(self.last_check, t, sim.config.ta_interval_s):
                self.last_check = t
                self.pause(t)
                self.force_resume(t)
        elif self.next_wake is None or t != self.next_wake:
            return
        else:
            self.next_wake = None
        self.resume(t)

    def on_request(self, sid: str, t: float) -> None:
        s = self.sim.sessions[sid]
        if s.node is not None:
            self.sim.submit(sid, s.node)
        else:
            self.waiting_since.setdefault(sid, t)
            self.wake(t)

    def on_response(self, sid: str, t: float) -> None:
        if sid in self.marked:  # a REASONING program marked to pause: its call just ended
            self.marked.discard(sid)
            self._pause(sid, t)

    def on_task_end(self, sid: str, t: float) -> None:
        self.marked.discard(sid)
        self.waiting_since.pop(sid, None)
        self.wake(t)

    def _pause(self, sid: str, t: float) -> None:
        sim = self.sim
        s = sim.sessions[sid]
        if s.node is None:
            return
        sim.sessions[sid] = release(s, t)
        self.waiting_since.setdefault(sid, t)
        sim.bump("interrupts")
        self.wake(t)

    def pause(self, t: float) -> None:
        sim = self.sim
        progs: dict[str, list[TAProgram]] = {n: [] for n in sim.node_ids}
        for sid, s in sim.sessions.items():
            if s.node is None:
                continue
            acting = s.activity == "tool"
            since = s.tool.started_at if acting and s.tool is not None else None
            state: Literal["acting", "reasoning"] = "acting" if acting else "reasoning"
            progs[s.node].append(TAProgram(sid, state, s.tokens, since, sid in self.marked))
        backends = [TABackend(sim.profile.kv_tokens, progs[n]) for n in sim.node_ids]
        for sid in thunderagent_pause(backends, t):
            s = sim.sessions[sid]
            if s.activity == "tool":
                self._pause(sid, t)
            else:
                self.marked.add(sid)

    def force_resume(self, t: float) -> None:
        sim = self.sim
        for sid in thunderagent_overdue(sorted(self.waiting_since.items()), t):
            s = sim.sessions.get(sid)
            if s is None or not s.pooled:
                continue
            nodes = self.node_views()
            best = max(nodes, key=lambda nv: (usable_capacity(nv) - nv.reserved, nv.id))
            weight = session_weight(s.tokens, 0, sim.config.params.reserve)
            sim.sessions[sid] = admit(s, best.id, weight, t)
            self.waiting_since.pop(sid, None)
            sim.bump("forced_resumes")
            if sim.agents[sid].pending:
                sim.submit(sid, best.id)

    def resume(self, t: float) -> None:
        """The greedy resume: the policy on the pool, no TAO interrupt rule."""
        sim = self.sim
        live = sim.sessions
        if not any(s.pooled for s in live.values()):
            return
        nodes = self.node_views()
        started = time.perf_counter()
        snap = value_snapshot(live.values(), nodes, {}, sim.history, t, params=sim.config.params)
        snap = replace(snap, interrupts=())  # ThunderAgent pauses by its own rule, not TAO's
        decision = decide(snap, self.policy, self.options)
        solve_s = time.perf_counter() - started
        applied = apply_decision(decision, live, live_free(nodes), t)
        if applied.discarded:
            sim.bump("plans_discarded")
            return
        live.update(applied.sessions)
        sim.bump("admits", len(applied.admitted))
        self.record_tick(t, snap, decision, applied, nodes, solve_s, 0)
        for m in applied.admitted:
            self.waiting_since.pop(m.session, None)
            if sim.agents[m.session].pending:
                sim.submit(m.session, m.node)


def scheduler(policy_name: str) -> type[_Base]:
    """The scheduler class that simulates ``policy_name``."""
    if policy_name in ROUTERS:
        return RouterScheduler
    if policy_name == "thunderagent":
        return ThunderAgentScheduler
    return PooledScheduler
