"""Planner failover: how long a domain goes without a planner when its leader dies.

A script, not a test: it prints a markdown table to stdout (progress on stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.failover
    PYTHONPATH=. .venv/bin/python -m benchmarks.failover --trials 10 --ttl 2

Per trial, on a fresh 3-server NATS cluster (``shared.infra.natscluster``; streams and the
lease bucket with 3 replicas) and the local Redis (TAO_REDIS_URL, else 127.0.0.1:6379): one
valuation and two planner replicas run as real processes (``python -m services.…``,
TAO_LEASE_TTL_S = ``--ttl``). Once the first sessions are admitted, the leading planner is
SIGKILLed (variant ``leader``), or the leader and the NATS server it may be connected to
(``leader+nats``: server 0), and new waiting sessions are written at once. Measured from the
kill, on this process's clock:

* **takeover**: the lease bucket names the standby (polled every 20 ms);
* **first admit**: every new session is admitted in the store (the standby's first plan);
* over-commit: the node's reserved total against its usable capacity at the end, and the
  ``plans_fenced`` counter (a deposed leader's applies refused).

The bound by design is about TTL + TTL/4 (the key lapses TTL after the last renewal, which was
up to TTL/3 before the kill; the standby tries every TTL/4) — see docs/scale-out.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from shared.infra.natscluster import NatsCluster
from tests.scale.harness import Procs, domain, until

VARIANTS = ("leader", "leader+nats")


async def trial(variant: str, ttl: float, redis_url: str, logs: Path) -> dict[str, float]:
    with NatsCluster(3) as cluster:
        async with domain(cluster.url, redis_url, logs, ttl_s=ttl, replicas=3) as d:
            await d.start_planners()
            first = [f"a{i}" for i in range(5)]
            await d.add_sessions(first)
            await until("first admitted", lambda: d.admitted(first))
            await until("both planners up", lambda: _both_warm(d.procs))
            await asyncio.sleep(ttl / 2)  # some renewals in
            leader = await d.holder()
            assert leader is not None
            second = [f"b{i}" for i in range(5)]
            t0 = time.perf_counter()
            d.procs.kill(leader)
            if variant == "leader+nats":
                cluster.kill(0)
            await d.add_sessions(second)

            async def moved() -> bool:
                return await d.holder() not in (None, leader)

            await until("takeover", moved)
            takeover = time.perf_counter() - t0
            await until("second admitted", lambda: d.admitted(second))
            admit = time.perf_counter() - t0
            node = await d.store.get_node("n1")
            stats = await d.store.planner_stats()
            assert node is not None
            return {
                "takeover": takeover,
                "admit": admit,
                "over": float(node.reserved > node.usable),
                "fenced": float(stats.get("plans_fenced", 0)),  # type: ignore[arg-type]
            }


async def _both_warm(procs: Procs) -> bool:
    return all(procs.logged_count(p, "planner_warm") >= 1 for p in ("p1", "p2"))


def _ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.0f} / {max(xs) * 1000:.0f}"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--ttl", type=float, default=2.0, help="TAO_LEASE_TTL_S (default 2)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    redis_url = os.environ.get("TAO_REDIS_URL", "redis://127.0.0.1:6379/0")
    rows = []
    for variant in args.variants.split(","):
        got: list[dict[str, float]] = []
        for i in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="tao-failover-") as logs:
                got.append(await trial(variant, args.ttl, redis_url, Path(logs)))
            print(f"{variant} {i + 1}/{args.trials}: {got[-1]}", file=sys.stderr)
        rows.append((variant, got))
    print(f"Failover, TAO_LEASE_TTL_S = {args.ttl:g} s, {args.trials} trials each "
          f"(load average {os.getloadavg()[0]:.2f})\n")  # fmt: skip
    print("| kill | takeover ms p50 / max | new sessions admitted ms p50 / max "
          "| over-committed | plans fenced |")  # fmt: skip
    print("|---|---|---|---|---|")
    for variant, got in rows:
        over = int(sum(g["over"] for g in got))
        fenced = int(sum(g["fenced"] for g in got))
        takeover, admit = _ms([g["takeover"] for g in got]), _ms([g["admit"] for g in got])
        print(f"| {variant} | {takeover} | {admit} | {over} of {len(got)} | {fenced} |")


if __name__ == "__main__":
    asyncio.run(main())
