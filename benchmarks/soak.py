"""Soak: many agent sessions' events through the whole control plane for minutes; memory, latency
percentiles, lost requests and the idle-session sweep over time.

A script, not a test: it prints markdown tables to stdout (progress goes to stderr), and stops
by itself (``--minutes`` of load, then a drain of ``--drain-s``)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.soak                     # 10,000 sessions, 10 min
    PYTHONPATH=. .venv/bin/python -m benchmarks.soak --sessions 500 --minutes 1   # a quick look

What runs: the stack of ``tao up`` (``shared.cli.stack.Stack``: embedded NATS and Valkey that
check one user per role, two simnodes with room for every session, the five services) with
``TAO_IDLE_TIMEOUT_S=--idle-s``. This process plays the gateways of ``--sessions`` agents at
once, connected as the ``gateway`` user, with gateway id ``soak`` (its tool events, as a hook
would send them, as the ``ops`` user, which ``tao demo`` uses for them too): each agent sends a
``SessionRequest``, waits for its ``admit`` placement (unless its session is still admitted),
"generates" for ``--model-s``, reports the ``SessionResponse`` with a tool call, the tool's
``ToolStart``, runs the tool, reports its ``ToolEnd`` and sends the next request: four events
a turn, the turn's length set so that all the agents together offer ``--rate`` events/s. After
``--turns`` turns an agent ends its session (``SessionEnd``), except one in ``--idle-share``,
which just stops (a harness that died): the valuation service must end it after the idle
timeout. Each finished agent is replaced by a new one, so the live count stays constant.

Measured: the events offered per second (what this process managed to publish); per minute,
the admit latency (request → ``admit`` placement) p50/p99 of the requests that had to wait;
every 10 s each child's RSS (``/proc/<pid>/status``), reported as the least-squares slope
after ``--warmup-s``; the idle sessions the sweep ended and how long after their last event;
the stored sessions (the domain's index set) over time. After the load stops, the drain waits
for every outstanding request: one still waiting then is **lost**.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import os
import random
import signal
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

from benchmarks.control_loop import pct
from shared.cli.stack import Stack, StackConfig
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.plan import Placement
from shared.contracts.session import (
    SessionEnd,
    SessionRequest,
    SessionResponse,
    ToolCallInfo,
    Usage,
)
from shared.contracts.tool import ToolEnd, ToolStart
from shared.infra import Bus, Delivery
from shared.infra.keys import Keys

GATEWAY = "soak"
MODEL = "tao-sim"
EVENTS_PER_TURN = 4
SAMPLE_S = 10.0


@dataclass(slots=True)
class Agent:
    sid: str
    turns_left: int
    idle: bool
    tokens: int
    admitted: bool = False
    waiting_since: float | None = None
    request_id: str = ""
    call_id: str = ""
    last_event: float = 0.0


@dataclass
class Run:
    """Everything measured, filled in as the run goes."""

    started: float = field(default_factory=time.monotonic)
    published: int = 0
    publish_errors: int = 0
    admits: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    rss: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    stored: list[tuple[float, int]] = field(default_factory=list)
    idle_started: dict[str, float] = field(default_factory=dict)
    idle_ended: list[float] = field(default_factory=list)
    ends_seen: int = 0
    rate_per_min: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def minute(self) -> int:
        return int((time.monotonic() - self.started) // 60)


class Driver:
    """The agents: a timer heap of their next steps, published in batches."""

    def __init__(self, bus: Bus, hooks: Bus, args: argparse.Namespace, run: Run) -> None:
        self.bus, self.args, self.run = bus, args, run
        self.hooks = hooks
        """Where the tool events go (a gateway's user may not publish them)."""
        self.rng = random.Random(args.seed)
        self.agents: dict[str, Agent] = {}
        self.heap: list[tuple[float, int, str, str]] = []
        self.seq = 0
        turn_s = EVENTS_PER_TURN * args.sessions / args.rate
        self.tool_s = max(0.05, turn_s - args.model_s)
        self.stopping = False
        self.spawned = 0

    # -- agents ------------------------------------------------------------------------------

    def spawn(self, at: float) -> None:
        self.spawned += 1
        sid = f"soak-{self.args.tag}-{self.spawned}"
        idle = self.rng.random() < self.args.idle_share
        agent = Agent(sid, self.args.turns, idle, self.rng.randint(1_000, 4_000))
        self.agents[sid] = agent
        self.later(at, sid, "request")

    def later(self, at: float, sid: str, step: str) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, sid, step))

    def on_placement(self, p: Placement) -> None:
        agent = self.agents.get(p.session_id)
        if agent is None:
            return
        if p.kind != "admit":
            agent.admitted = False
            return
        agent.admitted = True
        if agent.waiting_since is not None:
            now = time.monotonic()
            self.run.admits[self.run.minute()].append((now - agent.waiting_since) * 1000.0)
            agent.waiting_since = None
            self.later(now + self.args.model_s, agent.sid, "response")

    # -- steps -------------------------------------------------------------------------------

    def step(self, sid: str, step: str, now: float) -> list[object]:
        agent = self.agents.get(sid)
        if agent is None:
            return []
        wall = time.time()
        agent.last_event = now
        if step == "request":
            if self.stopping:
                return []
            agent.request_id = uuid.uuid4().hex[:12]
            msg = SessionRequest(
                session_id=sid, request_id=agent.request_id, model=MODEL, arrived_at=wall,
                gateway_id=GATEWAY, prompt_tokens_estimate=agent.tokens,
            )  # fmt: skip
            if agent.admitted:
                self.later(now + self.args.model_s, sid, "response")
            else:
                agent.waiting_since = now
            return [msg]
        if step == "response":
            agent.call_id = uuid.uuid4().hex[:12]
            agent.tokens += self.rng.randint(100, 400)
            out: list[object] = [
                SessionResponse(
                    session_id=sid, request_id=agent.request_id, node_id="sim0",
                    gateway_id=GATEWAY, finished_at=wall, finish_reason="tool_calls",
                    usage=Usage(prompt_tokens=agent.tokens, completion_tokens=50),
                    tool_calls=[ToolCallInfo(id=agent.call_id, name="bash")],
                ),
                ToolStart(session_id=sid, call_id=agent.call_id, tool="bash", started_at=wall,
                          harness="soak"),
            ]  # fmt: skip
            self.later(now + self.rng.expovariate(1.0 / self.tool_s), sid, "tool_end")
            return out
        # tool_end
        end = ToolEnd(session_id=sid, call_id=agent.call_id, ended_at=wall, tool="bash")
        agent.turns_left -= 1
        if agent.turns_left > 0:
            self.later(now, sid, "request")
            return [end]
        del self.agents[sid]
        self.spawn(now)
        if agent.idle:  # it stops here: the sweep must end it
            self.run.idle_started[sid] = time.time()
            return [end]
        return [end, SessionEnd(session_id=sid, ended_at=wall, gateway_id=GATEWAY)]

    async def publish(self, msgs: list[object]) -> None:
        async def one(m: object) -> None:
            bus = self.hooks if isinstance(m, ToolStart | ToolEnd) else self.bus
            try:
                await bus.publish_msg(m)  # type: ignore[arg-type]
                self.run.published += 1
                self.run.rate_per_min[self.run.minute()] += 1
            except Exception:
                self.run.publish_errors += 1

        for lo in range(0, len(msgs), 512):
            await asyncio.gather(*(one(m) for m in msgs[lo : lo + 512]))

    async def drive(self, until: float) -> None:
        while time.monotonic() < until:
            now = time.monotonic()
            msgs: list[object] = []
            while self.heap and self.heap[0][0] <= now and len(msgs) < 4096:
                _, _, sid, step = heapq.heappop(self.heap)
                msgs += self.step(sid, step, now)
            if msgs:
                await self.publish(msgs)
            else:
                wait = self.heap[0][0] - now if self.heap else 0.05
                await asyncio.sleep(min(max(wait, 0.001), 0.05))  # the agents' own clock

    def waiting(self, older_than_s: float) -> list[str]:
        now = time.monotonic()
        return [
            a.sid
            for a in self.agents.values()
            if a.waiting_since is not None and now - a.waiting_since > older_than_s
        ]


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _children(stack: Stack) -> list[tuple[str, int]]:
    procs = [(name, proc.pid) for name, proc, _ in stack._procs]
    servers = stack._servers
    if servers is not None:
        procs += [
            (Path(str(p.args[0])).name, p.pid)  # type: ignore[index]
            for p in servers._procs
        ]
    return procs


async def sample(stack: Stack, run: Run, domain: str, stop: asyncio.Event) -> None:
    redis = aioredis.Redis.from_url(stack.redis_for("ops"))
    key = Keys(domain).sessions
    try:
        while not stop.is_set():
            t = time.monotonic() - run.started
            for name, pid in _children(stack):
                rss = _rss_mib(pid)
                if rss is not None:
                    run.rss[name].append((t, rss))
            run.stored.append((t, int(await redis.scard(key))))
            print(
                f"soak: {t:6.0f} s  published {run.published:,}  stored {run.stored[-1][1]:,}",
                file=sys.stderr,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SAMPLE_S)
    finally:
        await redis.aclose()


def slope_mib_per_min(points: list[tuple[float, float]], after_s: float) -> float | None:
    pts = [(t, v) for t, v in points if t >= after_s]
    if len(pts) < 3:
        return None
    mt = sum(t for t, _ in pts) / len(pts)
    mv = sum(v for _, v in pts) / len(pts)
    var = sum((t - mt) ** 2 for t, _ in pts)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in pts) / var if var else None


async def main_async(args: argparse.Namespace) -> str:
    args.tag = uuid.uuid4().hex[:6]
    base = {k: v for k, v in os.environ.items() if k not in ("TAO_NATS_URL", "TAO_REDIS_URL")}
    config = StackConfig(
        sim_nodes=2,
        kv_tokens=args.sessions * 12_000,  # room for every session: capacity never binds
        namespace=f"soak{args.tag}",
        domain=f"soak-{args.tag}",
        extra_env={
            "TAO_IDLE_TIMEOUT_S": str(args.idle_s),
            "TAO_LOG_LEVEL": "warning",
            "TAO_HOLD_TIMEOUT_S": "600",
        },
        env=base,
        log_dir=args.log_dir,
    )
    run = Run()
    with Stack(config) as stack:
        print(f"soak: stack up, logs in {stack.log_dir}", file=sys.stderr)
        bus = await Bus.connect(stack.nats_for("gateway"), name="soak", namespace=config.namespace)
        hooks = await Bus.connect(
            stack.nats_for("ops"), name="soak-hooks", namespace=config.namespace
        )
        driver = Driver(bus, hooks, args, run)

        async def on_placement(p: Placement, d: Delivery) -> None:
            driver.on_placement(p)

        async def on_end(e: SessionEnd, d: Delivery) -> None:
            run.ends_seen += 1
            began = run.idle_started.pop(e.session_id, None)
            if began is not None and e.reason == "idle_timeout":
                run.idle_ended.append(time.time() - began)

        await bus.consume(
            subjects.STREAM_PLACEMENT, GATEWAY, lambda b: decode(b, Placement), on_placement,
            filter_subject=subjects.placement(GATEWAY), ephemeral=True, deliver="new",
        )  # fmt: skip
        await bus.subscribe(
            subjects.session_events("end"), GATEWAY, lambda b: decode(b, SessionEnd), on_end
        )
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample(stack, run, config.domain or "", stop))
        run.started = time.monotonic()
        t0 = time.monotonic()
        for i in range(args.sessions):  # arrivals spread over the first turn
            driver.spawn(t0 + (i / args.sessions) * (args.model_s + driver.tool_s))
        await driver.drive(t0 + args.minutes * 60.0)
        load_s = time.monotonic() - t0
        driver.stopping = True
        deadline = time.monotonic() + args.drain_s
        while driver.waiting(0.0) and time.monotonic() < deadline:
            await driver.drive(time.monotonic() + 1.0)
        lost = driver.waiting(0.0)
        idle_deadline = time.monotonic() + args.idle_s + 30.0
        while run.idle_started and time.monotonic() < idle_deadline:
            recent = [t for t in run.idle_started.values() if time.time() - t < args.idle_s + 15]
            if not recent:
                break
            await asyncio.sleep(1.0)  # waiting for the sweep of the last idle sessions
        uncollected = [
            s for s, t in run.idle_started.items() if time.time() - t > args.idle_s + 15.0
        ]
        stop.set()
        await sampler
        failed = stack.failed()
        await bus.drain()
        await hooks.drain()
    return report(args, run, load_s, lost, uncollected, failed)


def report(
    args: argparse.Namespace,
    run: Run,
    load_s: float,
    lost: list[str],
    uncollected: list[str],
    failed: list[tuple[str, int]],
) -> str:
    lines = [
        f"**Soak** — {args.sessions:,} live sessions, offered rate target {args.rate:,} events/s, "
        f"{args.minutes:g} min of load, idle timeout {args.idle_s:g} s, load average "
        f"{os.getloadavg()[0]:.2f} at the end",
        "",
        "| what | value |",
        "|---|---|",
        f"| events published | {run.published:,} ({run.published / load_s:,.0f}/s over the load) |",
        f"| publish errors | {run.publish_errors} |",
        f"| requests lost (still waiting after a {args.drain_s:g} s drain) | {len(lost)} |",
        f"| idle sessions ended by the sweep | {len(run.idle_ended)} (after their last event: "
        + (
            f"p50 {pct(run.idle_ended, 50):.1f} s, max {max(run.idle_ended):.1f} s)"
            if run.idle_ended
            else "none)"
        )
        + " |",
        f"| idle sessions not collected within timeout + 15 s | {len(uncollected)} |",
        f"| services that exited | {failed or 'none'} |",
        "",
        "| minute | events/s offered | admits waited for | admit p50 ms | admit p99 ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for m in sorted(set(run.rate_per_min) | set(run.admits)):
        xs = run.admits.get(m, [])
        cells = (f"{pct(xs, 50):.1f}", f"{pct(xs, 99):.1f}") if xs else ("–", "–")
        lines.append(
            f"| {m + 1} | {run.rate_per_min.get(m, 0) / 60:,.0f} | {len(xs):,} | {cells[0]} | "
            f"{cells[1]} |"
        )
    lines += [
        "",
        f"| process | RSS first MiB | RSS last MiB | slope after {args.warmup_s:g} s, MiB/min |",
        "|---|---:|---:|---:|",
    ]
    for name, pts in sorted(run.rss.items()):
        slope = slope_mib_per_min(pts, args.warmup_s)
        shown = f"{slope:+.2f}" if slope is not None else "–"
        lines.append(f"| {name} | {pts[0][1]:.1f} | {pts[-1][1]:.1f} | {shown} |")
    if run.stored:
        marks = [*run.stored[:: max(1, len(run.stored) // 8)], run.stored[-1]]
        lines += [
            "",
            "Stored sessions over time: " + ", ".join(f"{t:.0f} s: {n:,}" for t, n in marks),
        ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=10_000, help="live agents at once")
    p.add_argument("--rate", type=int, default=50_000, help="events/s all agents offer")
    p.add_argument("--minutes", type=float, default=10.0, help="minutes of load")
    p.add_argument("--turns", type=int, default=8, help="turns per session")
    p.add_argument("--model-s", type=float, default=0.2, help="each model call's length, s")
    p.add_argument("--idle-share", type=float, default=0.1, help="sessions that stop silently")
    p.add_argument("--idle-s", type=float, default=60.0, help="TAO_IDLE_TIMEOUT_S")
    p.add_argument("--warmup-s", type=float, default=120.0, help="RSS slope measured after")
    p.add_argument("--drain-s", type=float, default=60.0, help="wait for outstanding requests")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--log-dir", default=None, help="the stack's logs (default: a temp folder)")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the stack on the way out
    print(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
