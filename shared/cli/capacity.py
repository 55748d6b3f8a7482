"""``tao sim --capacity``: agents per node within an SLO, per policy (:mod:`shared.sim.capacity`).

For each seed the tasks are generated once and every policy's search runs on them. The table
gives each policy's agents per node (mean ± the 95 % t half-width over seeds, and per seed),
each compared policy's paired ratio to the best baseline, and, at the SLO's edge (each
seed's capacity of the best baseline), the compared policy's mean latency and makespan
against the baseline's (paired %), with the baseline's TTFT p90 there: the regime. With
``--out DIR``: ``capacity-<workload>.png`` (TTFT p90 and mean task latency against agents
per node, a line per policy: the mean over the seeds run at that point; the SLO drawn across)
and ``capacity.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TextIO

import orjson

from shared.core.problem import ProblemError
from shared.sim.capacity import (
    DEFAULT_SLO,
    CapacityRow,
    Search,
    Slo,
    interval,
    parse_slo,
    search_capacity,
    slo_values,
)
from shared.sim.cluster import DP_POLICIES
from shared.sim.des import SimConfig
from shared.sim.metrics import compute_metrics, paired_relative
from shared.sim.report import is_baseline, is_compared
from shared.sim.runner import LOWER_BOUND, simulate
from shared.sim.workloads import Task
from shared.tables import render, signed

__all__ = ["CAPACITY_POLICIES", "Evaluator", "add_capacity_arguments", "cmd_capacity",
           "run_capacity"]  # fmt: skip

CAPACITY_POLICIES = ("tao", "tao-slo", "thunderagent", "thunderagent-ideal", "thunderagent-decay")
"""``tao sim --capacity``'s default: TAO (the default rule set, and ``tao-slo``, the one for a
TTFT SLO) against every ThunderAgent variant."""


def add_capacity_arguments(
    p: argparse.ArgumentParser,
    positive_int: Callable[[str], int],
    non_negative: Callable[[str], float],
) -> None:
    """``tao sim``'s ``--capacity``, ``--slo`` and the search's options (with ``tao sim``'s
    argument types)."""
    p.add_argument(
        "--capacity", action="store_true",
        help="per policy, the most agents per node that meet --slo (doubling, then bisection "
        "over the worker count; one search per seed; docs/evaluation.md)",
    )  # fmt: skip
    p.add_argument("--slo", default=DEFAULT_SLO, metavar="M=V[,M=V]",
                   help=f"with --capacity: ttft_pXX / latency_pXX / *_mean at most V s, "
                   f"decode_pXX at least V tok/s (default {DEFAULT_SLO})")  # fmt: skip
    p.add_argument(
        "--start-workers",
        type=positive_int,
        default=4,
        metavar="W",
        help="with --capacity: the first worker count tried (default 4)",
    )
    p.add_argument(
        "--max-workers",
        type=positive_int,
        default=512,
        metavar="W",
        help="with --capacity: the most workers tried (default 512)",
    )
    p.add_argument("--resolution", type=non_negative, default=0.1, metavar="R",
                   help="with --capacity: bisect until within R of the lower bound (default "
                   "0.1; one worker at least)")  # fmt: skip


def run_capacity(args: argparse.Namespace, make: Callable[[int], list[Task]], desc: str,
                 config: SimConfig, timed: bool, out: TextIO) -> int:  # fmt: skip
    """``tao sim --capacity``: check the arguments, then :func:`cmd_capacity`."""
    if args.workers is not None or timed:
        raise ProblemError("--capacity", "searches the worker count: drop --workers/open loop")
    try:
        parse_slo(args.slo)
    except ValueError as exc:
        raise ProblemError("--slo", str(exc).removeprefix("slo: ")) from None
    policies = args.policies or list(CAPACITY_POLICIES)
    if LOWER_BOUND in policies:
        raise ProblemError("--policies", f"{LOWER_BOUND} has no capacity to search")
    return cmd_capacity(args, make, desc, config, policies, out)


Point = dict[str, float | None]
"""What one run gives: the SLO's metrics plus ttft_p90, latency_mean and makespan."""


class Evaluator:
    """Runs (policy, seed, workers) once each and keeps what they gave."""

    def __init__(
        self,
        make: Callable[[int], list[Task]],
        config: SimConfig,
        slo: Slo,
        log: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.make = make
        self.config = config
        self.slo = slo
        self.plot_slo = Slo((*slo.terms, *parse_slo("ttft_p90=1").terms))
        self.log = log
        self.tasks: dict[int, list[Task]] = {}
        self.points: dict[tuple[str, int, int], Point] = {}

    def tasks_for(self, seed: int) -> list[Task]:
        if seed not in self.tasks:
            self.tasks[seed] = self.make(seed)
        return self.tasks[seed]

    def point(self, policy: str, seed: int, workers: int) -> Point:
        key = (policy, seed, workers)
        if key not in self.points:
            cfg = replace(self.config, workers=workers)
            res = simulate(self.tasks_for(seed), cfg, policy, seed)
            pt = slo_values(res, self.plot_slo)
            m = compute_metrics(res, policy in DP_POLICIES)
            pt["latency_mean"] = _f(m["latency_mean"])
            pt["makespan"] = _f(m["makespan"])
            pt["ok"] = 1.0 if self.slo.met(pt) else 0.0
            self.points[key] = pt
            self.log(f"{policy} seed={seed} workers={workers}: " + _brief(pt))
        return self.points[key]

    def meets(self, policy: str, seed: int, workers: int) -> bool:
        return self.point(policy, seed, workers)["ok"] == 1.0

    def meets_for(self, policy: str, seed: int) -> Callable[[int], bool]:
        """``workers → met`` for one (policy, seed): the search's evaluator."""
        return lambda workers: self.meets(policy, seed, workers)


def _silent(_: str) -> None:
    pass


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def _f(v: float | int | None) -> float | None:
    return None if v is None else float(v)


def _brief(pt: Point) -> str:
    return ", ".join(f"{k}={v:.3g}" for k, v in pt.items() if v is not None)


def _rows(
    searches: dict[tuple[str, int], Search], policies: Sequence[str], nodes: int
) -> tuple[list[CapacityRow], str | None]:
    caps = {
        p: {s: se.best / nodes for (pp, s), se in searches.items() if pp == p} for p in policies
    }
    capped = {p: any(se.capped for (pp, _), se in searches.items() if pp == p) for p in policies}
    bases = [p for p in policies if is_baseline(p)]
    best = max(bases, key=lambda p: interval(list(caps[p].values()))[0], default=None)
    rows: list[CapacityRow] = []
    for p in policies:
        ratio = None
        if best is not None and is_compared(p):
            r = [caps[p][s] / caps[best][s] for s in caps[p] if caps[best].get(s)]
            ratio = interval(r) if r else None
        rows.append(CapacityRow(p, caps[p], capped[p], best if ratio else None, ratio))
    return rows, best


def _pm(m: float, half: float | None, fmt: str = "{:.2f}") -> str:
    return fmt.format(m) + ("" if half is None else f" ± {fmt.format(half)}")


def cmd_capacity(args: argparse.Namespace, make: Callable[[int], list[Task]], desc: str,
                 config: SimConfig, policies: Sequence[str], out: TextIO) -> int:  # fmt: skip
    """Search every policy on every seed; print (or ``--json``) the table; plots with --out."""
    slo = parse_slo(args.slo)
    ev = Evaluator(make, config, slo, _silent if args.quiet else _stderr)
    seeds = list(range(args.seeds))
    searches: dict[tuple[str, int], Search] = {}
    for seed in seeds:
        # a closed loop with more workers than tasks starts every task at once: the same run
        top = min(args.max_workers, len(ev.tasks_for(seed)))
        for p in policies:
            searches[(p, seed)] = search_capacity(
                ev.meets_for(p, seed),
                start=min(args.start_workers, top),
                max_workers=top,
                resolution=args.resolution,
            )
    rows, best = _rows(searches, policies, config.nodes)
    edge = _edge(ev, searches, policies, best, seeds)
    if args.json:
        doc = {"slo": str(slo), "nodes": config.nodes, "best_baseline": best,
               "rows": [{"policy": r.policy, "agents_per_node": r.per_seed, "capped": r.capped,
                         "ratio": r.ratio} for r in rows],
               "edge": edge, "points": [[*k, v] for k, v in ev.points.items()]}  # fmt: skip
        out.write(orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        out.write(_table(rows, edge, best, slo, desc, config) + "\n")
    if args.out is not None:
        from shared.sim.plots import plot_capacity

        name = (args.workload or "workload").replace("/", "_").rsplit(".", 1)[0]
        path = os.path.join(args.out, f"capacity-{os.path.basename(name)}.png")
        plot_capacity(ev.points, slo, config.nodes, path, title=f"{desc}, SLO {slo}")
        with open(os.path.join(args.out, "capacity.json"), "wb") as fh:
            fh.write(orjson.dumps({"slo": str(slo), "points": [[*k, v] for k, v in
                                                               ev.points.items()]}))  # fmt: skip
    return 0


def _edge(
    ev: Evaluator,
    searches: dict[tuple[str, int], Search],
    policies: Sequence[str],
    best: str | None,
    seeds: Sequence[int],
) -> dict[str, dict[str, object]]:
    """Each compared policy against ``best`` at ``best``'s per-seed capacity (workers > 0)."""
    out: dict[str, dict[str, object]] = {}
    if best is None:
        return out
    at = {s: searches[(best, s)].best for s in seeds if searches[(best, s)].best > 0}
    base = {s: ev.point(best, s, w) for s, w in at.items()}
    ttft = [v for s in at if (v := base[s].get("ttft_p90")) is not None]
    for p in policies:
        if not is_compared(p):
            continue
        ours = {s: ev.point(p, s, w) for s, w in at.items()}
        doc: dict[str, object] = {"workers": at, "baseline_ttft_p90": interval(ttft) if ttft
                                  else None}  # fmt: skip
        for m in ("latency_mean", "makespan", "ttft_p90"):
            st = paired_relative([(ours[s].get(m), base[s].get(m)) for s in at])
            doc[m] = None if st is None else (st.mean, st.low, st.high)
        out[p] = doc
    return out


def _table(rows: list[CapacityRow], edge: dict[str, dict[str, object]], best: str | None,
           slo: Slo, desc: str, config: SimConfig) -> str:  # fmt: skip
    seeds = sorted({s for r in rows for s in r.per_seed})
    head = ["policy", "agents/node", *(f"seed {s}" for s in seeds), f"× {best or 'baseline'}"]
    body = []
    for r in rows:
        m, h = r.mean
        cells = [r.policy, _pm(m, h) + (" (capped)" if r.capped else "")]
        cells += [f"{r.per_seed.get(s, float('nan')):.2f}" for s in seeds]
        cells.append("–" if r.ratio is None else _pm(*r.ratio, fmt="{:.3f}"))
        body.append(cells)
    where = f"{config.nodes} x {config.profile}" + (
        f", host tier {config.host_kv:g}x" if config.host_kv else ""
    )
    text = f"{desc}, {where}; SLO {slo}\n" + render(head, body, width=None)
    if edge:
        head2 = ["at the SLO's edge", "latency %", "makespan %", "TTFT p90 %", "base TTFT p90 s"]
        body2 = []
        for p, d in edge.items():
            cells = [f"{p} vs {best}"]
            for metric in ("latency_mean", "makespan", "ttft_p90"):
                v = d.get(metric)
                if isinstance(v, tuple):
                    lo = v[1]
                    cells.append(signed(v[0]) + ("" if lo is None else f" ± {v[0] - lo:.1f}"))
                else:
                    cells.append("–")
            bt = d.get("baseline_ttft_p90")
            cells.append(_pm(*bt) if isinstance(bt, tuple) else "–")
            body2.append(cells)
        text += "\n\n" + render(head2, body2, width=None)
        text += (
            f"\nEdge: each seed's largest worker count within the SLO for {best}; the "
            "compared policy runs there too (paired %, negative = lower)."
        )
    if any(r.capped for r in rows):
        text += (
            "\n(capped): the SLO held at the search's top, the smaller of --max-workers and the "
            "tasks (more workers than tasks is the same run): a lower bound, not a capacity."
        )
    return text
