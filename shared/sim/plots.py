"""PNG plots (matplotlib, Agg backend): latency CDF, running requests over time (paper Figure 4),
ablation bars (Table 4), and one contended snapshot placed by short-first and by the DP
(Figure 10)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from shared.core.problem import PlanResult, Problem
from shared.sim.capacity import Slo
from shared.sim.report import aggregate
from shared.sim.runner import Run
from shared.sim.snapshots import SnapshotComparison

__all__ = ["ABLATIONS", "plot_ablation", "plot_all", "plot_capacity", "plot_latency_cdf",
           "plot_placement", "plot_running"]  # fmt: skip

ABLATIONS = ("tao", "tao-no-cache", "tao-no-ready", "tao-no-cache-no-ready", "tao-bfd")


def _top_workers(runs: Sequence[Run]) -> int | None:
    ws = [r.workers for r in runs]
    known = [w for w in ws if w is not None]
    return max(known) if known else None


def _save(fig: Figure, path: str) -> str:
    """Lay out, write and close ``fig``; returns ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _save_lines(fig: Figure, ax: Axes, path: str) -> str:
    """Grid and legend on a one-panel line plot, then :func:`_save`."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_latency_cdf(runs: Sequence[Run], path: str) -> str:
    """Task-latency CDF per policy (all seeds pooled) at the largest worker count."""
    w = _top_workers(runs)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pol in dict.fromkeys(r.policy for r in runs):
        lats = sorted(
            t.end - t.start
            for r in runs
            if r.policy == pol and r.workers == w and r.result is not None
            for t in r.result.tasks
        )
        if lats:
            ax.plot(lats, np.arange(1, len(lats) + 1) / len(lats), label=pol)
    ax.set_xlabel("task latency (s)")
    ax.set_ylabel("CDF")
    ax.set_title(f"Task latency CDF (workers={w})")
    return _save_lines(fig, ax, path)


def plot_running(runs: Sequence[Run], path: str) -> str:
    """Engine-running requests over time, first seed, largest worker count (Figure 4)."""
    w = _top_workers(runs)
    seed = min(r.seed for r in runs)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in runs:
        if r.workers != w or r.seed != seed or r.result is None:
            continue
        t = [s.t / 60 for s in r.result.samples]
        ax.plot(t, [s.running for s in r.result.samples], label=r.policy, lw=1)
    ax.set_xlabel("time (min)")
    ax.set_ylabel("running requests (all nodes)")
    ax.set_title(f"Running requests over time (workers={w}, seed={seed})")
    return _save_lines(fig, ax, path)


def plot_ablation(runs: Sequence[Run], path: str) -> str | None:
    """Bars of decode throughput, TTFT and tool-end→first-token for the TAO ablations present."""
    pols = [p for p in ABLATIONS if any(r.policy == p for r in runs)]
    if len(pols) < 2:
        return None
    w = _top_workers(runs)
    agg = aggregate(runs)
    panels = (("decode_tps", "decode tok/s"), ("ttft_mean", "TTFT s"),
              ("tool_to_first_mean", "tool end → 1st token s"))  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8))
    for ax, (m, label) in zip(axes, panels, strict=True):
        means = [agg[(w, p)][m][0] or 0.0 for p in pols]
        sds = [agg[(w, p)][m][1] or 0.0 for p in pols]
        ax.bar(range(len(pols)), means, yerr=sds, color="tab:blue", alpha=0.8, capsize=3)
        ax.set_xticks(range(len(pols)), pols, rotation=35, ha="right", fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"TAO ablations (workers={w})")
    return _save(fig, path)


def _draw(ax: Axes, problem: Problem, res: PlanResult, title: str) -> None:
    cands = {c.id: c for c in problem.candidates}
    cmap = plt.get_cmap("tab20")
    colour = {c.id: cmap(i % 20) for i, c in enumerate(problem.candidates)}
    for j, nd in enumerate(problem.nodes):
        x = 0.0
        for a in res.assignments:
            if a.node != nd.id:
                continue
            c = cands[a.session]
            k = c.credit.get(nd.id, 0)
            ax.barh(j, c.weight / 1000, left=x, color=colour[c.id], alpha=0.35, edgecolor="k")
            if k:
                ax.barh(j, k / 1000, left=x, color=colour[c.id], alpha=0.9, height=0.4)
            x += c.weight / 1000
        ax.plot([nd.free / 1000] * 2, [j - 0.45, j + 0.45], color="red", lw=2)
    o = res.objective
    ax.set_yticks(range(len(problem.nodes)), [nd.id for nd in problem.nodes])
    ax.set_xlabel("admission weight (k tokens); dark = cache credit kept; red = free capacity")
    ax.set_title(f"{title}: credit {o.credit:,}, admitted {o.admitted}", fontsize=10)


def plot_placement(comp: SnapshotComparison, path: str) -> str:
    """One contended snapshot placed by short-first (top) and by the DP (bottom)."""
    problem = comp.problem
    fig, axes = plt.subplots(2, 1, figsize=(9, 2.2 + 1.2 * len(problem.nodes)), sharex=True)
    _draw(axes[0], problem, comp.greedy, "(a) short-first affinity greedy")
    _draw(axes[1], problem, comp.dp, "(b) TAO dynamic program")
    fig.suptitle(f"Same snapshot (t={comp.t:.0f} s, {comp.candidates} candidates)")
    return _save(fig, path)


def plot_capacity(
    points: Mapping[tuple[str, int, int], Mapping[str, float | None]],
    slo: Slo,
    nodes: int,
    path: str,
    title: str = "",
) -> str:
    """TTFT p90 and mean task latency against agents per node, a line per policy through the
    worker counts every seed ran (the mean over seeds), the counts only some seeds' searches
    ran as faint points, each SLO term on its panel as a dashed line."""
    seeds = {k[1] for k in points}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    panels = (("ttft_p90", "TTFT p90 (s)", "ttft"), ("latency_mean", "mean task latency (s)",
                                                    "latency"))  # fmt: skip
    for ax, (metric, label, kind) in zip(axes, panels, strict=True):
        for pol in dict.fromkeys(k[0] for k in points):
            by_w: dict[int, list[float]] = {}
            for (p, _, w), pt in points.items():
                v = pt.get(metric)
                if p == pol and v is not None:
                    by_w.setdefault(w, []).append(v)
            full = sorted(w for w in by_w if len(by_w[w]) == len(seeds))
            (line,) = ax.plot([w / nodes for w in full], [float(np.mean(by_w[w])) for w in full],
                              "o-", ms=3, label=pol)  # fmt: skip
            part = sorted(w for w in by_w if len(by_w[w]) < len(seeds))
            ax.plot([w / nodes for w in part], [float(np.mean(by_w[w])) for w in part], "o",
                    ms=3, alpha=0.35, color=line.get_color())  # fmt: skip
        for term in slo.terms:
            if term.metric.startswith(kind):
                ax.axhline(term.limit, color="red", ls="--", lw=1, label=f"SLO {term.metric}")
        ax.set_xlabel("agents per node")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_all(runs: Sequence[Run], out: str) -> list[str]:
    """The run plots that apply; returns the paths written."""
    paths = [
        plot_latency_cdf(runs, os.path.join(out, "latency_cdf.png")),
        plot_running(runs, os.path.join(out, "running.png")),
    ]
    ab = plot_ablation(runs, os.path.join(out, "ablation.png"))
    if ab is not None:
        paths.append(ab)
    return paths
