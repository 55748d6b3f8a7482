"""Simulator speed: one swe-lite run per policy, timed, printed as a markdown table.

    taskset -c 1 .venv/bin/python -m benchmarks.sim_speed            # 300 tasks, 64 workers
    taskset -c 1 .venv/bin/python -m benchmarks.sim_speed --tasks 60  # quick look
    taskset -c 1 .venv/bin/python -m benchmarks.sim_speed --host-kv 4 \
        --policies tao,thunderagent,thunderagent-ideal,kv-aware-tiered,cache-aware  # the tier

Times are ``time.process_time`` (CPU seconds of this process, so other load on the machine does
not inflate them) and wall seconds; the target (issue 5) is < 60 s for the five default
policies together on one core.
"""

from __future__ import annotations

import argparse
import time

from shared.cli.sim import DEFAULT_POLICIES
from shared.core.planner import warm_up
from shared.sim.des import SimConfig
from shared.sim.runner import simulate
from shared.sim.workloads import generate_tasks, load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    ap.add_argument("--host-kv", type=float, default=0.0, help="host tier, x the GPU KV")
    args = ap.parse_args()
    warm_up()  # numba compile outside the timings
    tasks = generate_tasks(load_workload("swe-lite"), args.tasks, 0)
    cfg = SimConfig(nodes=args.nodes, workers=args.workers, host_kv=args.host_kv)
    tier = f", host tier {args.host_kv:g} x the GPU KV" if args.host_kv else ""
    print(f"swe-lite, {args.tasks} tasks, {args.workers} workers, {args.nodes} nodes{tier}\n")
    print("| policy | CPU s | wall s | requests | virtual s | requests / CPU s |")
    print("|---|---|---|---|---|---|")
    total_cpu = total_wall = 0.0
    for pol in args.policies.split(","):
        c0, w0 = time.process_time(), time.perf_counter()
        res = simulate(tasks, cfg, pol, 0)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        total_cpu += cpu
        total_wall += wall
        n = len(res.requests)
        print(f"| {pol} | {cpu:.1f} | {wall:.1f} | {n} | {res.end_time:.0f} | {n / cpu:.0f} |")
    print(f"| **total** | **{total_cpu:.1f}** | **{total_wall:.1f}** | | | |")


if __name__ == "__main__":
    main()
