"""Planner cold start: a fresh planner process until its kernels are ready, without and with
the warm step (``tao warm``), side by side in one run.

A script, not a test: it prints a markdown table to stdout (progress goes to stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.planner_cold_start            # 2 cold, 5 warm
    PYTHONPATH=. .venv/bin/python -m benchmarks.planner_cold_start --cold 3 --warm 10

Each run is a new Python process that imports the planner service (``services.planner.app``:
numpy, numba and the core, as the service does) and runs :func:`shared.core.planner.warm_up`,
the step the service logs as ``planner_warm`` before it can plan (and before the gateway's
``/readyz`` can turn 200). Measured inside the process with ``time.perf_counter``: ``import``
(the service's imports) and ``warm_up`` (loading or compiling the kernels); ``process`` is the
wall time around the whole process, interpreter start-up included. Cases, each on its own
``NUMBA_CACHE_DIR`` in a temporary folder:

* ``no cache (before)``: an empty cache for every run, what a new container or checkout paid
  at its first planner start before the warm step (numba compiles every kernel);
* ``after tao warm``: the cache ``tao warm`` filled once (timed as its own row), then each run
  loads the kernels from it, as the planner does in an image built with the warm step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import json, time
t0 = time.perf_counter()
import services.planner.app
from shared.core.planner import warm_up
t1 = time.perf_counter()
warm_up()
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "warm_up": t2 - t1}))
"""


def _run(args: list[str], cache: Path) -> tuple[float, str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("NUMBA_DISABLE_JIT", None)
    t0 = time.perf_counter()
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, done.stdout


def probe(cache: Path) -> dict[str, float]:
    wall, out = _run([sys.executable, "-c", PROBE], cache)
    times: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    times["process"] = wall
    return times


def _cell(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", type=int, default=2, help="runs on an empty cache")
    parser.add_argument("--warm", type=int, default=5, help="runs after tao warm")
    args = parser.parse_args()
    rows: list[tuple[str, int, list[float], list[float], list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="tao-cold-") as tmp:
        cold: list[dict[str, float]] = []
        for i in range(args.cold):
            print(f"no cache: run {i + 1}/{args.cold}", file=sys.stderr)
            cold.append(probe(Path(tmp) / f"empty-{i}"))
        rows.append(
            ("no cache (before)", args.cold, *(
                [c[k] for c in cold] for k in ("import", "warm_up", "process")
            ))
        )  # fmt: skip
        cache = Path(tmp) / "warmed"
        print("tao warm", file=sys.stderr)
        warm_wall, _ = _run([sys.executable, "-m", "shared.cli.warm"], cache)
        warm: list[dict[str, float]] = []
        for i in range(args.warm):
            print(f"after tao warm: run {i + 1}/{args.warm}", file=sys.stderr)
            warm.append(probe(cache))
        rows.append(
            ("after tao warm", args.warm, *(
                [w[k] for w in warm] for k in ("import", "warm_up", "process")
            ))
        )  # fmt: skip
    print(f"Planner cold start, seconds: median (min–max); {os.cpu_count()} CPUs\n")
    print("| case | runs | import | warm_up (planner_warm) | process |")
    print("|---|---:|---:|---:|---:|")
    for name, n, imp, wu, proc in rows:
        print(f"| {name} | {n} | {_cell(imp)} | {_cell(wu)} | {_cell(proc)} |")
    print(f"| `tao warm` itself (once, empty cache: planner and block-pool kernels) | 1 | | | "
          f"{warm_wall:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
