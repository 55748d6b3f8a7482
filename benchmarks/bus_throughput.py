"""Bus throughput: tool events through JetStream and one consumer process, in messages/s.

A script, not a test: it prints a markdown table to stdout (progress goes to stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.bus_throughput                 # 50,000 x 3 runs
    PYTHONPATH=. .venv/bin/python -m benchmarks.bus_throughput --messages 200000 --runs 1

What is measured, per run, in a fresh namespace (its own streams, deleted afterwards):

* **publish (JetStream, acked)** — ``Bus.publish`` of N encoded ``ToolStart`` events on N/100
  session subjects, ``--window`` publishes in flight at a time (each awaits its stream ack), as
  concurrent publishers (gateway, hooks) would.
* **consume (decode + ack)** — a durable consumer started *after* the N events are stored: the
  time from ``Bus.consume`` until the handler has seen all N, each message decoded with
  ``decode_tool_event``, handled by an async handler (counts), and acked. This is the per-process
  ceiling of the tools service before its own work; the target is >= 20,000 events/s.
* **consume_batch (decode + ack)** — the same with ``Bus.consume_batch`` (one handler call per
  list of already-buffered messages, up to 256), the shape a Redis-pipelining handler would use.
* **live (publish || consume)** — a consumer running while the N events are published; the time
  from the first publish to the last handled message.

The NATS server is ``--nats-url`` (default: 127.0.0.1:4222 if it answers, else an embedded
``nats-server`` started for the run). Rates are N / elapsed wall time (``time.perf_counter``);
the table shows the median and the best of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Sequence

from shared.contracts import ToolEvent, ToolStart, decode_tool_event, encode, subjects
from shared.infra import Bus, Delivery, EmbeddedServers, nats_answers

LOCAL = "nats://127.0.0.1:4222"


def payloads(n: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(n):
        session = f"ses_{i % max(1, n // 100):06d}"
        msg = ToolStart(session_id=session, call_id=f"call_{i}", tool="bash", started_at=1.0 + i)
        out.append((subjects.tool_event(session), encode(msg)))
    return out


async def publish_all(bus: Bus, items: list[tuple[str, bytes]], window: int) -> None:
    for start in range(0, len(items), window):
        chunk = items[start : start + window]
        await asyncio.gather(*(bus.publish(s, d) for s, d in chunk))


class Counter:
    def __init__(self, target: int) -> None:
        self.n = 0
        self.target = target
        self.done = asyncio.Event()

    async def __call__(self, value: ToolEvent, delivery: Delivery) -> None:
        self.n += 1
        if self.n >= self.target:
            self.done.set()


class BatchCounter:
    def __init__(self, target: int) -> None:
        self.n = 0
        self.target = target
        self.done = asyncio.Event()

    async def __call__(self, items: list[tuple[ToolEvent, Delivery]]) -> None:
        self.n += len(items)
        if self.n >= self.target:
            self.done.set()


async def one_run(url: str, n: int, window: int) -> dict[str, float]:
    items = payloads(n)
    rates: dict[str, float] = {}
    bus = await Bus.connect(url, name="bench", namespace="b" + uuid.uuid4().hex[:12])
    try:
        await bus.ensure_streams()
        t0 = time.perf_counter()
        await publish_all(bus, items, window)
        rates["publish (JetStream, acked)"] = n / (time.perf_counter() - t0)

        counter = Counter(n)
        t0 = time.perf_counter()
        sub = await bus.consume(subjects.STREAM_TOOL, "bench", decode_tool_event, counter)
        await counter.done.wait()
        rates["consume (decode + ack)"] = n / (time.perf_counter() - t0)
        await sub.stop()

        batches = BatchCounter(n)
        t0 = time.perf_counter()
        sub = await bus.consume_batch(subjects.STREAM_TOOL, "benchb", decode_tool_event, batches)
        await batches.done.wait()
        rates["consume_batch (decode + ack)"] = n / (time.perf_counter() - t0)
        await sub.stop()

        live = Counter(n)
        await bus.consume(subjects.STREAM_TOOL, "benchlive", decode_tool_event, live, deliver="new")
        t0 = time.perf_counter()
        await publish_all(bus, items, window)
        await live.done.wait()
        rates["live (publish || consume)"] = n / (time.perf_counter() - t0)
    finally:
        await bus.drain()
        admin = await Bus.connect(url, name="bench-cleanup", namespace=bus.namespace)
        await admin.delete_streams()
        await admin.drain()
    return rates


async def run(args: argparse.Namespace) -> int:
    url = args.nats_url
    servers: EmbeddedServers | None = None
    if url is None:
        if nats_answers(LOCAL):
            url = LOCAL
        else:
            servers = EmbeddedServers(nats=True, redis=False).start()
            url = servers.nats_url or ""
    try:
        results: list[dict[str, float]] = []
        for i in range(args.runs):
            print(f"run {i + 1}/{args.runs}: {args.messages} messages on {url}", file=sys.stderr)
            results.append(await one_run(url, args.messages, args.window))
    finally:
        if servers is not None:
            servers.stop()
    print(f"\nBus throughput, {args.messages} ToolStart events per run, {args.runs} run(s), ")
    print(f"publish window {args.window}, server {url}\n")
    print("| phase | median msg/s | best msg/s |")
    print("|---|---:|---:|")
    for phase in results[0]:
        values = [r[phase] for r in results]
        print(f"| {phase} | {statistics.median(values):,.0f} | {max(values):,.0f} |")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--nats-url", default=None, help="NATS URL (default: local, else embedded)")
    ap.add_argument("--messages", type=int, default=50_000, help="events per run")
    ap.add_argument("--runs", type=int, default=3, help="runs (median and best are shown)")
    ap.add_argument("--window", type=int, default=512, help="publishes in flight")
    args = ap.parse_args(argv)
    if args.messages < 1 or args.runs < 1 or args.window < 1:
        ap.error("--messages, --runs and --window must be >= 1")
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
