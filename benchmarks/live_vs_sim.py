"""Live on real engines against the simulator's prediction, on the same sessions.

A script, not a test: it prints markdown tables. Steps (each optional, see the flags)::

    tao engines up --vllm 2 --kv-blocks 512 --max-model-len 8192     # two CPU engines, 16k KV
    PYTHONPATH=. python -m benchmarks.live_vs_sim \\
        --workload benchmarks/workloads/live-cpu.toml --sessions 24 \\
        --policies tao,thunderagent,thunderagent-ideal,cache-aware --repeat 3 \\
        --profile vllm-cpu-tiny --out docs/eval/live-cpu

1. ``tao sim --write-trace`` writes the workload's sessions as a trace;
2. ``tao demo --nodes-file … --trace … --repeat R --json`` runs them live, the policies
   interleaved (``--live FILE`` reads a run kept earlier instead);
3. ``tao sim --trace … --workers S --profile P --json`` simulates the same sessions, closed
   loop with one worker per session (every session starts at once, as the demo starts them);
4. the tables: per policy the live figures (mean ± sd over repeats, paired differences to
   ``tao`` with t intervals), the release audit, and the simulator's mean latency beside the
   live one with the error and both rankings.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from shared.tables import render

_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}

LIVE = (
    ("makespan s", "wall_s"),
    ("task latency mean s", "latency_mean_s"),
    ("task latency p99 s", "latency_p99_s"),
    ("TTFT mean s", "ttft_mean_s"),
    ("TTFT p50 s", "ttft_p50_s"),
    ("TTFT p99 s", "ttft_p99_s"),
    ("TTFT p50, later cache hits s", "hit_ttft_p50_s"),
    ("prefix hit rate", "cache_hit_rate"),
    ("releases / tool call", "interrupts_per_tool_call"),
    ("releases applied", "releases_applied"),
    ("releases costlier than the hold", "releases_costly"),
)


def _tao(*args: str) -> str:
    cmd = [sys.executable, "-m", "shared.cli.main", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout


def _cell(xs: list[float], pct: bool = False) -> str:
    if not xs:
        return "-"
    f = (lambda v: f"{v * 100:.1f} %") if pct else (lambda v: f"{v:.3g}")
    if len(xs) == 1:
        return f(xs[0])
    return f"{f(statistics.fmean(xs))} ± {f(statistics.stdev(xs))}"


def _paired(a: list[float], b: list[float]) -> str:
    """Mean % difference of ``b`` over ``a`` per repeat, with its 95 % t interval."""
    d = [(y - x) / x * 100 for x, y in zip(a, b, strict=True) if x]
    if len(d) < 2:
        return "-"
    m, sd = statistics.fmean(d), statistics.stdev(d)
    half = _T975.get(len(d) - 1, 1.96) * sd / math.sqrt(len(d))
    star = "*" if abs(m) > half else ""
    return f"{m:+.1f} ± {half:.1f} %{star}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--workload", default="benchmarks/workloads/live-cpu.toml")
    p.add_argument("--sessions", type=int, default=24)
    p.add_argument("--policies", default="tao,thunderagent,thunderagent-ideal,cache-aware")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--nodes-file", default=".cache/engines/nodes.toml")
    p.add_argument("--profile", default="vllm-cpu-tiny")
    p.add_argument("--live", help="a kept `tao demo --json` output instead of running it")
    p.add_argument("--out", default="live-vs-sim", help="folder for the trace and the outputs")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "sessions.jsonl"
    if not trace.exists():
        _tao("sim", "--workload", args.workload, "--tasks", str(args.sessions),
             "--write-trace", str(trace))  # fmt: skip
    policies = args.policies.split(",")
    if args.live:
        live = json.loads(Path(args.live).read_text())
    else:
        live = json.loads(_tao(
            "demo", "--nodes-file", args.nodes_file, "--trace", str(trace),
            "--sessions", str(args.sessions), "--policies", args.policies,
            "--repeat", str(args.repeat), "--json", "--log-dir", str(out / "logs"),
        ))  # fmt: skip
        (out / "live.json").write_text(json.dumps(live) + "\n")
    sim = json.loads(_tao(
        "sim", "--trace", str(trace), "--workers", str(args.sessions), "--nodes", "2",
        "--profile", args.profile, "--policies", args.policies, "--json", "--quiet",
    ))  # fmt: skip
    (out / "sim.json").write_text(json.dumps(sim) + "\n")
    runs: dict[str, list[dict[str, Any]]] = {pol: [] for pol in policies}
    for r in live["runs"]:
        runs.setdefault(r["policy"], []).append(r)
    rows = []
    for label, key in LIVE:
        cells = [label]
        for pol in policies:
            xs = [float(r[key]) for r in runs[pol] if r.get(key) is not None]
            cells.append(_cell(xs, pct=key == "cache_hit_rate"))
        rows.append(cells)
    print("Live, mean ± sd over repeats\n")
    print(render(["metric", *policies], rows, markdown=True))
    base = policies[0]
    print(f"\nPaired against {base} (mean % difference over repeats ± 95 % t; * excludes 0)\n")
    prow = []
    for pol in policies[1:]:
        cells = [pol]
        for _, key in LIVE[:7]:
            a = [float(r.get(key) or 0) for r in runs[base]]
            b = [float(r.get(key) or 0) for r in runs[pol]]
            cells.append(_paired(a, b) if len(a) == len(b) else "-")
        prow.append(cells)
    print(render(["policy", *(label for label, _ in LIVE[:7])], prow, markdown=True))
    sim_lat = {r["policy"]: r["metrics"]["latency_mean"] for r in sim["runs"]}
    live_lat = {
        pol: statistics.fmean(float(r["latency_mean_s"]) for r in runs[pol]) for pol in policies
    }
    srow = []
    for pol in policies:
        err = (sim_lat[pol] - live_lat[pol]) / live_lat[pol] * 100
        srow.append([pol, f"{live_lat[pol]:.2f}", f"{sim_lat[pol]:.2f}", f"{err:+.1f} %"])
    rank_live = sorted(policies, key=live_lat.__getitem__)
    rank_sim = sorted(policies, key=sim_lat.__getitem__)
    print(f"\nThe simulator ({args.profile}) against live: mean task latency, s\n")
    print(render(["policy", "live", "simulated", "error"], srow, markdown=True))
    print(f"\nranking live: {' < '.join(rank_live)}; simulated: {' < '.join(rank_sim)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
