"""State-store batch forms vs single forms, on the local Redis (request 4 of REQUESTS.md).

A script, not a test: it prints a markdown table to stdout (progress goes to stderr)::

    PYTHONPATH=. taskset -c 1 .venv/bin/python -m benchmarks.store_batch
    PYTHONPATH=. .venv/bin/python -m benchmarks.store_batch --ops 8192 --runs 5

What is measured, per run, in a fresh store domain (its keys are deleted afterwards):

* **update_session** — ``--ops`` sequential single updates (``WATCH``, ``HGETALL``,
  ``MULTI``/``EXEC``: three round trips each) over ``--sessions`` admitted sessions in a tool,
  round robin; each is a tools-service transition, ``on_tool_progress`` with a new time, so
  every update writes (record, index sets, the node's ``reserved``).
* **update_sessions (B)** — the same ``--ops`` transitions in batches of B (64 and 256) of
  distinct sessions: three round trips per batch. Rate = sessions updated per second.
* **record_tool / record_tools (B)** — ``--ops`` durations over 8 tool names, single vs folded
  batches (one ``WATCH``/``HMGET``/``MULTI`` per batch).
* **FakeStore update_sessions (256)** — the in-memory store: the Python-only part of a batch
  (decode-free fold + encode validation), an upper bound for one process.

Rates are ``ops / elapsed`` (``time.perf_counter``); the table shows the median and best of
``--runs`` runs. One process, one connection pool, nothing else running on the store domain.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable

import redis.asyncio as aioredis

from shared.core.session import Session, admit, on_request, on_response, on_tool_progress
from shared.infra.fake_store import FakeStore
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate, SessionFn, StateStore

LOCAL = "redis://127.0.0.1:6379/0"
TOOLS = tuple(f"tool{i}" for i in range(8))


def _in_tool(sid: str) -> Session:
    s = on_request(Session(id=sid), "r", 1.0, tokens_estimate=4000)[0]
    s = admit(s, "n0", 5000, 1.5)
    return on_response(s, 2.0, total_tokens=4100, tool_calls=[("c", "bash")])


def _create(s: Session) -> SessionFn:
    def step(_: Session | None) -> Session:
        return s

    return step


def _progress(at: float) -> SessionFn:
    def step(s: Session | None) -> Session | None:
        return None if s is None else on_tool_progress(s, "c", at, fraction=0.5)

    return step


async def _setup(store: StateStore, sessions: int) -> list[str]:
    await store.put_node_status("n0", NodeUpdate(capacity_tokens=10**9, healthy=True))
    sids = [f"ses_{i:06d}" for i in range(sessions)]
    for lo in range(0, sessions, 256):
        chunk = sids[lo : lo + 256]
        await store.update_sessions([(sid, _create(_in_tool(sid))) for sid in chunk])
    return sids


def _plan(sids: list[str], ops: int, at0: float) -> list[tuple[str, SessionFn]]:
    return [(sids[i % len(sids)], _progress(at0 + i)) for i in range(ops)]


async def _singles(store: StateStore, plan: list[tuple[str, SessionFn]]) -> None:
    for sid, fn in plan:
        await store.update_session(sid, fn)


async def _batches(store: StateStore, plan: list[tuple[str, SessionFn]], size: int) -> None:
    for lo in range(0, len(plan), size):
        await store.update_sessions(plan[lo : lo + size])


def _samples(ops: int) -> list[tuple[str, float, bool]]:
    return [(TOOLS[i % len(TOOLS)], 0.5 + (i % 97) / 10, i % 50 == 0) for i in range(ops)]


async def _record_singles(store: StateStore, items: list[tuple[str, float, bool]]) -> None:
    for tool, duration, censored in items:
        await store.record_tool(tool, duration, censored=censored)


async def _record_batches(
    store: StateStore, items: list[tuple[str, float, bool]], size: int
) -> None:
    for lo in range(0, len(items), size):
        await store.record_tools(items[lo : lo + size])


async def _time(work: Awaitable[None]) -> float:
    """Seconds to await ``work`` (a coroutine does nothing until awaited)."""
    t0 = time.perf_counter()
    await work
    return time.perf_counter() - t0


async def run_once(url: str, sessions: int, ops: int) -> dict[str, float]:
    """One run: every row's rate in operations per second."""
    client = aioredis.Redis.from_url(url)
    store = Store(client, "bench" + uuid.uuid4().hex[:10])
    fake = FakeStore("bench")
    rates: dict[str, float] = {}
    try:
        sids = await _setup(store, sessions)
        await _setup(fake, sessions)
        await _batches(store, _plan(sids, 256, 1.0), 256)  # warm-up (connections, code paths)
        single_ops = max(1, ops // 4)  # the single form is slow; a quarter keeps runs short
        at = 10.0
        plan = _plan(sids, single_ops, at)
        rates["update_session"] = single_ops / await _time(_singles(store, plan))
        for size in (64, 256):
            at += ops
            plan = _plan(sids, ops, at)
            rates[f"update_sessions ({size})"] = ops / await _time(_batches(store, plan, size))
        items = _samples(ops)
        single_items = items[:single_ops]
        rates["record_tool"] = single_ops / await _time(_record_singles(store, single_items))
        for size in (64, 256):
            rates[f"record_tools ({size})"] = ops / await _time(_record_batches(store, items, size))
        plan = _plan(sids, ops, at + ops)
        rates["FakeStore update_sessions (256)"] = ops / await _time(_batches(fake, plan, 256))
    finally:
        await store.clear()
        await client.aclose()
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis-url", default=LOCAL)
    ap.add_argument("--sessions", type=int, default=1024, help="distinct sessions (>= 256)")
    ap.add_argument("--ops", type=int, default=8192, help="updates per batched row")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    if args.sessions < 256 or args.ops < 256 or args.runs < 1:
        print("store_batch: need --sessions >= 256, --ops >= 256, --runs >= 1", file=sys.stderr)
        return 2
    results: list[dict[str, float]] = []
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs} ...", file=sys.stderr)
        results.append(asyncio.run(run_once(args.redis_url, args.sessions, args.ops)))
    base = {
        "update": statistics.median(r["update_session"] for r in results),
        "record": statistics.median(r["record_tool"] for r in results),
    }
    print(f"sessions={args.sessions} ops={args.ops} runs={args.runs} redis={args.redis_url}\n")
    print("| operation | median ops/s | best ops/s | vs single |")
    print("|---|---:|---:|---:|")
    for name in results[0]:
        values = [r[name] for r in results]
        med = statistics.median(values)
        ref = base["record"] if name.startswith("record") else base["update"]
        print(f"| {name} | {med:,.0f} | {max(values):,.0f} | {med / ref:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
