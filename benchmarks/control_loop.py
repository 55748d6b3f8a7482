"""Control loop: tool end → placement latency, and tick time, with N live sessions.

A script, not a test: it prints markdown tables to stdout (progress goes to stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.control_loop
    PYTHONPATH=. .venv/bin/python -m benchmarks.control_loop --sessions 100,1000 --samples 200
    PYTHONPATH=. .venv/bin/python -m benchmarks.control_loop --taskset 1   # pin the services

Per N (``--sessions``), in a fresh NATS namespace and store domain (streams and keys are
removed afterwards):

1. **Seed** N session records straight into the store (``update_sessions`` batches): a pool
   of *parked* sessions (max(16, N/20): not admitted, in a tool, asking for a model no node
   serves, so they stay pooled and are valued every tick but are never admitted), and admitted
   ones: 50 % in a tool (the interrupt candidates), 20 % running, 30 % idle; prefix residency
   for each, 400 tool durations in the history, and ``--nodes`` healthy nodes whose capacity
   fits every reservation and the pool twice over (so no interrupt is ever needed).
2. **Services** ``tools``, ``valuation`` and ``planner`` run as real subprocesses
   (``python -m services.<name>``, the environment plus TAO_NATS_URL / TAO_REDIS_URL /
   TAO_NAMESPACE / TAO_DOMAIN; TAO_DEBOUNCE_S etc. pass through), logging to files.
3. **Latency** — a sample takes a parked session whose tool call is open and publishes, at t0,
   its next ``SessionRequest`` (gateway ``bench``, a served model): in a harness without
   hooks the gateway infers the tool end from exactly this request (DESIGN 4). t1 is when the
   ``admit`` Placement for it arrives on ``tao.v1.placement.bench`` (an ephemeral,
   deliver-new consumer in this process; same ``perf_counter`` clock). Variant ``hook``:
   a hook ``ToolEnd`` is published first, then the request; t0 is before the ToolEnd.
   Samples are sequential, ``--gap-ms`` apart; after each the session is parked again
   (a direct store write). ``burst``: ``--burst`` requests published at once.
   Path: bus → tools (store write, ``Wake``) → valuation (debounce, tick, snapshot) →
   planner (solve on its loop or, past ``INLINE_PAIRS``, in a worker; Lua apply, JetStream
   placement) → bus → here.
4. **Where the time goes** — joined from the services' JSON log lines (wall-clock stamps):
   the tools line of the request, the planner line that admitted it and the valuation line of
   the same tick.
5. **Tick time** — with the services stopped, the same code in this process against the same
   Redis state: ``wake tick`` is ``Valuator.run_tick("wake", {session})``, the tick on the
   tool end → placement path (it reads the named session and every node, reuses the rest of
   the pool, a context pressure and a history younger than 1 s; each plan applied is passed
   to the valuator as the planner publishes it); then
   ``Valuator.run_tick`` as a periodic tick (store reads, every admitted session's context,
   ``value_snapshot``, probe marks, encode), snapshot decode, ``decide`` (where the planner
   runs it), ``store.apply``; each iteration first turns one parked session into a waiting,
   eligible one (so the planner has one admit to apply).

Servers: TAO_NATS_URL / TAO_REDIS_URL, else 127.0.0.1:4222 / 6379 if they answer, else
embedded ones. Numbers on a shared 2-core machine are noisy: the load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO

import msgspec
import orjson
import redis.asyncio as aioredis
import structlog

from services.planner.handlers import decode_snapshot, plan_msg, solves_inline
from services.valuation.handlers import Valuator, params_from
from shared.contracts import subjects
from shared.contracts.codec import decode, encode
from shared.contracts.plan import Placement
from shared.contracts.session import SessionRequest
from shared.contracts.tool import ToolEnd
from shared.contracts.wake import Wake
from shared.core.planner import warm_up
from shared.core.policies import get_policy
from shared.core.policies.base import PlanOptions
from shared.core.session import Session, ToolCall, on_request
from shared.core.tick import Decision, TickSnapshot, decide, policy_rules, value_snapshot
from shared.infra import Bus, Delivery, EmbeddedServers, FakeBus, nats_answers, redis_answers
from shared.infra.settings import Settings
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate, SessionFn

MODEL = "bench-model"
PARKED = "bench-parked"  # a model no node serves: parked sessions stay in the pool
GATEWAY = "bench"
TOOLS = ("bash", "read", "edit", "grep", "test")
RESERVE = 512


def pct(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty list."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(-(-q * len(s) // 100)) - 1))
    return s[k]


@dataclass(slots=True)
class World:
    """What one N's seed left in the store."""

    parked: list[str]
    tokens: dict[str, int]
    calls: dict[str, str] = field(default_factory=dict)
    cursor: int = 0

    def take(self) -> str:
        sid = self.parked[self.cursor % len(self.parked)]
        self.cursor += 1
        return sid


def parked_session(sid: str, tokens: int, call_id: str, at: float, source: str) -> Session:
    call = ToolCall(call_id=call_id, tool="bash", started_at=at - 2.0, source=source)
    return Session(
        id=sid, version=1, activity="tool", tokens=tokens, model=PARKED, gateway_id=GATEWAY,
        tool=call, turns=3, created_at=at - 60.0, updated_at=at,
    )  # fmt: skip


def repark(world: World, sid: str, source: str) -> SessionFn:
    """Release the sample session and put it back in the pool with a new open call."""
    call_id = f"c{uuid.uuid4().hex[:10]}"
    world.calls[sid] = call_id
    at = time.time()

    def step(s: Session | None) -> Session | None:
        if s is None:
            return None
        fresh = parked_session(sid, world.tokens[sid], call_id, at, source)
        return msgspec.structs.replace(fresh, version=s.version + 1, created_at=s.created_at)

    return step


async def seed(store: Store, n: int, nodes: int, rng: random.Random) -> World:
    """N sessions (module docstring mix), residency, tool history and the nodes."""
    now = time.time()
    node_ids = [f"bn{j}" for j in range(nodes)]
    n_park = max(16, n // 20)
    recs: list[Session] = []
    res: list[tuple[str, str, int, float]] = []
    world = World(parked=[], tokens={})
    for i in range(n):
        sid = f"s{i:06d}"
        tokens = rng.randint(1_000, 30_000)
        node = node_ids[i % nodes]
        res.append((sid, node, tokens * 9 // 10 // 16 * 16, now - rng.uniform(0.0, 30.0)))
        if i < n_park:
            world.parked.append(sid)
            world.tokens[sid] = tokens
            world.calls[sid] = f"c{i}"
            recs.append(parked_session(sid, tokens, f"c{i}", now, "gateway"))
            continue
        u = rng.random()
        base = Session(
            id=sid, version=1, node=node, weight=tokens + RESERVE, tokens=tokens, model=MODEL,
            gateway_id="seed", turns=rng.randint(1, 30), created_at=now - 600.0,
            updated_at=now - rng.uniform(0.0, 20.0),
        )  # fmt: skip
        if u < 0.5:
            started = now - rng.uniform(0.1, 20.0)
            call = ToolCall(
                call_id=f"c{i}", tool=rng.choice(TOOLS), started_at=started,
                source="hook" if u < 0.25 else "gateway",
                deadline=started + 120.0 if u < 0.1 else None,
            )  # fmt: skip
            recs.append(msgspec.structs.replace(base, activity="tool", tool=call))
        elif u < 0.7:
            recs.append(msgspec.structs.replace(base, activity="running", request_id=f"r{i}"))
        else:
            recs.append(msgspec.structs.replace(base, activity="idle"))
    admitted = sum(r.weight for r in recs)
    demand = sum(world.tokens.values()) + RESERVE * n_park
    cap = 2 * (admitted + demand) // nodes + 1_000_000
    for nid in node_ids:
        await store.put_node_status(
            nid,
            NodeUpdate(
                url=f"http://127.0.0.1:1/{nid}", capacity_tokens=cap, target_utilisation=0.9,
                healthy=True, models=frozenset({MODEL}), block_size=16, updated_at=now,
            ),
        )  # fmt: skip
    for lo in range(0, n, 256):
        await store.update_sessions([(r.id, create(r)) for r in recs[lo : lo + 256]])
    await store.put_residencies(res)
    await store.record_tools(
        [(rng.choice(TOOLS), rng.lognormvariate(0.5, 1.0), False) for _ in range(400)]
    )
    return world


class Placements:
    """The bench gateway's placement consumer: admit arrival times per session."""

    def __init__(self) -> None:
        self.waiters: dict[str, asyncio.Future[float]] = {}

    def expect(self, sid: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiters[sid] = fut
        return fut

    async def on_placement(self, p: Placement, d: Delivery) -> None:
        t = time.perf_counter()
        fut = self.waiters.get(p.session_id)
        if p.kind == "admit" and fut is not None and not fut.done():
            del self.waiters[p.session_id]
            fut.set_result(t)


@dataclass(slots=True)
class Sample:
    sid: str
    latency_ms: float | None
    t0_wall: float


async def one_sample(
    bus: Bus, store: Store, world: World, pl: Placements, hook: bool, timeout_s: float
) -> Sample:
    sid = world.take()
    fut = pl.expect(sid)
    t0, w0 = time.perf_counter(), time.time()
    if hook:
        await bus.publish_msg(
            ToolEnd(session_id=sid, call_id=world.calls[sid], ended_at=w0, tool="bash",
                    source="hook", duration_s=2.0)
        )  # fmt: skip
    await bus.publish_msg(
        SessionRequest(
            session_id=sid, request_id=uuid.uuid4().hex, model=MODEL, arrived_at=time.time(),
            gateway_id=GATEWAY, prompt_tokens_estimate=world.tokens[sid],
        )
    )  # fmt: skip
    try:
        t1: float | None = await asyncio.wait_for(fut, timeout_s)
    except TimeoutError:
        pl.waiters.pop(sid, None)
        t1 = None
    await store.update_session(sid, repark(world, sid, "hook" if hook else "gateway"))
    return Sample(sid, None if t1 is None else (t1 - t0) * 1000.0, w0)


async def burst(
    bus: Bus, store: Store, world: World, pl: Placements, size: int, timeout_s: float
) -> list[float | None]:
    sids = [world.take() for _ in range(min(size, len(world.parked)))]
    futs = [pl.expect(s) for s in sids]
    t0 = time.perf_counter()
    msgs = [
        SessionRequest(session_id=s, request_id=uuid.uuid4().hex, model=MODEL,
                       arrived_at=time.time(), gateway_id=GATEWAY,
                       prompt_tokens_estimate=world.tokens[s])
        for s in sids
    ]  # fmt: skip
    await asyncio.gather(*(bus.publish_msg(m) for m in msgs))
    done, _ = await asyncio.wait(futs, timeout=timeout_s)
    out = [(f.result() - t0) * 1000.0 if f in done else None for f in futs]
    for s in sids:
        pl.waiters.pop(s, None)
        await store.update_session(s, repark(world, s, "gateway"))
    return out


# -- the services as subprocesses -----------------------------------------------------------

SERVICES = ("tools", "valuation", "planner")
Procs = list[tuple[str, "subprocess.Popen[bytes]", IO[bytes]]]


def create(rec: Session) -> SessionFn:
    def step(_: Session | None) -> Session:
        return rec

    return step


def service_env(nats_url: str, redis_url: str, ns: str, domain: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TAO_IDLE_TIMEOUT_S", "3600")  # seeded idle sessions must not expire mid-run
    env.update(TAO_NATS_URL=nats_url, TAO_REDIS_URL=redis_url, TAO_NAMESPACE=ns,
               TAO_DOMAIN=domain, PYTHONPATH=os.getcwd())  # fmt: skip
    return env


def _log_lines(path: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    if not path.exists():
        return out
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            rec = orjson.loads(line)
            if isinstance(rec, dict):
                out.append(rec)
    return out


def _has_event(path: Path, event: str) -> bool:
    return path.exists() and f'"event":"{event}"'.encode() in path.read_bytes()


async def start(env: dict[str, str], log_dir: Path, cpus: str | None) -> Procs:
    """Start the three services; ready = planner resynced and valuation ticked twice."""
    procs: Procs = []
    for name in SERVICES:
        cmd = [sys.executable, "-m", f"services.{name}"]
        if cpus is not None:
            cmd = ["taskset", "-c", cpus, *cmd]
        log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        procs.append((name, subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL), log))  # fmt: skip
    deadline = time.monotonic() + 120.0
    while time.monotonic() < deadline:
        dead = [(n, p.returncode) for n, p, _ in procs if p.poll() is not None]
        if dead:
            await stop(procs)
            raise RuntimeError(f"service exited: {dead} (logs in {log_dir})")
        ticks = (log_dir / "valuation.log").read_bytes().count(b'"valuation_tick"')
        if (
            _has_event(log_dir / "planner.log", "placements_resynced")
            and _has_event(log_dir / "tools.log", "service_started")
            and ticks >= 2
        ):
            return procs
        await asyncio.sleep(0.1)  # polling children at start-up
    await stop(procs)
    raise RuntimeError(f"services not ready in 120 s (logs in {log_dir})")


async def stop(procs: Procs) -> None:
    for _, p, _ in procs:
        if p.poll() is None:
            p.terminate()
    for _, p, log in procs:
        try:
            await asyncio.to_thread(p.wait, 10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()


# -- where the time goes: the services' log stamps ------------------------------------------

SEGMENTS = ("→ tools wrote", "→ valuation published", "→ planner logged", "solve (log)", "total")


def _ts(rec: dict[str, object]) -> float:
    return datetime.fromisoformat(str(rec["timestamp"]).replace("Z", "+00:00")).timestamp()


def profile(log_dir: Path, samples: list[Sample]) -> dict[str, list[float]]:
    """Per sample: t0 → the tools line naming it → the valuation line of the tick whose plan
    admitted it → that plan line (all wall clock, ms from t0)."""
    tools: dict[str, list[float]] = {}
    for rec in _log_lines(log_dir / "tools.log"):
        if rec.get("event") == "session_events" and rec.get("session"):
            tools.setdefault(str(rec["session"]), []).append(_ts(rec))
    val = {
        int(r["tick"]): _ts(r)  # type: ignore[call-overload]
        for r in _log_lines(log_dir / "valuation.log")
        if r.get("event") == "valuation_tick"
    }
    plans = sorted(
        (_ts(r), int(r["tick"]), float(r["solve_ms"]))  # type: ignore[call-overload,arg-type]
        for r in _log_lines(log_dir / "planner.log")
        if r.get("event") == "plan_tick" and r.get("admitted")
    )
    out: dict[str, list[float]] = {s: [] for s in SEGMENTS}
    for smp in samples:
        if smp.latency_ms is None:
            continue
        t_tools = next((t for t in tools.get(smp.sid, []) if t >= smp.t0_wall), None)
        if t_tools is None:
            continue
        plan = next((p for p in plans if p[0] >= t_tools), None)
        if plan is None or plan[1] not in val:
            continue
        t_val = val[plan[1]]
        vals = ((t_tools - smp.t0_wall), (t_val - smp.t0_wall), (plan[0] - smp.t0_wall))
        for seg, v in zip(SEGMENTS[:3], vals, strict=True):
            out[seg].append(v * 1000.0)
        out["solve (log)"].append(plan[2])
        out["total"].append(smp.latency_ms)
    return out


def tick_counts(log_dir: Path) -> tuple[int, int]:
    """(valuation ticks, ticks that read only named sessions) in the log."""
    lines = [r for r in _log_lines(log_dir / "valuation.log") if r.get("event") == "valuation_tick"]
    return len(lines), sum(r.get("named") is not None for r in lines)


def plan_counts(log_dir: Path) -> tuple[int, int, int]:
    """(plan ticks, plans discarded by the signature check, plans truncated) in the log."""
    lines = [r for r in _log_lines(log_dir / "planner.log") if r.get("event") == "plan_tick"]
    return (len(lines), sum(bool(r.get("discarded")) for r in lines),
            sum(bool(r.get("truncated")) for r in lines))  # fmt: skip


# -- tick time, in process -------------------------------------------------------------------

TICK_PARTS = ("wake tick", "valuation run_tick", "  reads", "  value", "decode", "solve", "apply",
              "total")  # fmt: skip


async def tick_times(store: Store, world: World, ticks: int) -> dict[str, list[float]]:
    """A wake tick, then Valuator.run_tick + decode + decide + store.apply, as the services do,
    with one waiting eligible session per tick; plus the tick's pool reads (the valuation's
    cached reader) and valuation alone."""
    settings = Settings.from_env()
    quiet = structlog.wrap_logger(None, wrapper_class=structlog.make_filtering_bound_logger(40))
    fake = FakeBus()
    policy = get_policy(settings.policy)
    valuator = Valuator(store=store, bus=fake, log=quiet, params=params_from(settings),
                        idle_timeout_s=settings.idle_timeout_s, clock=time.time,
                        rules=policy_rules(policy))  # fmt: skip  # as the service reads them
    await asyncio.to_thread(warm_up)
    out: dict[str, list[float]] = {p: [] for p in TICK_PARTS}

    def solve(core: TickSnapshot) -> Decision:
        end = time.monotonic() + settings.planner_time_limit_ms / 1000.0
        opts = PlanOptions(budget=settings.planner_budget, expired=lambda: time.monotonic() > end)
        return decide(core, policy, opts)

    await valuator.run_tick("period")  # the whole read a wake tick's named read starts from
    for _ in range(ticks):
        sid = world.take()
        await store.update_session(sid, wake_step(sid, world.tokens[sid]))
        w0 = time.perf_counter()
        await valuator.run_tick("wake", {sid})  # the tool end -> placement path's tick
        out["wake tick"].append((time.perf_counter() - w0) * 1000.0)
        fake.published.clear()
        t0 = time.perf_counter()
        await valuator.run_tick("bench")
        t1 = time.perf_counter()
        (data,) = [d for subj, d, _ in fake.published if subj == subjects.valuation_snapshot()]
        snap = decode_snapshot(data)
        t2 = time.perf_counter()
        core = snap.core
        if solves_inline(core):  # as the planner
            decision = solve(core)
        else:
            decision = await asyncio.to_thread(solve, core)
        t3 = time.perf_counter()
        applied = await store.apply(decision, time.time())
        t4 = time.perf_counter()
        if not applied.admitted:
            raise RuntimeError(f"tick bench: {sid} was not admitted ({applied})")
        plan = plan_msg(decision, policy.name, 0.0)  # as the planner publishes it
        await valuator.on_plan(plan, NO_DELIVERY)
        fake.published.clear()
        for part, a, b in (("valuation run_tick", t0, t1), ("decode", t1, t2),
                           ("solve", t2, t3), ("apply", t3, t4), ("total", t0, t4)):  # fmt: skip
            out[part].append((b - a) * 1000.0)
        # the same tick's reads and valuation, timed step by step (not part of "total")
        r0 = time.perf_counter()
        assert valuator.reader is not None
        sessions, residency, views = await valuator.reader.tick_read("pool")  # the service's
        history = await store.history()
        r1 = time.perf_counter()
        value_snapshot(sessions, views, residency, history, time.time(), params=valuator.params)
        r2 = time.perf_counter()
        out["  reads"].append((r1 - r0) * 1000.0)
        out["  value"].append((r2 - r1) * 1000.0)
        await store.update_session(sid, repark(world, sid, "gateway"))
    return out


NO_DELIVERY = Delivery(subjects.plan(), {}, 1, None, 0.0)


def wake_step(sid: str, tokens: int) -> SessionFn:
    """What the tools service writes for the session's next request (``on_request``)."""

    def step(s: Session | None) -> Session | None:
        if s is None:
            return None
        new, _ = on_request(s, uuid.uuid4().hex, time.time(), model=MODEL, gateway_id=GATEWAY,
                            tokens_estimate=tokens)  # fmt: skip
        return new

    return step


async def round_trips(bus: Bus, redis: aioredis.Redis, n: int = 200) -> dict[str, list[float]]:
    """Baseline round trips from this process at the time: Redis PING, core-NATS flush
    (PING/PONG), a JetStream publish awaiting its ack (ms)."""
    out: dict[str, list[float]] = {"redis PING": [], "NATS flush": [], "JetStream publish": []}
    data = encode(Wake(reason="bench", ts=0.0))
    for _ in range(n):
        t0 = time.perf_counter()
        await redis.ping()
        t1 = time.perf_counter()
        await bus.nc.flush()
        t2 = time.perf_counter()
        await bus.publish(subjects.placement("rtt"), data)
        t3 = time.perf_counter()
        for k, a, b in (("redis PING", t0, t1), ("NATS flush", t1, t2),
                        ("JetStream publish", t2, t3)):  # fmt: skip
            out[k].append((b - a) * 1000.0)
    return out


# -- report ------------------------------------------------------------------------------------


def servers() -> tuple[str, str, EmbeddedServers | None]:
    nats = os.environ.get("TAO_NATS_URL") or None
    red = os.environ.get("TAO_REDIS_URL") or None
    if nats is None and nats_answers("nats://127.0.0.1:4222"):
        nats = "nats://127.0.0.1:4222"
    if red is None and redis_answers("redis://127.0.0.1:6379/0"):
        red = "redis://127.0.0.1:6379/0"
    emb = None
    if nats is None or red is None:
        emb = EmbeddedServers(nats=nats is None, redis=red is None).start()
    return nats or emb.nats_url, red or emb.redis_url, emb  # type: ignore[union-attr]


def lat_row(name: str, n: int, xs: list[float | None]) -> str:
    ok = [x for x in xs if x is not None]
    miss = len(xs) - len(ok)
    if not ok:
        return f"| {n:,} | {name} | 0 | {miss} | – | – | – | – |"
    return (
        f"| {n:,} | {name} | {len(ok)} | {miss} | {pct(ok, 50):.2f} | {pct(ok, 90):.2f} "
        f"| {pct(ok, 99):.2f} | {max(ok):.2f} |"
    )


async def run_n(args: argparse.Namespace, n: int, urls: tuple[str, str]) -> dict[str, object]:
    nats_url, redis_url = urls
    ns, domain = f"b{uuid.uuid4().hex[:12]}", f"b{uuid.uuid4().hex[:12]}"
    log_dir = Path(tempfile.mkdtemp(prefix=f"tao-cl-{n}-"))
    redis = aioredis.Redis.from_url(redis_url)
    store = Store(redis, domain)
    bus = await Bus.connect(nats_url, name="bench-control-loop", namespace=ns)
    procs: Procs | None = None
    out: dict[str, object] = {"n": n, "logs": str(log_dir)}
    try:
        await bus.ensure_streams()
        t = time.perf_counter()
        world = await seed(store, n, args.nodes, random.Random(args.seed + n))
        print(f"[N={n}] seeded in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        env = service_env(nats_url, redis_url, ns, domain)
        procs = await start(env, log_dir, args.taskset)
        pl = Placements()
        await bus.consume(
            subjects.STREAM_PLACEMENT, "bench", lambda b: decode(b, Placement), pl.on_placement,
            filter_subject=subjects.placement(GATEWAY), ephemeral=True, deliver="new",
        )  # fmt: skip
        for _ in range(5):  # warm-up: every consumer and code path once
            await one_sample(bus, store, world, pl, False, 10.0)
            await one_sample(bus, store, world, pl, True, 10.0)
        samples: dict[str, list[Sample]] = {"request": [], "hook+request": []}
        for i in range(args.samples):
            for name, hook in (("request", False), ("hook+request", True)):
                samples[name].append(await one_sample(bus, store, world, pl, hook, 5.0))
                await asyncio.sleep(args.gap_ms / 1000.0)
            if i % 50 == 49:
                print(f"[N={n}] {i + 1}/{args.samples} samples", file=sys.stderr)
        bursts: list[float | None] = []
        for _ in range(args.bursts):
            bursts += await burst(bus, store, world, pl, args.burst, 10.0)
            await asyncio.sleep(0.2)
        out["rtt"] = await round_trips(bus, redis)
        out["lat"] = {k: [s.latency_ms for s in v] for k, v in samples.items()}
        out["burst"] = bursts
        out["load"] = os.getloadavg()
        await stop(procs)
        procs = None
        out["profile"] = profile(log_dir, samples["request"])
        out["plans"] = plan_counts(log_dir)
        out["vticks"] = tick_counts(log_dir)
        out["ticks"] = await tick_times(store, world, args.ticks)
    finally:
        if procs is not None:
            await stop(procs)
        await bus.delete_streams()
        await bus.drain()
        await store.clear()
        await redis.aclose()
    return out


def report(results: list[dict[str, object]], args: argparse.Namespace) -> None:
    print("### Tool end → placement latency (ms)\n")
    print("| sessions | variant | samples | timeouts | p50 | p90 | p99 | max |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        lat: dict[str, list[float | None]] = r["lat"]  # type: ignore[assignment]
        for name, xs in lat.items():
            print(lat_row(name, r["n"], xs))  # type: ignore[arg-type]
        print(lat_row(f"burst of {args.burst}", r["n"], r["burst"]))  # type: ignore[arg-type]
    print("\n### Where the time goes (variant `request`, from the services' log stamps, ms)\n")
    print("| sessions | joined | " + " | ".join(SEGMENTS) + " |")
    print("|---|---|" + "---|" * len(SEGMENTS))
    for r in results:
        prof: dict[str, list[float]] = r["profile"]  # type: ignore[assignment]
        cells = [
            f"{statistics.median(prof[s]):.2f} / {pct(prof[s], 99):.2f}" if prof[s] else "–"
            for s in SEGMENTS
        ]
        print(f"| {r['n']:,} | {len(prof[SEGMENTS[0]])} | " + " | ".join(cells) + " |")
    print("\n(cells: p50 / p99)\n")
    for r in results:
        ticks, disc, trunc = r["plans"]  # type: ignore[misc]
        vt, named = r["vticks"]  # type: ignore[misc]
        print(f"- N={r['n']:,}: {ticks} plan ticks, {disc} discarded (a selected session's "
              f"version moved), {trunc} truncated; {vt} valuation ticks, {named} of them "
              "named reads")  # fmt: skip
    print()
    print("### Tick time at N sessions (in-process, same code and Redis; ms)\n")
    print("| sessions | ticks | " + " | ".join(TICK_PARTS) + " |")
    print("|---|---|" + "---|" * len(TICK_PARTS))
    for r in results:
        tk: dict[str, list[float]] = r["ticks"]  # type: ignore[assignment]
        cells = [f"{pct(tk[p], 50):.1f} / {pct(tk[p], 99):.1f}" for p in TICK_PARTS]
        print(f"| {r['n']:,} | {len(tk['total'])} | " + " | ".join(cells) + " |")
    print("\n(cells: p50 / p99)\n")
    print("### Baseline round trips from the benchmark process (ms)\n")
    print("| sessions | round trip | p50 | p99 |")
    print("|---|---|---|---|")
    for r in results:
        rtt: dict[str, list[float]] = r["rtt"]  # type: ignore[assignment]
        for k, xs in rtt.items():
            print(f"| {r['n']:,} | {k} | {pct(xs, 50):.3f} | {pct(xs, 99):.3f} |")
    print()
    for r in results:
        la = r["load"]
        print(f"- N={r['n']:,}: load average at the end of sampling {la[0]:.2f} / {la[1]:.2f} "  # type: ignore[index]
              f"/ {la[2]:.2f}; service logs in {r['logs']}")  # type: ignore[index]  # fmt: skip


async def run(args: argparse.Namespace) -> int:
    nats_url, redis_url, emb = servers()
    print(f"nats {nats_url}, redis {redis_url}, cpus {os.cpu_count()}, "
          f"load {os.getloadavg()}", file=sys.stderr)  # fmt: skip
    try:
        results = [await run_n(args, n, (nats_url, redis_url)) for n in args.sessions]
    finally:
        if emb is not None:
            emb.stop()
    report(results, args)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.control_loop", description=__doc__.split("\n")[0])
    p.add_argument("--sessions", default="100,1000,10000",
                   type=lambda s: [int(x) for x in s.split(",") if x])  # fmt: skip
    p.add_argument("--samples", type=int, default=200, help="sequential samples per variant")
    p.add_argument("--gap-ms", type=float, default=20.0, help="pause between samples")
    p.add_argument("--burst", type=int, default=16, help="requests per burst")
    p.add_argument("--bursts", type=int, default=5)
    p.add_argument("--ticks", type=int, default=40, help="in-process ticks per N")
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--taskset", default=None, help="CPU list for the service processes")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.sessions) or args.samples < 1 or args.nodes < 1:
        p.error("--sessions, --samples and --nodes must be positive")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
