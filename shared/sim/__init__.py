"""Trace-driven cluster simulator running the real core (docs/evaluation.md)."""

from __future__ import annotations

from shared.sim.des import SimConfig, Simulator
from shared.sim.dists import WorkloadError
from shared.sim.lowerbound import lower_bound_metrics
from shared.sim.metrics import METRICS, compute_metrics
from shared.sim.records import SimResult
from shared.sim.runner import LOWER_BOUND, ORACLE, SIM_POLICIES, Run, run_grid, simulate
from shared.sim.trace import load_trace
from shared.sim.workloads import BUILTIN, Task, Turn, generate_tasks, load_workload

__all__ = [
    "BUILTIN",
    "LOWER_BOUND",
    "METRICS",
    "ORACLE",
    "SIM_POLICIES",
    "Run",
    "SimConfig",
    "SimResult",
    "Simulator",
    "Task",
    "Turn",
    "WorkloadError",
    "compute_metrics",
    "generate_tasks",
    "load_trace",
    "load_workload",
    "lower_bound_metrics",
    "run_grid",
    "simulate",
]
