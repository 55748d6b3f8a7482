"""``tao sim``: the trace-driven cluster simulator (shared/sim) from the command line.

Runs every (workers × seed × policy) cell on the same tasks per seed, prints the comparison
table and the paired comparison against each baseline (or ``--json``: ``runs`` and ``paired``,
see :mod:`shared.sim.report`), and with ``--out DIR`` writes report.md, CSVs and PNG plots.
Progress goes to stderr: a redrawn bar on a terminal, one line per finished run otherwise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, TextIO

import orjson

from shared.cli.capacity import CAPACITY_POLICIES, add_capacity_arguments
from shared.core.engine import DEFAULT_PROFILE, PROFILES
from shared.core.policies import DEFAULT_BUDGET
from shared.core.problem import ProblemError
from shared.sim.des import SimConfig
from shared.sim.describe import describe
from shared.sim.runner import SIM_POLICIES, Run, run_grid, simulate
from shared.sim.snapshots import SnapshotStudy, compare_snapshots
from shared.sim.workloads import BUILTIN, Task, generate_tasks, load_workload

__all__ = ["DEFAULT_POLICIES", "add_sim_parser", "cmd_sim", "int_at_least", "positive_number"]

DEFAULT_POLICIES = ("tao", "rr", "cache-aware", "kv-aware", "thunderagent", "thunderagent-ideal")


def _int_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        try:
            value = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be integers separated by commas, got {text!r}"
            ) from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be integers >= 1, got {value}")
        out.append(value)
    return out


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer ``>= minimum`` (also used by :mod:`shared.cli.main`)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be an integer >= {minimum}, got {value}")
        return value

    return parse


def positive_number(text: str) -> float:
    """An argparse type: a finite number ``> 0`` (also used by :mod:`shared.cli.main`)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


_positive_int = int_at_least(1)


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError("must name at least one policy")
    for p in names:
        if p not in SIM_POLICIES:
            raise argparse.ArgumentTypeError(
                f"unknown policy {p!r}; known: {', '.join(SIM_POLICIES)}"
            )
    return list(dict.fromkeys(names))


def _host_kv(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _delay(text: str) -> tuple[float, float]:
    lo_s, sep, hi_s = text.partition("-")
    try:
        lo, hi = float(lo_s), float(hi_s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be LO-HI seconds, e.g. 1-5, got {text!r}") from None
    if not sep or not 0 <= lo <= hi or hi == float("inf"):
        raise argparse.ArgumentTypeError(f"must be LO-HI with 0 <= LO <= HI, got {text!r}")
    return lo, hi


def _profile(text: str) -> str:
    if text not in PROFILES:
        raise argparse.ArgumentTypeError(f"unknown profile {text!r}; known: {', '.join(PROFILES)}")
    return text


def add_sim_parser(sub: argparse._SubParsersAction[Any]) -> None:
    """Register ``tao sim`` on the ``tao`` subcommand parser."""
    p = sub.add_parser(
        "sim",
        help="simulate policies on agent workloads and compare them",
        description="Trace-driven cluster simulation running the real policies (virtual time).",
    )
    p.add_argument(
        "--workload",
        metavar="NAME|FILE",
        help=f"built-in ({', '.join(BUILTIN)}) or a TOML workload file (default swe-lite)",
    )
    p.add_argument("--trace", metavar="FILE", help="replay a session-trace JSONL file instead")
    p.add_argument("--nodes", type=_positive_int, default=2, metavar="N", help="nodes (default 2)")
    p.add_argument(
        "--domains",
        type=_positive_int,
        default=1,
        metavar="D",
        help="split the nodes into D scheduling domains, each with its own planner, and place "
        "each new session in the least-loaded one (TAO-family policies; routers and "
        "ThunderAgent stay domain-less; default 1)",
    )
    p.add_argument(
        "--profile", type=_profile, default=DEFAULT_PROFILE, metavar="NAME",
        help=f"engine profile: {', '.join(PROFILES)} (default {DEFAULT_PROFILE})",
    )  # fmt: skip
    p.add_argument(
        "--workers", type=_int_list, metavar="N[,N...]",
        help="closed-loop workers, one run per value (default 64; a trace with arrival times "
        "replays open-loop without it)",
    )  # fmt: skip
    p.add_argument(
        "--arrival-rate", type=positive_number, metavar="PER_S",
        help="open loop: Poisson task arrivals per second instead of workers",
    )  # fmt: skip
    p.add_argument(
        "--tasks", type=_positive_int, metavar="N", help="tasks per run (default 300; trace: all)"
    )
    p.add_argument(
        "--policies", type=_policies, metavar="a,b,...",
        help=f"policies (default {','.join(DEFAULT_POLICIES)}; with --capacity "
        f"{','.join(CAPACITY_POLICIES)}); any of: {', '.join(SIM_POLICIES)}",
    )  # fmt: skip
    p.add_argument("--seeds", type=_positive_int, default=1, metavar="N", help="seeds 0..N-1")
    p.add_argument(
        "--extra-tool-delay", type=_delay, metavar="LO-HI",
        help="add one per-session delay drawn from U(LO, HI) s to every tool call",
    )  # fmt: skip
    p.add_argument(
        "--fold-tools", action="store_true",
        help="report long and short calls under one tool name (claude-code's Bash:test as "
        "Bash, swe-agent's shell programs as bash): the same calls, unlabelled",
    )  # fmt: skip
    p.add_argument(
        "--snapshots", type=int, default=0, metavar="K",
        help="capture up to K contended snapshots from the first tao run and compare DP with "
        "short-first on them (written with --out)",
    )  # fmt: skip
    p.add_argument(
        "--host-kv", type=_host_kv, default=0.0, metavar="F",
        help="give every node a host KV tier of F x its GPU KV (vLLM's OffloadingConnector: "
        "write-through stores, LRU, async loads over the profile's host link; default 0, none)",
    )  # fmt: skip
    p.add_argument("--budget", type=_positive_int, default=DEFAULT_BUDGET, metavar="STATES",
                   help=f"DP state budget per solve (default {DEFAULT_BUDGET})")  # fmt: skip
    p.add_argument("--out", metavar="DIR", help="write report.md, CSVs and PNG plots here")
    p.add_argument(
        "--record", metavar="FILE",
        help="write every applied round's record (each admit, release, hold and wait with its "
        "rule and price, one JSON line per round, tagged with policy, seed and workers) to FILE, "
        "for `tao explain`",
    )  # fmt: skip
    p.add_argument(
        "--json", action="store_true",
        help="print {runs: [...], paired: [...]} as JSON (paired: each tao-family policy vs "
        "each baseline per metric, mean %% difference over seeds with its 95%% t interval)",
    )  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_capacity_arguments(p, _positive_int, _host_kv)
    p.add_argument(
        "--ta-decay-half-life", type=positive_number, metavar="S",
        help="thunderagent-decay's half-life, s (default the code's 1 s)",
    )  # fmt: skip
    p.add_argument(
        "--write-trace", metavar="FILE",
        help="write the generated tasks (seed 0, --tasks of --workload) as session-trace JSONL "
        "and run nothing: `tao demo --trace FILE` runs on real engines what `tao sim --trace "
        "FILE` simulates",
    )  # fmt: skip
    p.add_argument(
        "--describe-workload", action="store_true",
        help="print the workload's tool-time and token fit (--tasks tasks, seed 0) beside the "
        "published figures it cites, and run nothing",
    )  # fmt: skip
    p.set_defaults(run=cmd_sim)


class _Progress:
    """Progress on stderr: a bar on a terminal, one line per finished run otherwise."""

    def __init__(self, total_runs: int, stream: TextIO, quiet: bool) -> None:
        self.total = total_runs
        self.stream = stream
        self.quiet = quiet
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.done_runs = 0

    def __call__(self, label: str, done: int, total: int) -> None:
        if self.quiet:
            return
        if self.tty:
            width = 30
            fill = int(width * done / max(total, 1))
            bar = "#" * fill + "-" * (width - fill)
            self.stream.write(
                f"\r[{self.done_runs + 1}/{self.total}] {label[:40]:<40} [{bar}] {done}/{total}"
            )
            if done == total:
                self.stream.write("\n")
        elif done == total:
            self.stream.write(f"[{self.done_runs + 1}/{self.total}] {label}: done\n")
        if done == total:
            self.done_runs += 1
        self.stream.flush()


def _tasks_maker(args: argparse.Namespace) -> tuple[Callable[[int], list[Task]], str, bool]:
    """(seed → tasks, description, tasks carry arrival times)."""
    if args.trace is not None:
        from shared.sim.trace import load_trace

        trace = load_trace(args.trace)
        if args.tasks is not None:
            trace = trace[: args.tasks]
        timed = all(t.arrival is not None for t in trace)
        return (lambda seed: list(trace)), f"trace {args.trace} ({len(trace)} sessions)", timed
    spec = load_workload(args.workload or "swe-lite")
    n = args.tasks if args.tasks is not None else 300
    delay = args.extra_tool_delay
    rate = args.arrival_rate

    def make(seed: int) -> list[Task]:
        return generate_tasks(
            spec, n, seed, extra_tool_delay=delay, arrival_rate=rate, fold_tools=args.fold_tools
        )

    folded = ", tool names folded" if args.fold_tools else ""
    return make, f"workload {spec.name} ({n} tasks{folded})", rate is not None


def cmd_sim(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``tao sim``; returns the exit code."""
    if args.trace is not None and args.workload is not None:
        raise ProblemError("--trace", "cannot be combined with --workload")
    if args.trace is not None and args.fold_tools:
        raise ProblemError("--fold-tools", "applies to generated workloads, not --trace")
    if args.trace is not None and args.extra_tool_delay is not None:
        raise ProblemError("--extra-tool-delay", "applies to generated workloads, not --trace")
    if args.arrival_rate is not None and args.workers is not None:
        raise ProblemError("--arrival-rate", "cannot be combined with --workers")
    if args.snapshots < 0:
        raise ProblemError("--snapshots", f"must be >= 0, got {args.snapshots}")
    make, desc, timed = _tasks_maker(args)
    if args.write_trace is not None:
        return _write_trace(args.write_trace, make(0), out)
    if args.describe_workload:
        family = args.workload or ("trace" if args.trace is not None else "swe-lite")
        out.write(describe(family, make(0)) + "\n")
        return 0
    workers: list[int | None]
    if args.workers is not None:
        workers = list(args.workers)
    elif timed:
        workers = [None]
    elif args.trace is not None:
        raise ProblemError("--workers", "the trace has no arrival times: give --workers N")
    else:
        workers = [64]
    if args.out is not None:
        try:
            os.makedirs(args.out, exist_ok=True)
        except OSError as exc:
            raise ProblemError("--out", f"cannot create {args.out!r}: {exc.strerror}") from None
    if args.domains > args.nodes:
        raise ProblemError("--domains", f"at most --nodes ({args.nodes}), got {args.domains}")
    record = _record_file(args.record)
    config = SimConfig(
        nodes=args.nodes,
        profile=args.profile,
        budget=args.budget,
        domains=args.domains,
        host_kv=args.host_kv,
        ta_decay_half_life_s=args.ta_decay_half_life,
        record_rounds=record is not None,
    )
    if args.capacity:
        from shared.cli.capacity import run_capacity

        return run_capacity(args, make, desc, config, timed, out)
    args.policies = args.policies or list(DEFAULT_POLICIES)
    seeds = list(range(args.seeds))
    progress = _Progress(len(seeds) * len(workers) * len(args.policies), sys.stderr, args.quiet)
    runs = run_grid(make, config, args.policies, seeds, workers, progress)
    if record is not None:
        with record:
            for r in runs:
                for rnd in [] if r.result is None else r.result.rounds:
                    tag = {"policy": r.policy, "seed": r.seed, "workers": r.workers}
                    record.write(orjson.dumps({**tag, **rnd}).decode() + "\n")
    study = None
    if args.snapshots > 0:
        study = _snapshot_study(make, config, workers, args.snapshots)
    if args.json:
        from shared.sim.report import paired_comparisons

        doc: dict[str, object] = {
            "runs": [_run_doc(r) for r in runs],
            "paired": [row.doc() for row in paired_comparisons(runs)],
        }
        if study is not None:
            doc["snapshots"] = {"compared": len(study.comparisons), "improved": study.improved,
                                "equal": study.equal, "worse": study.worse}  # fmt: skip
        out.write(orjson.dumps(doc).decode() + "\n")
    else:
        from shared.sim.report import comparison_table, study_text

        where = f"{args.nodes} x {args.profile}"
        if args.domains > 1:
            where += f" in {args.domains} domains"
        text = f"{desc}, {where}\n{comparison_table(runs)}"
        if study is not None:
            text += "\n\n" + study_text(study)
        out.write(text + "\n")
    out.flush()
    if args.out is not None:
        _write_outputs(args, runs, desc, study)
    return 0


def _write_trace(path: str, tasks: Sequence[Task], out: TextIO) -> int:
    from shared.sim.trace import trace_line

    try:
        with open(path, "w", encoding="utf-8") as f:
            for task in tasks:
                f.write(orjson.dumps(trace_line(task)).decode() + "\n")
    except OSError as exc:
        raise ProblemError("--write-trace", f"cannot write {path!r}: {exc.strerror}") from None
    out.write(f"tao sim: wrote {len(tasks)} sessions to {path}\n")
    return 0


def _record_file(path: str | None) -> TextIO | None:
    """``--record``'s file, opened for writing (a usage error naming it when it cannot be)."""
    if path is None:
        return None
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise ProblemError("--record", f"cannot write {path!r}: {exc.strerror}") from None


def _snapshot_study(
    make: Callable[[int], list[Task]], config: SimConfig, workers: list[int | None], k: int
) -> SnapshotStudy:
    w = max((x for x in workers if x is not None), default=None)
    res = simulate(make(0), replace(config, workers=w, capture_snapshots=k), "tao", 0)
    return compare_snapshots(res.snapshots, config.budget)


def _run_doc(r: Run) -> dict[str, object]:
    return {"policy": r.policy, "seed": r.seed, "workers": r.workers, "nodes": r.nodes,
            "metrics": r.metrics}  # fmt: skip


def _write_outputs(
    args: argparse.Namespace, runs: list[Run], desc: str, st: SnapshotStudy | None
) -> None:
    from shared.sim.plots import plot_all, plot_placement
    from shared.sim.report import write_csvs, write_report

    images = plot_all(runs, args.out)
    if st is not None:
        best = st.best()
        if best is not None:
            images.append(plot_placement(best, os.path.join(args.out, "placement.png")))
    write_csvs(runs, args.out, st)
    command = "tao sim " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "tao sim"
    write_report(runs, args.out, title=f"tao sim: {desc}", command=command, study=st,
                 images=images)  # fmt: skip
