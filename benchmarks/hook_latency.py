"""``tao hook claude`` wall time as a process: what Claude Code waits for on each hook.

A script, not a test: it prints a markdown table to stdout (progress goes to stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.hook_latency                 # 200 runs per case
    PYTHONPATH=. .venv/bin/python -m benchmarks.hook_latency --runs 500 --tao .venv/bin/tao

Each run starts the hook command (``--tao`` with ``hook claude``; default: the ``tao`` next to
this Python, else ``python -m shared.cli.entry``), writes a Claude Code PreToolUse payload
(tests/fixtures/claude-code/pre-tool-use-bash.json) to its stdin, and waits for it to exit;
wall time is measured around ``subprocess.run`` (process creation to reap), so it includes the
interpreter's start-up. Cases:

* ``nats up``: NATS at ``TAO_NATS_URL`` (else 127.0.0.1:4222, else an embedded server),
  namespace of its own with the streams created, so each payload is really stored; the script
  checks afterwards that the stream holds one message per run;
* ``nats unreachable``: a port with nothing listening (connection refused at once);
* ``nats silent``: a server that accepts the connection and never answers (the hook waits for
  its publish deadline, 100 ms, and gives up).

Target (issue 4): p99 < 150 ms with NATS up. The exit code is always 0; a failed run (non-zero
exit or output) is counted and shown.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from shared.contracts import subjects
from shared.infra import Bus, EmbeddedServers, nats_answers
from shared.infra.embedded import free_port

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "claude-code" / "pre-tool-use-bash.json"
LOCAL_NATS = "nats://127.0.0.1:4222"


def hook_command(tao: str | None) -> list[str]:
    """The command line of ``tao hook claude``."""
    if tao:
        return [tao, "hook", "claude"]
    beside = Path(sys.executable).with_name("tao")
    if beside.exists():
        return [str(beside), "hook", "claude"]
    return [sys.executable, "-m", "shared.cli.entry", "hook", "claude"]


def run_case(cmd: Sequence[str], env: dict[str, str], runs: int) -> tuple[list[float], int]:
    """Wall ms of ``runs`` runs, and how many failed (exit != 0 or any output)."""
    payload = FIXTURE.read_bytes()
    times: list[float] = []
    failed = 0
    for i in range(runs + 3):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, input=payload, env=env, capture_output=True, check=False)
        ms = (time.perf_counter() - t0) * 1000
        if i < 3:
            continue  # warm the page cache
        times.append(ms)
        failed += proc.returncode != 0 or bool(proc.stdout) or bool(proc.stderr)
    return times, failed


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@contextmanager
def silent_server() -> Iterator[str]:
    """A TCP server that accepts and never speaks."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"nats://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for c in conns:
            c.close()
        srv.close()


async def stream_count(url: str, namespace: str) -> int:
    bus = await Bus.connect(url, name="bench-hook", namespace=namespace)
    try:
        info = await bus.nc.jetstream().stream_info(bus.stream_name(subjects.STREAM_HOOK))
        return int(info.state.messages)
    finally:
        await bus.drain()


async def make_streams(url: str, namespace: str) -> None:
    bus = await Bus.connect(url, name="bench-hook", namespace=namespace)
    await bus.ensure_streams()
    await bus.drain()


async def drop_streams(url: str, namespace: str) -> None:
    bus = await Bus.connect(url, name="bench-hook", namespace=namespace)
    await bus.delete_streams()
    await bus.drain()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per case (default 200)")
    parser.add_argument("--tao", help="path of the tao executable (default: beside python)")
    args = parser.parse_args(argv)
    cmd = hook_command(args.tao)
    base = {k: v for k, v in os.environ.items() if not k.startswith("TAO_")}
    url = os.environ.get("TAO_NATS_URL") or (LOCAL_NATS if nats_answers(LOCAL_NATS) else "")
    embedded: EmbeddedServers | None = None
    if not url:
        embedded = EmbeddedServers(nats=True, redis=False)
        embedded.__enter__()
        url = embedded.nats_url or ""
    namespace = "bench" + uuid.uuid4().hex[:8]
    rows: list[tuple[str, list[float], int, str]] = []
    try:
        asyncio.run(make_streams(url, namespace))
        print(f"command: {' '.join(cmd)}; {args.runs} runs per case", file=sys.stderr)
        env = {**base, "TAO_NATS_URL": url, "TAO_NAMESPACE": namespace}
        times, failed = run_case(cmd, env, args.runs)
        stored = asyncio.run(stream_count(url, namespace))
        rows.append(("nats up", times, failed, f"{stored} stored"))
        env = {**base, "TAO_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
        times, failed = run_case(cmd, env, args.runs)
        rows.append(("nats unreachable", times, failed, ""))
        with silent_server() as silent:
            env = {**base, "TAO_NATS_URL": silent}
            times, failed = run_case(cmd, env, args.runs)
        rows.append(("nats silent", times, failed, ""))
    finally:
        asyncio.run(drop_streams(url, namespace))
        if embedded is not None:
            embedded.__exit__(None, None, None)
    load = os.getloadavg()[0]
    shown = " ".join([Path(cmd[0]).name, *cmd[1:]])
    print(f"`{shown}`, {args.runs} runs per case, load {load:.1f}, {os.cpu_count()} CPUs\n")
    print("| case | p50 ms | p90 ms | p99 ms | max ms | mean ms | failed | note |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, times, failed, note in rows:
        print(
            f"| {name} | {pct(times, 0.5):.1f} | {pct(times, 0.9):.1f} | {pct(times, 0.99):.1f} "
            f"| {max(times):.1f} | {statistics.fmean(times):.1f} | {failed} | {note} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
