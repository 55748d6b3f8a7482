"""One simulator run per (policy, seed), reduced to a hash over every request record.

A script, not a test: it prints a markdown table. Run it in two source trees (the previous
commit in a git worktree beside this one) to show a change leaves the simulator's results as
they were, request by request::

    git worktree add --detach ../old <commit>
    for t in ../old .; do (cd $t && PYTHONPATH=. python /path/to/benchmarks/sim_hash.py \\
        --workload claude-code --profile deepseek-4xh100 --workers 32 --tasks 60 \\
        --policies tao --seeds 0,1,2 --host-kv 0,4); done

The hash covers each request's session, turn, node, issue and first-token times (ns) and
cached tokens; runs are deterministic for a seed (virtual time), so equal hashes mean equal
runs.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
from dataclasses import replace

from shared.sim.des import SimConfig
from shared.sim.metrics import compute_metrics
from shared.sim.runner import simulate
from shared.sim.workloads import generate_tasks, load_workload
from shared.tables import render


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--workload", default="claude-code")
    p.add_argument("--profile", default="deepseek-4xh100")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--tasks", type=int, default=60)
    p.add_argument("--policies", default="tao")
    p.add_argument("--seeds", type=_ints, default=[0])
    p.add_argument("--host-kv", type=_floats, default=[0.0])
    args = p.parse_args()
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    spec = load_workload(args.workload)
    rows = []
    for seed in args.seeds:
        tasks = generate_tasks(spec, args.tasks, seed)
        for kv in args.host_kv:
            cfg = replace(
                SimConfig(nodes=args.nodes, profile=args.profile, workers=args.workers),
                host_kv=kv,
            )
            for pol in args.policies.split(","):
                res = simulate(tasks, cfg, pol, seed)
                h = hashlib.sha256()
                for r in res.requests:
                    key = (r.session, r.turn, r.node, round(r.issued * 1e9),
                           round(r.first_token * 1e9), r.cached)  # fmt: skip
                    h.update(repr(key).encode())
                m = compute_metrics(res, False)
                rows.append([head, pol, str(seed), f"{kv:g}", h.hexdigest()[:12],
                             f"{m['latency_mean']:.1f}", f"{res.end_time:.1f}"])  # fmt: skip
    header = ["code", "policy", "seed", "host kv", "hash", "latency s", "makespan s"]
    print(render(header, rows, markdown=True))


if __name__ == "__main__":
    main()
