"""Scheduling domains in simulation: TAO per domain against one global TAO planner and the
domain-less baselines, on the same tasks.

A script, not a test: it prints a markdown table to stdout (progress on stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.domains                      # 64 nodes, 8 domains
    PYTHONPATH=. .venv/bin/python -m benchmarks.domains --grid 64:8,128:16 --seeds 2

For each ``nodes:domains`` cell of ``--grid``: swe-lite tasks (``--per-node`` workers and
tasks per node, so contention is that of the default 4-node, 64-worker runs), then
``tao`` with one global planner over every node, ``tao`` in ``domains`` domains
(``SimConfig.domains``: a planner per domain, the upper-level least-loaded choice of
shared/core/domains.py), and the baselines ``--baselines`` (routers and ThunderAgent are
domain-less). Columns: mean task latency, mean TTFT, prefix hit rate, the planning round's
time per tick (``solve_ms``: valuation + interrupt rule + solve, wall clock in this process;
under domains each tick is one domain's), the share of DP rounds that fell back from the
exact solve, and latency against the global planner, paired on seeds (mean %, and its 95 % t
interval with several seeds).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from shared.core.planner import warm_up
from shared.sim.des import SimConfig
from shared.sim.metrics import compute_metrics, mean, paired_relative, pct
from shared.sim.runner import simulate
from shared.sim.workloads import generate_tasks, load_workload


def _cell(nodes: int, domains: int, per_node: int, seeds: int, baselines: list[str]) -> None:
    rows: dict[str, list[dict[str, float | int | None]]] = {}
    work = load_workload("swe-lite")
    base = SimConfig(nodes=nodes, workers=per_node * nodes)
    runs = [
        ("tao global", "tao", base),
        (f"tao {domains} domains", "tao", replace(base, domains=domains)),
    ]
    runs += [(b, b, base) for b in baselines]
    for seed in range(seeds):
        tasks = generate_tasks(work, per_node * nodes, seed)
        for label, policy, cfg in runs:
            t0 = time.perf_counter()
            res = simulate(tasks, cfg, policy, seed)
            m = compute_metrics(res, policy == "tao")
            ticks = [t.solve_s * 1000.0 for t in res.ticks]
            m["tick_ms_p50"], m["tick_ms_p99"] = pct(ticks, 50), pct(ticks, 99)
            del res  # one run's records at a time: 256 nodes' runs take gigabytes
            rows.setdefault(label, []).append(m)
            print(
                f"{nodes}:{domains} seed {seed} {label}: {time.perf_counter() - t0:.0f} s; "
                f"latency {m['latency_mean']}, TTFT {m.get('ttft_mean')}, "
                f"hit {m.get('prefix_hit_rate')}, tick p50/p99 {m['tick_ms_p50']}/"
                f"{m['tick_ms_p99']}, fallback {m.get('fallback_rate')}",
                file=sys.stderr,
                flush=True,
            )  # fmt: skip (a row survives a later OOM kill)
    print(f"\n{nodes} nodes, {per_node * nodes} workers and tasks (swe-lite), {seeds} seed(s)\n")
    print("| scheduler | latency s | TTFT s | hit rate | tick ms p50 / p99 | fallback rate "
          "| latency vs global % |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    glob = [float(m["latency_mean"] or 0) for m in rows["tao global"]]
    for label, ms in rows.items():
        lat = [float(m["latency_mean"] or 0) for m in ms]

        def avg(key: str, ms: list[dict[str, float | int | None]] = ms) -> float:
            xs = [float(v) for m in ms if (v := m.get(key)) is not None]
            return mean(xs) or 0.0

        vs = "–"
        if label != "tao global":
            p = paired_relative(list(zip(lat, glob, strict=True)))
            if p is not None:
                vs = f"{p.mean:+.1f}"
                if p.low is not None and p.high is not None:
                    vs += f" [{p.low:+.1f}, {p.high:+.1f}]"
        tick = "–"
        if label.startswith("tao"):
            tick = f"{avg('tick_ms_p50'):.1f} / {avg('tick_ms_p99'):.1f}"
        fb = f"{avg('fallback_rate'):.3f}" if label.startswith("tao") else "–"
        hit = avg("prefix_hit_rate")
        print(f"| {label} | {mean(lat):.1f} | {avg('ttft_mean'):.3f} | {hit:.3f} "
              f"| {tick} | {fb} | {vs} |")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="64:8", help="nodes:domains cells (default 64:8)")
    ap.add_argument("--per-node", type=int, default=16, help="workers and tasks per node")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--baselines", default="rr,thunderagent")
    args = ap.parse_args()
    warm_up()
    for cell in args.grid.split(","):
        nodes, domains = (int(x) for x in cell.split(":"))
        _cell(
            nodes, domains, args.per_node, args.seeds, [b for b in args.baselines.split(",") if b]
        )


if __name__ == "__main__":
    main()
