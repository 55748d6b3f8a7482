"""Abuse benchmark of the gateway (issue 40, part 6): normal agent clients beside each attack.

A script, not a test: it prints a markdown table to stdout::

    PYTHONPATH=. flock /tmp/tao-heavy.lock .venv/bin/python -m benchmarks.gateway_abuse
    PYTHONPATH=. .venv/bin/python -m benchmarks.gateway_abuse --seconds 15 --agents 8
    PYTHONPATH=. .venv/bin/python -m benchmarks.gateway_abuse --client-rate 32e6 \
        --attacker-from 127.0.0.2

Three processes on 127.0.0.1 only: the gateway (the real app, :func:`services.gateway.serve`,
default settings but a 5 s hold timeout, on an in-memory bus with a stand-in planner that
admits every ``agent-*`` session at once and nothing else), a stub node that answers each chat
request after 20 ms, and this driver. For each scenario a fresh gateway is started; ``--agents``
agent loops send a growing conversation (2 KB per message, 20 turns a session, 50 ms of tool
time between turns) for ``--seconds``, a probe opens a new connection to ``/healthz`` every
100 ms, and a monitor samples the gateway's RSS and open descriptors (``/proc``) every 100 ms.
Beside them runs one attacker (every attack loop stops with the scenario):

* ``gzip bomb``: a valid 31 MB chat body of one repeated letter, gzip-compressed (30 KB);
* ``wide 33 MB``: ``{"messages":{},"x":[{},{},…]}`` of 33 MB, plain, and ``wide gzip`` the same
  compressed;
* ``1M messages``: a valid 30 MB body of a million short messages;
* ``held 30 MB``: valid 30 MB bodies of new sessions no one admits, so each is held;
* ``300 half-open``: 300 connections that send a request line and one header, re-opened when
  the gateway closes them.

``--client-rate`` sets the gateway's per-client byte budget (``TAO_BODY_CLIENT_RATE``;
services/gateway/pacing.py). A client is a tenant and an address; there is no authentication
here, so ``--attacker-from 127.0.0.2`` makes the attacker another host (Linux answers all of
127/8 on loopback), while by default it shares the agents' address and so their budget.

Reported per scenario: the agents' request count, p50 and p99 latency, their 5xx count, the
``/healthz`` worst latency (5 s counts as no answer), the gateway's RSS growth over the
scenario's start and its most open descriptors, and the attacker's answers by status.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any

import orjson
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

HOST = "127.0.0.1"
AGENT_PREFIX = "agent-"
HOLD_TIMEOUT_S = 5.0
PROBE_S = 0.1
PROBE_TIMEOUT_S = 5.0
NODE_DELAY_S = 0.02
HALF_OPEN = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"


# --- the two servers (run as child processes) -----------------------------------------------


async def serve_gateway(port: int, node: str, client_rate: float) -> None:
    from services.gateway import create_app, serve
    from shared.contracts import Placement, SessionRequest, decode_session_event, subjects
    from shared.infra import FakeBus, Settings

    settings = Settings(
        gateway_id="gw",
        hold_timeout_s=HOLD_TIMEOUT_S,
        retry_after_s=1.0,
        body_client_rate=client_rate,
    )
    bus = FakeBus()

    async def admit(msg: Any, _: Any) -> None:
        if isinstance(msg, SessionRequest) and msg.session_id.startswith(AGENT_PREFIX):
            await bus.publish_msg(
                Placement(
                    kind="admit", session_id=msg.session_id, version=1, tick=1,
                    gateway_id="gw", node_id="n1",
                )
            )  # fmt: skip

    await bus.subscribe(subjects.session_events(), "planner", decode_session_event, admit)
    app = create_app(settings, bus, node_urls={"n1": node})
    await serve(app, HOST, port, settings)
    print("ready", flush=True)
    await asyncio.Event().wait()


async def serve_node(port: int) -> None:
    answer = {
        "id": "c",
        "object": "chat.completion",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43},
    }

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(NODE_DELAY_S)
        return web.json_response(answer)

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


# --- what is measured -----------------------------------------------------------------------


@dataclass
class Run:
    """One scenario's measurements."""

    latencies: list[float] = field(default_factory=list)
    fivexx: int = 0
    other: Counter[str] = field(default_factory=Counter)
    probes: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    attack: Counter[str] = field(default_factory=Counter)


def proc_sample(pid: int) -> tuple[int, int]:
    """The process's resident set (bytes) and open descriptors."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def agent(url: str, i: int, stop: asyncio.Event, run: Run) -> None:
    turn = 0
    async with ClientSession(timeout=ClientTimeout(total=60)) as http:
        while not stop.is_set():
            session = f"{AGENT_PREFIX}{i}-{turn // 20}"
            messages = [
                {"role": "user", "content": f"{k} " + "w" * 2000} for k in range(turn % 20 + 1)
            ]
            body = {"model": "m", "messages": messages, "max_tokens": 8}
            started = time.perf_counter()
            try:
                async with http.post(url, json=body, headers={"X-Session-ID": session}) as resp:
                    await resp.read()
                    status = resp.status
            except (ClientError, TimeoutError) as exc:
                run.other[type(exc).__name__] += 1
                continue
            finally:
                turn += 1
            run.latencies.append(time.perf_counter() - started)
            if status >= 500:
                run.fivexx += 1
            elif status != 200:
                run.other[str(status)] += 1
            await asyncio.sleep(0.05)


async def probe(port: int, stop: asyncio.Event, run: Run) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(HOST, port)
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
                answer = await reader.read()
                writer.close()
            ok = answer.startswith(b"HTTP/1.1 200")
        except (OSError, TimeoutError):
            ok = False
        run.probes.append(time.perf_counter() - started if ok else PROBE_TIMEOUT_S)
        await asyncio.sleep(PROBE_S)


async def monitor(pid: int, stop: asyncio.Event, run: Run) -> None:
    while not stop.is_set():
        rss, fds = proc_sample(pid)
        run.rss.append(rss)
        run.fds.append(fds)
        await asyncio.sleep(0.1)


# --- the attacks ----------------------------------------------------------------------------

Attack = Callable[[int, asyncio.Event, Run], Awaitable[None]]


ATTACKER_FROM = [HOST]
"""The attacker's source address (``--attacker-from``): the agents' own by default."""


def posting(body: bytes, headers: dict[str, str], new_session: bool = False) -> Attack:
    """An attacker that posts ``body`` again and again, one at a time."""

    async def attack(port: int, stop: asyncio.Event, run: Run) -> None:
        url = f"http://{HOST}:{port}/v1/chat/completions"
        n = 0
        connector = TCPConnector(local_addr=(ATTACKER_FROM[0], 0))
        async with ClientSession(timeout=ClientTimeout(total=30), connector=connector) as http:
            while not stop.is_set():
                n += 1
                sid = {"X-Session-ID": f"attacker-{n}"} if new_session else {}
                try:
                    async with http.post(url, data=body, headers={**headers, **sid}) as resp:
                        await resp.read()
                        run.attack[str(resp.status)] += 1
                except (ClientError, TimeoutError) as exc:
                    run.attack[type(exc).__name__] += 1

    return attack


async def half_open(port: int, stop: asyncio.Event, run: Run) -> None:
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = [None] * 300
    while not stop.is_set():
        for k, conn in enumerate(conns):
            if conn is not None and not conn[0].at_eof():
                continue
            if conn is not None:
                conn[1].close()
                run.attack["closed by gateway"] += 1
            try:
                reader, writer = await asyncio.open_connection(
                    HOST, port, local_addr=(ATTACKER_FROM[0], 0)
                )
                writer.write(HALF_OPEN)
                conns[k] = (reader, writer)
                run.attack["opened"] += 1
            except OSError as exc:
                conns[k] = None
                run.attack[type(exc).__name__] += 1
        for conn in conns:  # notice EOFs
            if conn is not None:
                with contextlib.suppress(TimeoutError, OSError):
                    await asyncio.wait_for(conn[0].read(1), 0.001)
        await asyncio.sleep(0.5)
    for conn in conns:
        if conn is not None:
            conn[1].close()


def attacks() -> dict[str, Attack | None]:
    bomb = gzip.compress(
        orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "a" * 31_000_000}]})
    )
    wide = b'{"messages":{},"x":[' + b",".join([b"{}"] * 11_000_000) + b"]}"
    million = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "m"}] * 1_000_000}
    )
    held = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "h" * 30_000_000}]})
    json_type = {"Content-Type": "application/json"}
    gz = {**json_type, "Content-Encoding": "gzip"}
    return {
        "none": None,
        "gzip bomb (31 MB in 30 KB)": posting(bomb, gz),
        "wide 33 MB": posting(wide, json_type),
        "wide 33 MB, gzip": posting(gzip.compress(wide), gz),
        "1M messages (30 MB)": posting(million, json_type),
        "held 30 MB bodies": posting(held, json_type, new_session=True),
        "300 half-open connections": half_open,
    }


# --- the driver -----------------------------------------------------------------------------


def child(args: list[str]) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
    """A server child process, once it has printed ``ready``; its output (both streams) goes
    to a temporary file, read at the end (a pipe left unread would fill and stop the child)."""
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stopped()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gateway_abuse", *args], stdout=log, stderr=log
    )
    for _ in range(600):  # up to 60 s
        log.seek(0)
        if b"ready\n" in log.read() or proc.poll() is not None:
            break
        time.sleep(0.1)
    log.seek(0)
    if b"ready\n" not in log.read():
        proc.kill()
        log.seek(0)
        raise SystemExit(f"{args[0]} did not start: {log.read().decode()[-2000:]}")
    return proc, log


def stopped(proc: subprocess.Popen[bytes], log: IO[bytes]) -> str:
    """Stop a child; its log."""
    proc.terminate()
    proc.wait(timeout=30)
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    return text


def free_port() -> int:
    from shared.infra.embedded import free_port as pick

    return pick()


async def scenario(
    attack: Attack | None, node: str, agents: int, seconds: float, client_rate: float
) -> tuple[Run, str]:
    port = free_port()
    gw, gw_log = child(["gateway", str(port), node, repr(client_rate)])
    run = Run()
    try:
        url = f"http://{HOST}:{port}/v1/chat/completions"
        warm = asyncio.Event()
        warming = Run()
        tasks = [asyncio.create_task(agent(url, i, warm, warming)) for i in range(agents)]
        await asyncio.sleep(2.0)
        warm.set()
        await asyncio.gather(*tasks)
        stop = asyncio.Event()
        jobs: list[Awaitable[None]] = [agent(url, i, stop, run) for i in range(agents)]
        jobs += [probe(port, stop, run), monitor(gw.pid, stop, run)]
        if attack is not None:
            jobs.append(attack(port, stop, run))
        running = [asyncio.ensure_future(j) for j in jobs]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*running)
    finally:
        err = stopped(gw, gw_log)
    return run, err


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--only", default="", help="run the scenarios whose name contains this")
    parser.add_argument(
        "--client-rate",
        type=float,
        default=0.0,
        help="the gateway's TAO_BODY_CLIENT_RATE, bytes/s (0: no pacing)",
    )
    parser.add_argument(
        "--attacker-from",
        default=HOST,
        help="the attacker's source address: the agents' own (127.0.0.1, one client to the "
        "gateway) or another loopback address (127.0.0.2: another host)",
    )
    args = parser.parse_args(argv)
    ATTACKER_FROM[0] = args.attacker_from
    node_port = free_port()
    node, node_log = child(["node", str(node_port)])
    try:
        rows = []
        base_p99 = None
        for name, attack in attacks().items():
            if args.only and args.only not in name and name != "none":
                continue
            run, err = await scenario(
                attack, f"http://{HOST}:{node_port}", args.agents, args.seconds, args.client_rate
            )
            p50, p99 = pct(run.latencies, 50) * 1e3, pct(run.latencies, 99) * 1e3
            base_p99 = p99 if base_p99 is None else base_p99
            growth = (max(run.rss) - run.rss[0]) / 2**20
            emfile = "yes" if "Too many open files" in err else "no"
            answers = ", ".join(f"{k}: {v}" for k, v in sorted(run.attack.items())) or "–"
            rows.append(
                f"| {name} | {len(run.latencies)} | {p50:.1f} | {p99:.1f} | {p99 / base_p99:.2f} "
                f"| {run.fivexx} | {max(run.probes) * 1e3:.1f} | {growth:.0f} | {max(run.fds)} "
                f"| {emfile} | {answers} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
        soft = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)
        print(
            f"agents {args.agents}, {args.seconds:g} s per scenario, file limit {soft}, "
            f"TAO_BODY_CLIENT_RATE {args.client_rate:g}, attacker from {args.attacker_from}\n"
        )
        print(
            "| attack | agent requests | p50 ms | p99 ms | p99 / no attack | agent 5xx "
            "| /healthz max ms | RSS growth MB | open fds max | EMFILE | attacker's answers |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        print("\n".join(rows))
    finally:
        stopped(node, node_log)


if __name__ == "__main__":
    if sys.argv[1:2] == ["gateway"]:
        asyncio.run(serve_gateway(int(sys.argv[2]), sys.argv[3], float(sys.argv[4])))
    elif sys.argv[1:2] == ["node"]:
        asyncio.run(serve_node(int(sys.argv[2])))
    else:
        asyncio.run(main())
