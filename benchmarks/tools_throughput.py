"""Tools-service throughput: tool events through one tools process, end to end, in events/s.

A script, not a test: it prints a markdown table to stdout (progress goes to stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.tools_throughput                  # 100k x 3 runs
    PYTHONPATH=. .venv/bin/python -m benchmarks.tools_throughput --events 20000 --runs 1
    PYTHONPATH=. .venv/bin/python -m benchmarks.tools_throughput --taskset 1     # pin the service
    PYTHONPATH=. .venv/bin/python -m benchmarks.tools_throughput --profile /tmp/tools.prof
    PYTHONPATH=. .venv/bin/python -m benchmarks.tools_throughput --py-spy /tmp/tools.txt  # sampled
    PYTHONPATH=. .venv/bin/python -m benchmarks.tools_throughput --shards 1,2   # TAO_SHARD

What one run does, in a fresh namespace and domain (streams and keys removed afterwards):

1. creates ``--sessions`` session records in a tool (``on_request`` + ``on_response`` with a
   tool call), as the gateway's events would have left them;
2. publishes ``--events`` tool events into ``TAO_V1_TOOL`` *before* the service starts, per
   session the cycle ToolStart (hook), ToolProgress × 2, ToolEnd (with a duration), sessions
   interleaved round robin (so every bus batch touches many sessions, each in its order);
3. starts ``python -m services.tools`` as a subprocess (``taskset -c`` with ``--taskset``) and
   polls the JetStream info of its durable consumer every 10 ms; the rate is the events acked
   between the first poll that sees the consumer and the poll that sees nothing pending nor
   unacknowledged, over that time (process start-up is not counted);
4. checks the result: every session record equals what the service's steps applied one by
   one in stream order give, and the tool statistics hold every recorded duration.

``--shards N[,N…]``: per value, N tools processes with ``TAO_SHARD=i/N`` (each its own
durable, ``tools-<i>of<N>-TAO_V1_TOOL``; shared/infra/shard.py) instead of one; the rate is
the events over the time until every shard's durable has nothing pending nor unacknowledged
(each shard receives every event and applies its own sessions').

Servers: ``TAO_NATS_URL`` / ``TAO_REDIS_URL``, else 127.0.0.1:4222 / 6379 if they answer, else
embedded ones (``shared.infra.embedded``); ``--embedded-nats`` always starts a fresh NATS (a
long-running shared nats-server 2.9.10 here stalled push delivery of the backlog at ~74.5k
messages in every run, a fresh one did not: a run that stops progressing is reported as
STALLED instead of timed). The table shows the median and the best of
``--runs``, and the 1-minute load average before and after (a 2-core machine shared with other
work gives noisy numbers; compare variants back to back).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from nats.js.errors import NotFoundError

from services.tools.steps import Outcome, tool_end_step, tool_progress_step, tool_start_step
from shared.contracts import ToolEnd, ToolEvent, ToolProgress, ToolStart, encode, subjects
from shared.core.predictor import History, ToolStats, update
from shared.core.session import Session, on_request, on_response
from shared.infra import Bus, EmbeddedServers, nats_answers, redis_answers
from shared.infra.shard import Shard
from shared.infra.store import Store

LOCAL_NATS = "nats://127.0.0.1:4222"
LOCAL_REDIS = "redis://127.0.0.1:6379"
TOOLS = ("bash", "python", "grep", "edit")


def initial(i: int) -> Session:
    """Session ``i`` after its first response asked for a tool (what tool events then meet)."""
    s, _ = on_request(Session(id=f"ses_{i:05d}"), "r0", 1.0, model="m", gateway_id="gw0")
    return on_response(s, 2.0, total_tokens=1000 + i, tool_calls=[("c0", "bash")])


def _const(s: Session) -> Callable[[Session | None], Session]:
    """A transition that writes ``s`` whatever is stored."""
    return lambda _: s


def events(n_sessions: int, n_events: int) -> list[ToolEvent]:
    """The stream: per session Start, Progress, Progress, End cycles; sessions round robin."""
    out: list[ToolEvent] = []
    step = [0] * n_sessions
    for k in range(n_events):
        i = k % n_sessions
        j = step[i]
        step[i] += 1
        sid, cycle, phase = f"ses_{i:05d}", j // 4, j % 4
        call, tool = f"call_{cycle}", TOOLS[(i + cycle) % len(TOOLS)]
        t = 10.0 + cycle * 4.0 + phase
        if phase == 0:
            out.append(
                ToolStart(session_id=sid, call_id=call, tool=tool, started_at=t, source="hook")
            )
        elif phase < 3:
            out.append(ToolProgress(session_id=sid, call_id=call, ts=t, fraction=phase / 3))
        else:
            out.append(ToolEnd(session_id=sid, call_id=call, tool=tool, ended_at=t, source="hook"))
    return out


def expected(start: dict[str, Session], evs: list[ToolEvent]) -> tuple[dict[str, Session], History]:
    """Every step applied alone, in stream order; and the tool statistics they record."""
    cur: dict[str, Session | None] = dict(start)
    tools: dict[str, ToolStats] = {}
    overall = ToolStats()
    for ev in evs:
        out = Outcome()
        match ev:
            case ToolStart():
                fn = tool_start_step(ev, out)
            case ToolProgress():
                fn = tool_progress_step(ev, out)
            case ToolEnd():
                fn = tool_end_step(ev, out)
        new = fn(cur[ev.session_id])
        if new is not None:
            cur[ev.session_id] = new
        if isinstance(ev, ToolEnd) and out.duration is not None and out.tool:
            tools[out.tool] = update(tools.get(out.tool, ToolStats()), out.duration)
            overall = update(overall, out.duration)
    final = {k: v for k, v in cur.items() if v is not None}
    return final, History(tools=tools, overall=overall)


@dataclass
class Servers:
    nats: str
    redis: str
    embedded: EmbeddedServers | None


def servers(embedded_nats: bool = False) -> Servers:
    nats_url = os.environ.get("TAO_NATS_URL") or (LOCAL_NATS if nats_answers(LOCAL_NATS) else None)
    if embedded_nats:
        nats_url = None
    redis_url = os.environ.get("TAO_REDIS_URL") or (
        LOCAL_REDIS if redis_answers(LOCAL_REDIS) else None
    )
    emb = None
    if nats_url is None or redis_url is None:
        emb = EmbeddedServers(nats=nats_url is None, redis=redis_url is None).start()
        nats_url = nats_url or emb.nats_url or ""
        redis_url = redis_url or emb.redis_url or ""
    return Servers(nats_url, redis_url, emb)


async def publish_all(bus: Bus, evs: list[ToolEvent], window: int = 512) -> None:
    items = [(subjects.tool_event(ev.session_id), encode(ev)) for ev in evs]
    for start in range(0, len(items), window):
        await asyncio.gather(*(bus.publish(s, d) for s, d in items[start : start + window]))


@dataclass(frozen=True)
class _Info:
    num_pending: int
    num_ack_pending: int


class Stalled(RuntimeError):
    """The consumer stopped making progress (see the report: a JetStream push delivery stall)."""


async def wait_consumed(
    bus: Bus, total: int, procs: list[subprocess.Popen[bytes]], shards: int = 1
) -> float:
    """Events/s between the first sight of every shard's durable and nothing left to ack on
    any (the slowest shard's ack floor counts). Raises :class:`Stalled` when fewer than 1 % of
    the events were acked in the last 3 s."""
    js = bus.nc.jetstream()
    stream = bus.stream_name(subjects.STREAM_TOOL)
    durables = [
        subjects.durable_name(Shard(i, shards).member("tools"), subjects.STREAM_TOOL)
        for i in range(shards)
    ]
    t0: float | None = None
    acked0 = 0
    while True:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"tools service exited with {proc.returncode}")
        try:
            infos = [await js.consumer_info(stream, d) for d in durables]
        except NotFoundError:
            await asyncio.sleep(0.01)
            continue
        now = time.perf_counter()
        floors = [i.ack_floor.stream_seq if i.ack_floor else 0 for i in infos]
        acked = min(f or 0 for f in floors)
        info = _Info(
            sum(i.num_pending or 0 for i in infos), sum(i.num_ack_pending or 0 for i in infos)
        )
        if t0 is None:
            t0, acked0 = now, acked or 0
            mark = (now, acked0)
        if now - mark[0] >= 3.0:
            if (acked or 0) - mark[1] < total // 100:
                raise Stalled(
                    f"stalled at {acked} of {total} acked ({info.num_ack_pending} unacked)"
                )
            mark = (now, acked or 0)
        if info.num_pending == 0 and info.num_ack_pending == 0 and (acked or 0) >= total:
            if now - t0 <= 0 or total - acked0 <= 0:
                raise RuntimeError("the service finished before the first poll; use more events")
            return (total - acked0) / (now - t0)
        await asyncio.sleep(0.01)


async def one_run(args: argparse.Namespace, srv: Servers, shards: int = 1) -> float:
    ns, domain = "b" + uuid.uuid4().hex[:12], "b" + uuid.uuid4().hex[:12]
    r = aioredis.Redis.from_url(srv.redis)
    store = Store(r, domain)
    bus = await Bus.connect(srv.nats, name="bench-tools", namespace=ns)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        await bus.ensure_streams()
        start = {s.id: s for s in map(initial, range(args.sessions))}
        await store.update_sessions([(sid, _const(s)) for sid, s in start.items()])
        evs = events(args.sessions, args.events)
        t = time.perf_counter()
        await publish_all(bus, evs)
        print(f"  published {len(evs)} in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        env = dict(os.environ, TAO_NATS_URL=srv.nats, TAO_REDIS_URL=srv.redis)
        env.update(TAO_NAMESPACE=ns, TAO_DOMAIN=domain, TAO_LOG_LEVEL=args.log_level)
        cmd = [sys.executable]
        if args.profile:
            cmd += ["-m", "cProfile", "-o", args.profile]
        cmd += ["-m", "services.tools"]
        if args.taskset is not None:
            cmd = ["taskset", "-c", args.taskset, *cmd]
        log = open(args.service_log, "ab") if args.service_log else subprocess.DEVNULL  # noqa: SIM115
        for i in range(shards):
            shard_env = dict(env, TAO_SHARD=f"{i}/{shards}")
            procs.append(subprocess.Popen(cmd, env=shard_env, stdout=log, stderr=log))
        spy = None
        if args.py_spy:  # attached, so that it writes its samples before the service stops
            exe = os.path.join(os.path.dirname(sys.executable), "py-spy")
            out = ["-f", "raw", "-r", "250", "-o", args.py_spy, "-p", str(procs[0].pid)]
            spy = subprocess.Popen([exe, "record", *out], stdout=log, stderr=log)
        rate = await wait_consumed(bus, len(evs), procs, shards)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
        want, want_hist = expected(start, evs)
        got = {s.id: s for s in await store.sessions()}
        bad = [sid for sid in want if got.get(sid) != want[sid]]
        hist = await store.history()
        if bad or hist != want_hist:
            raise RuntimeError(
                f"wrong result: {len(bad)} sessions differ (e.g. {bad[:1]}), "
                f"{hist.overall.count} durations recorded, expected {want_hist.overall.count}"
            )
        return rate
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        await store.clear()
        await r.aclose()
        await bus.delete_streams()
        await bus.drain()


async def run(args: argparse.Namespace) -> int:
    srv = servers(args.embedded_nats)
    load0 = os.getloadavg()[0]
    counts = [int(x) for x in args.shards.split(",")]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    stalls: list[str] = []
    try:
        for i in range(args.runs):
            for n in counts:  # alternate the variants, so drift hits each alike
                print(
                    f"run {i + 1}/{args.runs}, {n} shard(s): {args.events} events, "
                    f"{args.sessions} sessions",
                    file=sys.stderr,
                )
                try:
                    rates[n].append(await one_run(args, srv, n))
                except Stalled as exc:
                    stalls.append(f"{n} shard(s): {exc}")
                    print(f"  {exc}", file=sys.stderr)
                    continue
                print(f"  {rates[n][-1]:,.0f} events/s", file=sys.stderr)
    finally:
        if srv.embedded is not None:
            srv.embedded.stop()
    load1 = os.getloadavg()[0]
    pin = f"taskset -c {args.taskset}" if args.taskset is not None else "not pinned"
    print(f"\nTools service throughput: {args.events} tool events over {args.sessions} sessions,")
    print(f"{args.runs} run(s), service {pin}, NATS {srv.nats}, Redis {srv.redis}, ")
    print(f"load average (1 min) {load0:.2f} before, {load1:.2f} after\n")
    print("| measure | median events/s | best events/s |")
    print("|---|---:|---:|")
    for n, got in rates.items():
        if got:
            what = "tools service" if n == 1 else f"{n} tools processes (TAO_SHARD)"
            med, best = statistics.median(got), max(got)
            print(f"| {what}, end to end ({len(got)} runs) | {med:,.0f} | {best:,.0f} |")
    for stall in stalls:
        print(f"| run STALLED: {stall} | - | - |")
    return 0 if any(rates.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--sessions", type=int, default=1_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--taskset", default=None, help="CPU list for the service (taskset -c)")
    p.add_argument("--profile", default=None, help="cProfile output file of the service")
    p.add_argument("--py-spy", default=None, help="py-spy raw (collapsed) samples of the service")
    p.add_argument("--log-level", default="info", help="TAO_LOG_LEVEL of the service")
    p.add_argument("--embedded-nats", action="store_true", help="a fresh nats-server for the run")
    p.add_argument("--service-log", default=None, help="append the service's stderr here")
    p.add_argument("--shards", default="1", help="tools processes per run, e.g. 1,2 (TAO_SHARD)")
    args = p.parse_args(argv)
    if args.events < 1 or args.sessions < 1 or args.runs < 1:
        p.error("--events, --sessions and --runs must be >= 1")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
