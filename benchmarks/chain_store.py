"""Stored session chains: what the telemetry service pays to keep them, and to restore them.

A script, not a test: it prints markdown tables to stdout (progress goes to stderr)::

    PYTHONPATH=. taskset -c 1 .venv/bin/python -m benchmarks.chain_store
    PYTHONPATH=. .venv/bin/python -m benchmarks.chain_store --sessions 500 --runs 1

Per chain length (blocks of 16 tokens: 8k, 32k and 100k-token contexts), in a fresh store
domain on the local Redis (keys deleted afterwards):

* **write** — ``put_chains`` of ``--sessions`` chains in flushes of ``--batch`` sessions (what
  one 50 ms telemetry flush writes when that many sessions had a response): sessions per
  second, and the bytes stored per chain;
* **restore** — ``chains()`` reading them all back (what a restarted telemetry does first),
  then ``KvIndex.register`` of each: seconds for all.

Rates are ``n / elapsed`` (``time.perf_counter``); best of ``--runs``. One process, one
connection; Redis on the same machine, so a remote Redis adds its round trips per flush.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
import uuid

import redis.asyncio as aioredis

from shared.core.kvindex import KvIndex
from shared.infra.store import Store

LOCAL = "redis://127.0.0.1:6379/0"
BLOCK = 16
LENGTHS = (512, 2048, 6250)  # blocks: 8k, 32k, 100k tokens


async def one_run(url: str, sessions: int, batch: int, blocks: int, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    chains = [
        (f"s{i}", BLOCK, [rng.getrandbits(64) for _ in range(blocks)], 1000.0 + i)
        for i in range(sessions)
    ]
    client = aioredis.Redis.from_url(url)
    store = Store(client, "bench" + uuid.uuid4().hex[:8])
    try:
        t0 = time.perf_counter()
        for lo in range(0, sessions, batch):
            await store.put_chains(chains[lo : lo + batch])
        write_s = time.perf_counter() - t0
        stored = await client.strlen(store.keys.chain("s0"))
        t0 = time.perf_counter()
        found = await store.chains()
        read_s = time.perf_counter() - t0
        index = KvIndex()
        t0 = time.perf_counter()
        for sid, bs, keys, stamp in found.chains:
            index.register(sid, keys, bs, stamp)
        register_s = time.perf_counter() - t0
        assert len(found.chains) == sessions and not found.corrupt
    finally:
        await store.clear()
        await client.aclose()
    return {
        "write_rate": sessions / write_s,
        "bytes": float(stored),
        "read_s": read_s,
        "register_s": register_s,
    }


async def main_async(args: argparse.Namespace) -> None:
    print(f"| blocks (tokens) | bytes per chain | put_chains sessions/s (batch {args.batch}) "
          f"| chains() for {args.sessions} | register all |")  # fmt: skip
    print("|---|---|---|---|---|")
    for blocks in LENGTHS:
        runs = []
        for r in range(args.runs):
            print(f"chain_store: {blocks} blocks, run {r + 1}", file=sys.stderr)
            runs.append(await one_run(args.redis_url, args.sessions, args.batch, blocks, r))
        best = {
            "write_rate": max(x["write_rate"] for x in runs),
            "bytes": runs[0]["bytes"],
            "read_s": min(x["read_s"] for x in runs),
            "register_s": min(x["register_s"] for x in runs),
        }
        print(
            f"| {blocks} ({blocks * BLOCK // 1000}k) | {best['bytes'] / 1024:.1f} KiB "
            f"| {best['write_rate']:,.0f} | {best['read_s']:.2f} s | {best['register_s']:.2f} s |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--redis-url", default=LOCAL)
    args = ap.parse_args()
    if args.sessions < 1 or args.batch < 1 or args.runs < 1:
        print("chain_store: --sessions, --batch and --runs must be >= 1", file=sys.stderr)
        raise SystemExit(2)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
