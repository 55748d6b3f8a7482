"""Engine model throughput: an agentic multi-turn workload on one node, closed form vs stepping.

Run: ``.venv/bin/python -m benchmarks.engine [--sessions N] [--turns N]``. Prints one table
row per mode: CPU seconds of this process, requests, forward steps, preemptions, prefix hit
rate, virtual makespan. The offline simulator's budget is 300 tasks x ~30 turns x ~150 output
tokens on 2 nodes for 5 policies in < 60 s on one core (~4,500 requests per node and policy in
< 6 s). All sessions are live at once here, so large --sessions thrash the cache (worst case).
"""

from __future__ import annotations

import argparse
import heapq
import random
import time

from shared.core.engine import PROFILES, Completion, Engine, EngineRequest


def run(sessions: int, turns: int, closed: bool, seed: int = 1) -> tuple[float, Engine, int, float]:
    """Drive one engine with ``sessions`` agents (tool calls of 1-10 s between turns)."""
    rng = random.Random(seed)
    e = Engine("n0", PROFILES["qwen3-32b-tp2"], closed_form=closed)
    ctx = {f"s{i}": [rng.randrange(150_000) for _ in range(1500)] for i in range(sessions)}
    turn = dict.fromkeys(ctx, 0)
    arrivals = [(rng.uniform(0, 10), s) for s in ctx]
    heapq.heapify(arrivals)
    done = 0
    t = 0.0
    t0 = time.process_time()

    def finish(cs: list[Completion]) -> None:
        nonlocal done
        for c in cs:
            done += 1
            s = c.session_id
            ctx[s].extend(c.output)
            ctx[s].extend(rng.randrange(150_000) for _ in range(rng.randint(50, 400)))
            turn[s] += 1
            if turn[s] < turns:
                heapq.heappush(arrivals, (c.finished_at + rng.uniform(1, 10), s))

    while True:
        nxt = e.next_event_time()
        ta = arrivals[0][0] if arrivals else None
        if nxt is None and ta is None:
            break
        if ta is None or (nxt is not None and nxt < ta):
            t = max(t, nxt if nxt is not None else t)
            finish(e.advance(t))
        else:
            _, s = heapq.heappop(arrivals)
            t = max(t, ta)
            finish(e.advance(t))
            out = rng.randint(50, 250)
            e.submit(EngineRequest(f"{s}-{turn[s]}", s, ctx[s], out), t)
    return time.process_time() - t0, e, done, t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=150)
    ap.add_argument("--turns", type=int, default=30)
    args = ap.parse_args()
    print(
        f"{'mode':<10} {'cpu_s':>7} {'requests':>8} {'steps':>8} {'preempt':>7} "
        f"{'hit_rate':>8} {'makespan_s':>10}"
    )
    for closed in (True, False):
        cpu, e, done, t = run(args.sessions, args.turns, closed)
        hit = e.prefix_cache_hits / max(1, e.prefix_cache_queries)
        mode = "closed" if closed else "stepping"
        print(
            f"{mode:<10} {cpu:7.2f} {done:8d} {e.steps:8d} {e.num_preemptions:7d} "
            f"{hit:8.3f} {t:10.1f}"
        )


if __name__ == "__main__":
    main()
