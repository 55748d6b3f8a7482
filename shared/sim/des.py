"""The discrete-event loop: virtual time, node engines, agents, and a scheduler (policy glue).

One run = one policy on one task list. Events, in virtual seconds:

* a task starts (closed loop: a worker takes the next task when its last one ends; open loop or
  trace replay: at the task's arrival time) — its first request is issued;
* a request completes on an engine (``Engine.next_event_time`` / ``advance``, the same engine
  the sim node runs): the session's record gets ``on_response``; the task ends, or the model
  called a tool, which the harness hook reports at once (``on_tool_start``, ``source="hook"``,
  with the interface deadline when the tool has a timeout, and the true end as
  ``expected_end`` for the ``oracle`` policy);
* a tool ends (``on_tool_end``; the duration goes into the predictor's history, a call cut by
  its timeout as a censored sample) and the agent issues its next request at the same instant;
* scheduler timers (ticks, ThunderAgent's 5 s check) and a fixed-rate state sample.

The loop is deterministic for a seed: events at equal times run in insertion order, and every
container iterated is ordered. Nothing reads the wall clock except the solve-time metric.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from shared.core.engine import PROFILES, Engine, EngineRequest
from shared.core.nodecost import ControlLatency
from shared.core.policies import DEFAULT_BUDGET
from shared.core.predictor import History, record, record_censored
from shared.core.session import (
    Session,
    on_end,
    on_request,
    on_response,
    on_tool_end,
    on_tool_start,
)
from shared.core.valuation import ValuationParams
from shared.sim.records import RequestRecord, Sample, SimResult, TaskRecord
from shared.sim.tokens import SessionTokens
from shared.sim.workloads import Task

__all__ = ["INSTANT", "Agent", "ControlLatency", "SimConfig", "Simulator"]

HOOK = "hook"
"""``source`` of the tool events the simulated harness reports (hooks beat inference)."""


INSTANT = ControlLatency(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
"""No control-loop latency: a round's plan applies at the instant of its snapshot."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of one run. ``workers=None`` means open loop (tasks carry arrival times)."""

    nodes: int = 2
    profile: str = "qwen3-32b-tp2"
    workers: int | None = 64
    tick_s: float = 1.0
    latency: ControlLatency = field(default_factory=ControlLatency)
    """The TAO pipeline's control-loop latency (:class:`ControlLatency`; :data:`INSTANT` for
    none)."""
    ta_interval_s: float = 5.0
    ta_decay_half_life_s: float | None = None
    """``thunderagent-decay``'s half-life, s (None: the code's 1 s, ``DECAY_HALF_LIFE_S``)."""
    sample_s: float = 1.0
    target_utilisation: float = 1.0
    budget: int = DEFAULT_BUDGET
    params: ValuationParams = field(default_factory=ValuationParams)
    capture_snapshots: int = 0
    record_rounds: bool = False
    """Keep every applied round's record (:class:`shared.core.round.RoundRecord`) in
    :attr:`SimResult.rounds`, for ``tao sim --record`` and ``tao explain``."""
    interrupts: bool = True
    """Diagnostic only (docs/evaluation.md "Findings"): False skips the interrupt rule in the
    TAO pipeline's rounds. Every reported result runs with the rule on."""
    reweigh: bool = True
    """Pass ``reserve`` to ``on_response`` so an admitted session's reservation follows its
    context (``tokens + reserve``; paper Appendix B.1: w_i and C_b are updated at every
    scheduling time). False keeps the weight fixed at admission."""
    kv_tokens: int | None = None
    """Override the profile's KV capacity (tests, what-if runs)."""
    decay_from_finish: bool = False
    """Credit decays from the session's last finish on the node even while the engine still
    holds its prefix (the rule before the event-evidence decay); default: a prefix resident
    now is observed now."""
    host_kv: float = 0.0
    """Each node's host KV tier, as a multiple of its GPU KV (``tao sim --host-kv``; vLLM's
    OffloadingConnector, :mod:`shared.core.engine.host`); 0: none."""
    domains: int = 1
    """Scheduling domains the nodes are split into (:class:`shared.sim.cluster.DomainScheduler`;
    TAO-family policies only: routers and ThunderAgent are domain-less)."""
    max_time_s: float = 1e7


@dataclass(slots=True)
class Agent:
    """Simulator-side state of one session (the core record lives in ``Simulator.sessions``)."""

    task: Task
    index: int
    tokens: SessionTokens
    start: float
    turn: int = 0
    ctx: int = 0
    issued: float = 0.0
    submitted: float = math.nan
    node: str | None = None
    tool_end: float | None = None
    tool_time: float = 0.0
    served: dict[str, float] = field(default_factory=dict)
    pending: bool = False
    resident: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per node: (engine's ``evicted_blocks`` then, leading blocks of the session's chain
    known resident then): a lower bound while nothing has been evicted since."""
    hosted: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The same for the node's host tier: (its ``evicted`` then, leading blocks ready then)."""
    release: str | None = None
    """Cause of the last release of the session's admission since its previous request
    finished (:meth:`Simulator.note_release`), None if none; goes into the next request's
    :class:`RequestRecord`."""

    @property
    def prompt_len(self) -> int:
        return self.ctx + self.task.turns[self.turn].added


# event kinds, in tie-break order at equal times
_START, _TOOL_END, _TIMER, _SAMPLE = 0, 1, 2, 3


class Simulator:
    """The event loop; ``scheduler`` (see :mod:`shared.sim.cluster`) decides placement."""

    def __init__(
        self,
        tasks: Sequence[Task],
        config: SimConfig,
        scheduler_factory: Callable[[Simulator], object],
        *,
        policy: str,
        seed: int,
        oracle: bool = False,
    ) -> None:
        if config.profile not in PROFILES:
            raise ValueError(f"profile: unknown {config.profile!r}; known: {', '.join(PROFILES)}")
        self.config = config
        self.profile = PROFILES[config.profile]
        if config.kv_tokens is not None:
            self.profile = replace(self.profile, kv_tokens=config.kv_tokens)
        self.node_ids = tuple(f"n{i}" for i in range(config.nodes))
        self.host_link = self.profile.host_link(config.host_kv)
        self.engines = {n: Engine(n, self.profile, host=self.host_link) for n in self.node_ids}
        self.tasks = list(tasks)
        self.oracle = oracle
        self.now = 0.0
        self.sessions: dict[str, Session] = {}
        self.agents: dict[str, Agent] = {}
        self.history = History()
        self.inflight_tokens = dict.fromkeys(self.node_ids, 0)
        self.result = SimResult(
            policy=policy,
            seed=seed,
            workers=config.workers,
            nodes=config.nodes,
            profile=config.profile,
        )
        self.counters = self.result.counters
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._next_task = 0
        self._done = 0
        self._next_event: dict[str, float | None] = dict.fromkeys(self.node_ids)
        self.scheduler = scheduler_factory(self)

    # -- event plumbing --------------------------------------------------------------------

    def push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    def timer(self, t: float, name: str) -> None:
        """Ask for ``scheduler.on_timer(name, t)`` at ``t``."""
        self.push(t, _TIMER, name)

    @property
    def finished(self) -> bool:
        return self._done == len(self.tasks)

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        """Run to completion (every task ends) and return the records."""
        wall = time.perf_counter()
        cfg = self.config
        if cfg.workers is None:
            for i, task in enumerate(self.tasks):
                self.push(task.arrival or 0.0, _START, i)
            self._next_task = len(self.tasks)
        else:
            for _ in range(min(cfg.workers, len(self.tasks))):
                self.push(0.0, _START, self._next_task)
                self._next_task += 1
        self.push(0.0, _SAMPLE, None)
        start_hook = getattr(self.scheduler, "start", None)
        if start_hook is not None:
            start_hook()
        heap = self._heap
        nxt = self._next_event
        last_report = -1
        while not self.finished:
            t_heap = heap[0][0] if heap else math.inf
            t_eng, eng = math.inf, None
            for node, te in nxt.items():
                if te is None:
                    te = self.engines[node].next_event_time()
                    te = math.inf if te is None else te
                    nxt[node] = te
                if te < t_eng:
                    t_eng, eng = te, self.engines[node]
            if t_eng == math.inf and t_heap == math.inf:
                raise RuntimeError("simulation stalled: no event pending and tasks unfinished")
            if eng is not None and t_eng <= t_heap:
                self.now = max(self.now, t_eng)
                nxt[eng.node_id] = None
                for c in eng.advance(t_eng):
                    self._complete(eng.node_id, c)
            else:
                t, kind, _, payload = heapq.heappop(heap)
                self.now = max(self.now, t)
                if kind == _START:
                    self._start_task(int(payload))  # type: ignore[call-overload]
                elif kind == _TOOL_END:
                    self._tool_end(str(payload))
                elif kind == _TIMER:
                    self.scheduler.on_timer(str(payload), self.now)  # type: ignore[attr-defined]
                else:
                    self._sample()
            if self.now > cfg.max_time_s:
                raise RuntimeError(f"simulation passed max_time_s={cfg.max_time_s}")
            if progress is not None and self._done != last_report:
                last_report = self._done
                progress(self._done, len(self.tasks))
        self._sample()
        self.result.preemptions = sum(e.num_preemptions for e in self.engines.values())
        if self.host_link is not None:  # the host tier's work, summed over nodes
            hosts = [e.host for e in self.engines.values() if e.host is not None]
            self.counters["host_hit_tokens"] = sum(e.host_hit_tokens for e in self.engines.values())
            self.counters["host_stored_blocks"] = sum(h.stored_blocks for h in hosts)
            self.counters["host_evicted_blocks"] = sum(h.evicted for h in hosts)
            self.counters["host_store_failures"] = sum(h.store_failures for h in hosts)
        self.result.end_time = self.now
        self.result.wall_s = time.perf_counter() - wall
        return self.result

    def _sample(self) -> None:
        running = sum(e.running for e in self.engines.values())
        waiting = sum(e.waiting for e in self.engines.values())
        held = sum(1 for a in self.agents.values() if a.pending)
        admitted = sum(1 for s in self.sessions.values() if s.node is not None)
        self.result.samples.append(Sample(self.now, running, waiting, held, admitted))
        if not self.finished:
            self.push(self.now + self.config.sample_s, _SAMPLE, None)

    # -- agents ----------------------------------------------------------------------------

    def _start_task(self, i: int) -> None:
        task = self.tasks[i]
        sid = task.id
        agent = Agent(task, i, SessionTokens(task.family, task.shared_prefix, i), self.now)
        agent.ctx = task.shared_prefix
        self.agents[sid] = agent
        self.sessions[sid] = Session(id=sid, created_at=self.now, updated_at=self.now)
        self._issue(sid)

    def _issue(self, sid: str) -> None:
        """The agent sends its next request now."""
        agent = self.agents[sid]
        agent.issued = self.now
        agent.pending = True
        turn = agent.turn
        s, _ = on_request(
            self.sessions[sid],
            f"{sid}/{turn}",
            self.now,
            tokens_estimate=agent.prompt_len,
            shared=min(agent.task.shared_prefix, agent.prompt_len),  # the family's system prompt
        )
        self.sessions[sid] = s
        self.scheduler.on_request(sid, self.now)  # type: ignore[attr-defined]

    def submit(self, sid: str, node: str) -> None:
        """Send the session's pending request to ``node``'s engine now."""
        agent = self.agents[sid]
        if not agent.pending:
            raise RuntimeError(f"{sid}: no pending request to submit")
        eng = self.engines[node]
        self._next_event[node] = None
        for c in eng.advance(self.now):
            self._complete(eng.node_id, c)
        turn = agent.task.turns[agent.turn]
        plen = agent.prompt_len
        req = EngineRequest(
            id=f"{sid}/{agent.turn}",
            session_id=sid,
            prompt=agent.tokens.take(0, plen),
            max_tokens=turn.output,
            output=agent.tokens.take(plen, plen + turn.output),
        )
        eng.submit(req, self.now)
        self._next_event[node] = None
        agent.pending = False
        agent.submitted = self.now
        agent.node = node
        self.inflight_tokens[node] += plen

    def _complete(self, node: str, c: object) -> None:
        sid = c.session_id  # type: ignore[attr-defined]
        agent = self.agents[sid]
        turn = agent.task.turns[agent.turn]
        self.result.requests.append(
            RequestRecord(
                session=sid,
                turn=agent.turn,
                node=node,
                issued=agent.issued,
                submitted=agent.submitted,
                first_token=c.first_token_at,  # type: ignore[attr-defined]
                finished=c.finished_at,  # type: ignore[attr-defined]
                prompt=c.prompt_tokens,  # type: ignore[attr-defined]
                cached=c.cached_tokens,  # type: ignore[attr-defined]
                completion=c.completion_tokens,  # type: ignore[attr-defined]
                tool_end=agent.tool_end,
                release=agent.release,
            )
        )
        agent.release = None
        plen = agent.prompt_len
        self.inflight_tokens[node] -= plen
        agent.ctx = plen + turn.output
        agent.served[node] = self.now
        agent.node = None
        s = self.sessions[sid]
        if turn.tool is None:
            self._end_task(sid)
            return
        call_id = f"{sid}/c{agent.turn}"
        s = on_response(
            s,
            self.now,
            total_tokens=agent.ctx,
            tool_calls=((call_id, turn.tool),),
            reserve=self.config.params.reserve if self.config.reweigh else None,
            rules=getattr(self.scheduler, "rules", None),
        )
        true_end = self.now + (min(turn.duration, turn.timeout) if turn.timeout else turn.duration)
        s = on_tool_start(
            s,
            call_id,
            turn.tool,
            self.now,
            source=HOOK,
            deadline=None if turn.timeout is None else self.now + turn.timeout,
            expected_end=true_end if self.oracle else None,
        )
        self.sessions[sid] = s
        agent.tool_time += true_end - self.now
        self.push(true_end, _TOOL_END, sid)
        self.scheduler.on_response(sid, self.now)  # type: ignore[attr-defined]

    def _tool_end(self, sid: str) -> None:
        agent = self.agents[sid]
        turn = agent.task.turns[agent.turn]
        s = self.sessions[sid]
        assert s.tool is not None and turn.tool is not None
        cut = turn.timeout is not None and turn.duration >= turn.timeout
        s, duration = on_tool_end(
            s, s.tool.call_id, self.now, source=HOOK, background=turn.background
        )
        if duration is not None:
            if cut:
                self.history = record_censored(self.history, turn.tool, duration)
                self.counters["censored_tools"] = self.counters.get("censored_tools", 0) + 1
            else:
                self.history = record(self.history, turn.tool, duration)
        self.sessions[sid] = s
        agent.turn += 1
        agent.tool_end = self.now
        self.scheduler.on_tool_end(sid, self.now)  # type: ignore[attr-defined]
        self._issue(sid)

    def _end_task(self, sid: str) -> None:
        agent = self.agents.pop(sid)
        self.sessions[sid] = on_end(self.sessions[sid], self.now)
        self.result.tasks.append(
            TaskRecord(
                session=sid,
                family=agent.task.family,
                start=agent.start,
                end=self.now,
                turns=len(agent.task.turns),
                tool_time=agent.tool_time,
            )
        )
        self._done += 1
        self.scheduler.on_task_end(sid, self.now)  # type: ignore[attr-defined]
        del self.sessions[sid]
        if self.config.workers is not None and self._next_task < len(self.tasks):
            self.push(self.now, _START, self._next_task)
            self._next_task += 1

    # -- what schedulers read --------------------------------------------------------------

    def residency(self, sid: str, only: str | None = None) -> dict[str, tuple[int, float]]:
        """``{node: (k0, t_obs)}``: the session's prefix resident on each node it was served on
        (the engine's ground truth, what KV events tell the telemetry). ``t_obs`` is now: the
        event stream reports every eviction as it happens, so a prefix it still shows resident
        is current evidence and does not decay (docs/internals.md, decayed credit; with
        ``SimConfig.decay_from_finish`` it is when its last request there finished, the rule
        before). ``only`` restricts it to one node (an admitted session's, the only credit the
        interrupt rule reads)."""
        agent = self.agents.get(sid)
        if agent is None or not agent.served:
            return {}
        out: dict[str, tuple[int, float]] = {}
        nblocks = agent.ctx // self.profile.block_size
        for node, t_obs in sorted(agent.served.items()):
            if only is not None and node != only:
                continue
            k0 = self._resident_blocks(agent, node, nblocks) * self.profile.block_size
            if k0 > 0:
                out[node] = (k0, t_obs if self.config.decay_from_finish else self.now)
        return out

    def host_residency(self, sid: str, only: str | None = None) -> dict[str, int]:
        """``{node: tokens}``: the session's context, from its start, that each node's host tier
        holds now (what the host tier's KV events tell the telemetry); ``{}`` without a tier."""
        agent = self.agents.get(sid)
        if self.host_link is None or agent is None or not agent.served:
            return {}
        bs = self.profile.block_size
        nblocks = agent.ctx // bs
        out: dict[str, int] = {}
        for node in agent.served:
            if only is not None and node != only:
                continue
            n = self._host_blocks(agent, node, nblocks) * bs
            if n > 0:
                out[node] = n
        return out

    def _host_blocks(self, agent: Agent, node: str, nblocks: int) -> int:
        """Leading blocks of the session's first ``nblocks`` ready in ``node``'s host tier; the
        walk resumes before the first of them the host evicted since the last answer (as
        :meth:`_resident_blocks` does on the GPU)."""
        eng = self.engines[node]
        host = eng.host
        assert host is not None
        start = _still_known(agent, agent.hosted.get(node), host.evicted, host.evicted_since)
        hashes = agent.tokens.block_hashes(nblocks, self.profile.block_size)
        n = eng.host_resident_blocks(hashes, nblocks, min(start, nblocks))
        agent.hosted[node] = (host.evicted, n)
        return n

    def resident_now(self, sid: str, host_weight: float = 0.0) -> dict[str, int]:
        """``{node: tokens}`` of the session's next prompt resident on each node (routers).
        ``host_weight`` > 0: what a node's host tier holds beyond its GPU run counts that much
        per token (``kv-aware-tiered``: llm-d's tier weights)."""
        agent = self.agents[sid]
        bs = self.profile.block_size
        nblocks = agent.prompt_len // bs
        out: dict[str, int] = {}
        for node in self.node_ids:
            k = self._resident_blocks(agent, node, nblocks) * bs
            if host_weight > 0.0 and self.host_link is not None:
                h = self._host_blocks(agent, node, nblocks) * bs
                k += int(host_weight * max(0, h - k))
            if k > 0:
                out[node] = k
        return out

    def _resident_blocks(self, agent: Agent, node: str, nblocks: int) -> int:
        """Leading blocks of the session's first ``nblocks`` resident on ``node`` now (the
        engine's ground truth). Blocks leave the cache only by eviction, so the blocks known
        resident at the last query before the first of them evicted since are still resident:
        the walk starts there (a query costs the evictions and cachings since, not the whole
        chain); a full walk when that log is longer than the known run or no longer kept."""
        eng = self.engines[node]
        ev = eng.evicted_blocks
        hashes = agent.tokens.block_hashes(nblocks, self.profile.block_size)
        start = _still_known(agent, agent.resident.get(node), ev, eng.evicted_since)
        n = eng.resident_blocks(hashes, nblocks, start)
        agent.resident[node] = (ev, max(n, start))
        return n

    def note_release(self, sid: str, cause: str) -> None:
        """The scheduler released ``sid``'s admission (``cause``: see ``RequestRecord.release``);
        counted as ``releases_<cause>``."""
        agent = self.agents.get(sid)
        if agent is not None:
            agent.release = cause
        self.bump(f"releases_{cause}")

    def bump(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n


def _still_known(
    agent: Agent,
    known: tuple[int, int] | None,
    evicted: int,
    evicted_since: Callable[[int], list[int] | None],
) -> int:
    """Leading blocks of the agent's chain still resident in a tier whose earlier answer was
    ``known`` = (its eviction count then, blocks resident then), the count now ``evicted``:
    blocks leave only by eviction, so those before the first of the chain evicted since are
    still there; 0 when that log is longer than the known run or no longer kept."""
    if known is None:
        return 0
    mark, start = known
    if mark == evicted:
        return start
    gone = evicted_since(mark) if evicted - mark < start else None
    if gone is None:
        return 0
    index = agent.tokens.index
    common = index.keys() & gone
    return min(start, min(index[h] for h in common)) if common else start
