"""Paired comparisons and makespan ratios from ``tao sim --json`` output, for the paper rows.

    .venv/bin/python -m benchmarks.paper_tables out.json --pair tao:thunderagent \\
        --metrics latency_mean,ttft_mean,decode_tps,makespan
    .venv/bin/python -m benchmarks.paper_tables out.json --ratio thunderagent:tao --metrics makespan

``--pair P:B`` prints, per worker count and metric, (P − B) / B × 100 paired by seed: mean ±
95 % Student-t half-width (``shared.sim.metrics.paired_relative``, the formula of ``tao sim``'s
paired table; ``*`` when the interval excludes 0). Unlike ``tao sim``'s own table it pairs any
two policies, e.g. an ablation against ``tao``. ``--ratio A:B`` prints the per-seed ratio A / B
(Fig. 4's makespan ratios) as mean ± the same half-width. ``--means`` prints each policy's mean
over seeds. Several files are read as one set of runs (one sim process per file).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from shared.sim.metrics import paired_relative, t_quantile

__all__ = ["load_runs", "paired_rows", "ratio_rows"]

Run = dict[str, object]


def load_runs(paths: Sequence[str]) -> list[Run]:
    """Every run of every ``tao sim --json`` file."""
    runs: list[Run] = []
    for p in paths:
        runs.extend(json.loads(Path(p).read_text())["runs"])
    return runs


def _by_seed(runs: Sequence[Run], policy: str, workers: object, metric: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for r in runs:
        if r["policy"] == policy and r["workers"] == workers:
            m = r["metrics"]
            assert isinstance(m, dict)
            v = m.get(metric)
            if v is not None:
                out[int(str(r["seed"]))] = float(v)
    return out


def _workers(runs: Sequence[Run]) -> list[object]:
    return sorted({r["workers"] for r in runs}, key=lambda w: (w is None, w))


def paired_rows(runs: Sequence[Run], p: str, b: str, metrics: Sequence[str]) -> list[str]:
    """One line per (workers, metric): P against B paired by seed."""
    lines = []
    for w in _workers(runs):
        for metric in metrics:
            ps, bs = _by_seed(runs, p, w, metric), _by_seed(runs, b, w, metric)
            seeds = sorted(set(ps) & set(bs))
            res = paired_relative([(ps[s], bs[s]) for s in seeds])
            if res is None:
                continue
            text = f"{res.mean:+.1f} %"
            if res.low is not None and res.high is not None:
                star = "*" if res.low > 0 or res.high < 0 else ""
                text += f" ± {res.mean - res.low:.1f}{star}"
            lines.append(f"| {w} | {metric} | {p} vs {b} | {text} | n={res.n} |")
    return lines


def ratio_rows(runs: Sequence[Run], a: str, b: str, metrics: Sequence[str]) -> list[str]:
    """One line per (workers, metric): the per-seed ratio A / B, mean ± 95 % half-width."""
    lines = []
    for w in _workers(runs):
        for metric in metrics:
            xs, ys = _by_seed(runs, a, w, metric), _by_seed(runs, b, w, metric)
            ratios = [xs[s] / ys[s] for s in sorted(set(xs) & set(ys)) if ys[s]]
            if not ratios:
                continue
            n = len(ratios)
            m = math.fsum(ratios) / n
            text = f"{m:.3f}"
            if n > 1:
                sd = math.sqrt(math.fsum((r - m) ** 2 for r in ratios) / (n - 1))
                text += f" ± {t_quantile(0.975, n - 1) * sd / math.sqrt(n):.3f}"
            lines.append(f"| {w} | {metric} | {a} / {b} | {text} | n={n} |")
    return lines


def mean_rows(runs: Sequence[Run], metrics: Sequence[str]) -> list[str]:
    """One line per (workers, policy): each metric's mean over seeds."""
    lines = []
    for w in _workers(runs):
        for pol in dict.fromkeys(str(r["policy"]) for r in runs):
            cells = []
            for metric in metrics:
                vs = list(_by_seed(runs, pol, w, metric).values())
                cells.append(f"{math.fsum(vs) / len(vs):.4g}" if vs else "–")
            lines.append(f"| {w} | {pol} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--pair", action="append", default=[], metavar="P:B")
    ap.add_argument("--ratio", action="append", default=[], metavar="A:B")
    ap.add_argument("--means", action="store_true")
    ap.add_argument("--metrics", default="latency_mean,ttft_mean,decode_tps")
    args = ap.parse_args()
    runs = load_runs(args.files)
    metrics = args.metrics.split(",")
    if args.means:
        print("| workers | policy | " + " | ".join(metrics) + " |")
        print("\n".join(mean_rows(runs, metrics)))
    for spec in args.pair:
        p, b = spec.split(":")
        print("\n".join(paired_rows(runs, p, b, metrics)))
    for spec in args.ratio:
        a, b = spec.split(":")
        print("\n".join(ratio_rows(runs, a, b, metrics)))


if __name__ == "__main__":
    main()
