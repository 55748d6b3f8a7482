"""A no-header trace-replay client against its own run with a session header, on real engines.

Starts two vLLM CPU engines (``tao engines up`` in code, the real-engine tier's sizes: 256
blocks of 32 tokens each) and a whole TAO stack in front of them, then:

1. ``--abandoned`` one-turn replays whose client then leaves (no ``DELETE``): sessions that
   hold room until something releases them (the idle timeout is set to 900 s, past the run);
2. ``--rounds`` rounds of the replay load of ``benchmarks.replay_client`` (``--conversations``
   × ``--turns``, ``--concurrency`` at once, ``--gap-s`` of tool time), once with
   ``X-Session-ID`` and once without, the order alternating by round and each run on its own
   seed (so no run finds another's conversations cached).

Prints a row per run (wall time, turns answered, sessions, split conversations, prefix hit rate
over turns after the first, mean and max turn latency) and the mean of each mode, then whether
the abandoned sessions were released. Needs ``.venv-vllm`` (``bash scripts/engines.sh
install``); heavy: run it alone (``flock /tmp/tao-heavy.lock``)::

    flock /tmp/tao-heavy.lock .venv/bin/python -m benchmarks.replay_identity \\
        --conversations 20 --turns 5 --concurrency 10 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import tempfile
import uuid
from io import StringIO
from pathlib import Path

import redis.asyncio as aioredis

from benchmarks.replay_client import (
    ReplayRun,
    add_load_arguments,
    load_of,
    print_header,
    replay,
    row,
)
from shared.cli.engines import DEFAULT_PYTHON, EngineConfig, engines_down, engines_up
from shared.cli.stack import Stack, StackConfig
from shared.infra.store import Store


def _ports(n: int) -> int:
    for base in range(20_000, 60_000, 97):
        ok = True
        for i in range(n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", base + i))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free ports")


async def _measure(args: argparse.Namespace, gateway: str, redis_url: str, domain: str) -> None:
    common = load_of(args)
    left: list[ReplayRun] = []
    for n in range(args.abandoned):
        left.append(
            await replay(
                gateway,
                "tiny",
                **{**common, "conversations": 1, "turns": 1},
                header=False,
                seed=900 + n,
                tag="left",
            )
        )
    abandoned = {t.session for run in left for t in run.turns if t.session}
    print_header()
    by_mode: dict[str, list[ReplayRun]] = {"header": [], "none": []}
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for k, header in enumerate(order):
            seed = args.seed + 10 * r + k
            run = await replay(gateway, "tiny", **common, header=header, seed=seed, tag=f"m{seed}")
            by_mode[run.identity].append(run)
            print(row(run, seed), flush=True)
    for mode, runs in by_mode.items():
        wall = statistics.mean(r.wall_s for r in runs)
        hit = statistics.mean(r.hit_rate() for r in runs)
        print(f"mean {mode}: wall {wall:.1f} s, hit rate {100 * hit:.1f} %")
    client = aioredis.Redis.from_url(redis_url)
    try:
        store = Store(client, domain)
        for sid in sorted(abandoned):
            s = await store.get_session(sid)
            state = "gone" if s is None else f"node={s.node} activity={s.activity} ended={s.ended}"
            print(f"abandoned {sid}: {state}")
    finally:
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_load_arguments(p)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--abandoned", type=int, default=2)
    p.add_argument("--nats-url", default=os.environ.get("TAO_NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--redis-url", default=os.environ.get("TAO_REDIS_URL", "redis://127.0.0.1:6379"))
    args = p.parse_args()
    python = Path(os.environ.get("TAO_VLLM_PYTHON", str(DEFAULT_PYTHON)))
    state = Path(tempfile.mkdtemp(prefix="replay-identity-"))
    cfg = EngineConfig(
        count=2,
        python=python,
        state_dir=state,
        base_port=_ports(2),
        kv_base_port=_ports(4) + 10,
        block_size=32,
        kv_blocks=256,
        max_model_len=4096,
        timeout_s=400.0,
    )
    nodes_file = engines_up(cfg, StringIO())
    run = uuid.uuid4().hex[:8]
    stack = Stack(
        StackConfig(
            sim_nodes=0,
            policy="tao",
            namespace=f"rid{run}",
            domain=f"rid-{run}",
            extra_env={
                "TAO_NODES_FILE": str(nodes_file),
                "TAO_SCRAPE_S": "0.5",
                "TAO_IDLE_TIMEOUT_S": "900",
            },
            env={**os.environ, "TAO_NATS_URL": args.nats_url, "TAO_REDIS_URL": args.redis_url},
        )
    )
    try:
        stack.start()
        asyncio.run(_measure(args, stack.gateway_url, stack.redis_url, f"rid-{run}"))
    finally:
        stack.stop()
        engines_down(state)


if __name__ == "__main__":
    main()
