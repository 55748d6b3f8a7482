"""Aggregation, the comparison table, and the files ``tao sim --out DIR`` writes.

Files: ``report.md`` (the tables and the figures), ``runs.csv`` (one row per run, every
metric), ``summary.csv`` (mean and sd over seeds per workers × policy), ``timeseries.csv``
(running / waiting / held / admitted over time per run), ``ticks.csv`` (one row per scheduling
round of pooled policies), ``snapshots.csv`` (the DP vs short-first study, when captured) and the
PNG plots of :mod:`shared.sim.plots`.

Paired comparison (:func:`paired_comparisons`, :func:`paired_table`): for every workers value,
every compared policy (:func:`is_compared`: the tao family and ``oracle``) against every
baseline that ran (:func:`is_baseline`), and each metric of :data:`PAIRED_METRICS`, the seeds
both ran are paired and :func:`shared.sim.metrics.paired_relative` gives

    d_s = (policy_s − baseline_s) / baseline_s × 100 per seed s,
    mean_pct = mean of d_s,  CI = mean_pct ± t_{0.975, n−1} · sd(d_s) / sqrt(n)

(sd with n − 1 in the denominator; 0 % when both are 0; a seed whose baseline is 0 while the
policy is not is dropped; no interval for n = 1). The sign is raw: negative = the policy's
value is lower (better for latencies, preemptions, recomputation; worse for throughput and hit
rate).
"""

from __future__ import annotations

import csv
import math
import os
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from shared.sim.metrics import (
    HIGHER_IS_BETTER,
    LOWER_IS_BETTER,
    METRICS,
    improvement,
    paired_relative,
)
from shared.sim.runner import LOWER_BOUND, Run
from shared.sim.snapshots import SnapshotStudy
from shared.tables import render, signed

__all__ = [
    "BASELINE_NAMES",
    "PAIRED_METRICS",
    "TABLE_METRICS",
    "PairedRow",
    "aggregate",
    "comparison_table",
    "is_baseline",
    "is_compared",
    "paired_comparisons",
    "paired_docs",
    "paired_table",
    "write_csvs",
    "write_report",
]

TEXT_WIDTH = 100
"""The widest line of a plain table (wider ones are cut into column blocks)."""
BASELINE_NAMES = ("rr", "cache-aware", "kv-aware", "thunderagent", "short-first")
"""Policies a TAO variant is compared against (the paper's baselines plus short-first); any
name starting with ``thunderagent`` is a baseline too (:func:`is_baseline`)."""


def is_baseline(policy: str) -> bool:
    """A baseline: one of :data:`BASELINE_NAMES` or a ``thunderagent*`` variant."""
    return policy in BASELINE_NAMES or policy.startswith("thunderagent")


def is_compared(policy: str) -> bool:
    """A policy compared against the baselines: the tao family (``tao*``) and ``oracle``."""
    return policy.startswith("tao") or policy == "oracle"


TABLE_METRICS: tuple[tuple[str, str, str], ...] = (
    ("latency_mean", "latency s", "{:.1f}"),
    ("makespan", "makespan s", "{:.0f}"),
    ("latency_p99", "lat p99 s", "{:.1f}"),
    ("ttft_mean", "TTFT s", "{:.3f}"),
    ("ttft_p99", "TTFT p99 s", "{:.2f}"),
    ("decode_tps", "decode tok/s", "{:.1f}"),
    ("prefix_hit_rate", "hit rate", "{:.3f}"),
    ("tool_to_first_mean", "tool→1st s", "{:.3f}"),
    ("pause_wait_mean", "pause s", "{:.3f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("recomputed_tokens", "recomp tok", "{:.0f}"),
)
"""(metric, column title, format) of the comparison table."""

PAIRED_METRICS: tuple[tuple[str, str], ...] = (
    ("latency_mean", "latency"),
    ("makespan", "makespan"),
    ("ttft_mean", "TTFT"),
    ("ttft_p99", "TTFT p99"),
    ("prefix_hit_rate", "hit rate"),
    ("decode_tps", "decode tok/s"),
    ("preemptions", "preempt"),
    ("recomputed_tokens", "recomp tok"),
)
"""(metric, column title) of the paired comparison (table and ``--json``'s ``paired``)."""

Agg = dict[str, tuple[float | None, float | None, int]]


def _key(w: int | None) -> int:
    return -1 if w is None else w


def aggregate(runs: Iterable[Run]) -> dict[tuple[int | None, str], Agg]:
    """(workers, policy) → metric → (mean, sd, n) over seeds; sd is None for one seed."""
    groups: dict[tuple[int | None, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.workers, r.policy), []).append(r)
    out: dict[tuple[int | None, str], Agg] = {}
    for key, rs in groups.items():
        agg: Agg = {}
        for m in METRICS:
            vals = [float(v) for r in rs if (v := r.metrics.get(m)) is not None]
            if not vals:
                agg[m] = (None, None, 0)
                continue
            sd = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
            agg[m] = (float(np.mean(vals)), sd, len(vals))
        out[key] = agg
    return out


def _cell(mean: float | None, sd: float | None, fmt: str) -> str:
    if mean is None or math.isnan(mean):
        return "–"
    text = fmt.format(mean)
    return text if sd is None else f"{text} ± {fmt.format(sd)}"


def _best_baseline(
    agg: dict[tuple[int | None, str], Agg], w: int | None, policies: Sequence[str], metric: str
) -> tuple[str, float] | None:
    best: tuple[str, float] | None = None
    for p in policies:
        if not is_baseline(p) or (w, p) not in agg:
            continue
        mean = agg[(w, p)][metric][0]
        if mean is None:
            continue
        if best is None or (improvement(metric, mean, best[1]) or 0.0) > 0:
            best = (p, mean)
    return best


@dataclass(frozen=True, slots=True)
class PairedRow:
    """One (workers, policy, baseline, metric) paired comparison; percentages, see the module
    docstring. ``ci_low_pct``/``ci_high_pct`` are None with one seed."""

    policy: str
    baseline: str
    workers: int | None
    metric: str
    n: int
    mean_pct: float
    ci_low_pct: float | None
    ci_high_pct: float | None

    @property
    def excludes_zero(self) -> bool:
        lo, hi = self.ci_low_pct, self.ci_high_pct
        return lo is not None and hi is not None and (lo > 0 or hi < 0)

    def doc(self) -> dict[str, object]:
        """The ``--json`` object."""
        return {"policy": self.policy, "baseline": self.baseline, "workers": self.workers,
                "metric": self.metric, "n": self.n, "mean_pct": self.mean_pct,
                "ci_low_pct": self.ci_low_pct, "ci_high_pct": self.ci_high_pct}  # fmt: skip


def paired_comparisons(runs: Sequence[Run]) -> list[PairedRow]:
    """Every compared policy against every baseline that ran, per workers value and metric of
    :data:`PAIRED_METRICS`, paired by seed. A metric with no usable pair has no row."""
    by_cell: dict[tuple[int | None, str], dict[int, Run]] = {}
    for r in runs:
        by_cell.setdefault((r.workers, r.policy), {})[r.seed] = r
    workers = sorted({r.workers for r in runs}, key=_key)
    policies = list(dict.fromkeys(r.policy for r in runs))
    out: list[PairedRow] = []
    for w in workers:
        for p in policies:
            if not is_compared(p) or (w, p) not in by_cell:
                continue
            ours = by_cell[(w, p)]
            for b in policies:
                if not is_baseline(b) or (w, b) not in by_cell:
                    continue
                base = by_cell[(w, b)]
                seeds = sorted(set(ours) & set(base))
                for m, _ in PAIRED_METRICS:
                    pairs = [(_num(ours[s].metrics.get(m)), _num(base[s].metrics.get(m)))
                             for s in seeds]  # fmt: skip
                    st = paired_relative(pairs)
                    if st is not None:
                        out.append(PairedRow(p, b, w, m, st.n, st.mean, st.low, st.high))
    return out


def _num(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def _paired_cell(row: PairedRow | None, n_row: int) -> str:
    if row is None:
        return "–"
    text = signed(row.mean_pct)
    if row.ci_low_pct is not None:
        text += f" ± {row.mean_pct - row.ci_low_pct:.1f}" + ("*" if row.excludes_zero else "")
    if row.n != n_row:
        text += f" (n={row.n})"
    return text


def paired_docs() -> str:
    """The legend of :func:`paired_table`."""
    arrows = ", ".join(
        f"{t} {'↓' if m in LOWER_IS_BETTER else '↑' if m in HIGHER_IS_BETTER else ''}"
        for m, t in PAIRED_METRICS
    )
    return (
        "Paired difference vs each baseline, % (mean over seeds of (policy − baseline) / "
        "baseline ± the 95 % Student-t half-width, n − 1 df; * = the interval excludes 0; "
        f"no ± with one seed).\nBetter is: {arrows}."
    )


def paired_table(rows: Sequence[PairedRow], *, markdown: bool = False) -> str | None:
    """The paired comparison table of ``rows`` (one workers value; from
    :func:`paired_comparisons`): a row per (policy vs baseline), a column per metric; None
    for no rows."""
    if not rows:
        return None
    cells: dict[tuple[str, str], dict[str, PairedRow]] = {}
    for r in rows:
        cells.setdefault((r.policy, r.baseline), {})[r.metric] = r
    header = ["paired % vs baseline", "seeds", *(t for _, t in PAIRED_METRICS)]
    body: list[list[str]] = []
    for (p, b), per in cells.items():
        n = max(r.n for r in per.values())
        body.append([f"{p} vs {b}", str(n),
                     *(_paired_cell(per.get(m), n) for m, _ in PAIRED_METRICS)])  # fmt: skip
    return _render(header, body, markdown)


def comparison_table(runs: Sequence[Run], *, markdown: bool = False) -> str:
    """One table per workers value: policies × metrics (mean ± sd; makespan beside mean
    latency), then each non-baseline policy's improvement over the best baseline per metric
    (positive = better; the paper's Table 1 'Rel. Imprv.'); then the paired comparison
    (:func:`paired_table`) below it. The title names the best baseline's mean TTFT, so the
    regime (how long requests wait) shows beside the gains."""
    agg = aggregate(runs)
    workers = sorted({r.workers for r in runs}, key=_key)
    policies = list(dict.fromkeys(r.policy for r in runs))
    all_paired = paired_comparisons(runs)
    blocks: list[str] = []
    for w in workers:
        header = ["policy", *(t for _, t, _ in TABLE_METRICS)]
        rows: list[list[str]] = []
        for p in policies:
            if (w, p) not in agg:
                continue
            a = agg[(w, p)]
            rows.append([p, *(_cell(a[m][0], a[m][1], f) for m, _, f in TABLE_METRICS)])
        for p in policies:
            if is_baseline(p) or p == LOWER_BOUND or (w, p) not in agg:
                continue
            cells = [f"{p} vs best baseline"]
            for m, _, _ in TABLE_METRICS:
                best = _best_baseline(agg, w, policies, m)
                imp = None if best is None else improvement(m, agg[(w, p)][m][0], best[1])
                cells.append("–" if imp is None else f"{signed(imp)}% ({best[0] if best else ''})")
            rows.append(cells)
        n = max((a[METRICS[0]][2] for (ww, _), a in agg.items() if ww == w), default=0)
        title = f"workers={w if w is not None else 'open-loop'} (seeds: {n})"
        regime = _best_baseline(agg, w, policies, "ttft_mean")
        if regime is not None:  # the regime: how long the best baseline's requests wait
            title += f"; best baseline TTFT {regime[1]:.3f} s ({regime[0]})"
        block = title + "\n" + _render(header, rows, markdown)
        paired = paired_table([r for r in all_paired if r.workers == w], markdown=markdown)
        if paired is not None:
            block += "\n\n" + paired
        blocks.append(block)
    if all_paired:
        legend = paired_docs().split("\n")
        sep = " " if markdown else "\n"
        blocks.append(sep.join(line if markdown else textwrap.fill(line, 100) for line in legend))
    return "\n\n".join(blocks)


def _render(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    return render(header, rows, markdown=markdown, width=None if markdown else TEXT_WIDTH)


def write_csvs(runs: Sequence[Run], out: str, study: SnapshotStudy | None = None) -> list[str]:
    """runs.csv, summary.csv, timeseries.csv, ticks.csv (and snapshots.csv); returns paths."""
    paths: list[str] = []

    def open_csv(name: str, header: Sequence[str]) -> tuple[object, csv.DictWriter[str]]:
        path = os.path.join(out, name)
        paths.append(path)
        fh = open(path, "w", newline="", encoding="utf-8")  # noqa: SIM115 - closed below
        wr = csv.DictWriter(fh, fieldnames=list(header))
        wr.writeheader()
        return fh, wr

    fh, wr = open_csv("runs.csv", ["policy", "seed", "workers", "nodes", *METRICS])
    for r in runs:
        wr.writerow({"policy": r.policy, "seed": r.seed, "workers": r.workers, "nodes": r.nodes,
                     **r.metrics})  # fmt: skip
    fh.close()  # type: ignore[attr-defined]
    agg = aggregate(runs)
    cols = ["workers", "policy", "seeds"] + [f"{m}_{s}" for m in METRICS for s in ("mean", "sd")]
    fh, wr = open_csv("summary.csv", cols)
    for (w, p), a in sorted(agg.items(), key=lambda kv: (_key(kv[0][0]), kv[0][1])):
        row: dict[str, object] = {"workers": w, "policy": p, "seeds": a[METRICS[0]][2]}
        for m in METRICS:
            row[f"{m}_mean"], row[f"{m}_sd"] = a[m][0], a[m][1]
        wr.writerow(row)
    fh.close()  # type: ignore[attr-defined]
    fh, wr = open_csv(
        "timeseries.csv", ["policy", "seed", "workers", "t", "running", "waiting", "held",
                           "admitted"]
    )  # fmt: skip
    for r in runs:
        if r.result is None:
            continue
        for s in r.result.samples:
            wr.writerow({"policy": r.policy, "seed": r.seed, "workers": r.workers, "t": s.t,
                         "running": s.running, "waiting": s.waiting, "held": s.held,
                         "admitted": s.admitted})  # fmt: skip
    fh.close()  # type: ignore[attr-defined]
    tick_cols = ["policy", "seed", "workers", "t", "pool", "demand", "free", "capacity", "exact",
                 "method", "solve_s", "interrupts", "admits", "truncated"]  # fmt: skip
    fh, wr = open_csv("ticks.csv", tick_cols)
    for r in runs:
        if r.result is None:
            continue
        for t in r.result.ticks:
            wr.writerow({"policy": r.policy, "seed": r.seed, "workers": r.workers, "t": t.t,
                         "pool": t.pool, "demand": t.demand, "free": t.free,
                         "capacity": t.capacity, "exact": t.exact, "method": t.method,
                         "solve_s": t.solve_s, "interrupts": t.interrupts, "admits": t.admits,
                         "truncated": t.truncated})  # fmt: skip
    fh.close()  # type: ignore[attr-defined]
    if study is not None:
        fh, wr = open_csv(
            "snapshots.csv",
            ["t", "candidates", "verdict", "dp_credit", "dp_ready", "dp_tokens", "dp_admitted",
             "sf_credit", "sf_ready", "sf_tokens", "sf_admitted"],
        )  # fmt: skip
        for c in study.comparisons:
            o1, o2 = c.dp.objective, c.greedy.objective
            wr.writerow({"t": c.t, "candidates": c.candidates, "verdict": c.verdict,
                         "dp_credit": o1.credit, "dp_ready": o1.ready, "dp_tokens": o1.tokens,
                         "dp_admitted": o1.admitted, "sf_credit": o2.credit,
                         "sf_ready": o2.ready, "sf_tokens": o2.tokens,
                         "sf_admitted": o2.admitted})  # fmt: skip
        fh.close()  # type: ignore[attr-defined]
    return paths


def study_text(study: SnapshotStudy) -> str:
    """One paragraph on the DP vs short-first snapshot study."""
    n = len(study.comparisons)
    if n == 0:
        return "No contended snapshot (a round with more than one candidate) was captured."
    gains = study.credit_gains()
    text = (
        f"{n} contended snapshots: the DP's lexicographic objective was better on "
        f"{study.improved} ({study.improved / n:.1%}), equal on {study.equal}, worse on "
        f"{study.worse}."
    )
    if gains:
        rel = [(a - b) / b * 100 for a, b in gains if b > 0]
        text += (
            f" Where better, cache credit kept: mean {np.mean([a for a, _ in gains]):.0f} vs "
            f"{np.mean([b for _, b in gains]):.0f} tokens"
            + (f" ({np.mean(rel):+.1f}% on average where the greedy kept some)." if rel else ".")
        )
    return text


def write_report(
    runs: Sequence[Run],
    out: str,
    *,
    title: str,
    command: str,
    study: SnapshotStudy | None = None,
    images: Sequence[str] = (),
) -> str:
    """report.md in ``out``; returns its path."""
    lines = [
        f"# {title}",
        "",
        f"Command: `{command}`",
        "",
        "Mean ± sd over seeds. Improvement rows: relative to the best baseline "
        f"({', '.join(b for b in BASELINE_NAMES if not b.startswith('thunderagent'))}, "
        "thunderagent*) per metric; positive = better, "
        "negative = a loss. Below each table, the paired comparison against every baseline "
        "(seeds paired: every policy ran the same tasks per seed).",
        "",
        comparison_table(runs, markdown=True),
        "",
    ]
    if study is not None:
        lines += ["## DP vs short-first on contended snapshots", "", study_text(study), ""]
    for img in images:
        name = os.path.basename(img)
        lines += [f"![{name}]({name})", ""]
    path = os.path.join(out, "report.md")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))
    return path
