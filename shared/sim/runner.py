"""Run policies on workloads: one run, or a grid of (policy × seed × workers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from shared.core.planner import warm_up
from shared.core.policies import POLICY_NAMES
from shared.sim.cluster import DP_POLICIES, DomainScheduler, PooledScheduler, scheduler
from shared.sim.des import SimConfig, Simulator
from shared.sim.lowerbound import lower_bound_metrics
from shared.sim.metrics import compute_metrics
from shared.sim.records import SimResult
from shared.sim.workloads import Task

__all__ = ["LOWER_BOUND", "ORACLE", "SIM_POLICIES", "Run", "run_grid", "simulate"]

ORACLE = "oracle"
LOWER_BOUND = "lower-bound"
SIM_POLICIES: tuple[str, ...] = (*POLICY_NAMES, ORACLE, LOWER_BOUND)
"""Every name ``tao sim --policies`` accepts."""


@dataclass(slots=True)
class Run:
    """One (policy, seed, workers) cell: its metrics, and the raw records (None for the bound)."""

    policy: str
    seed: int
    workers: int | None
    nodes: int
    metrics: dict[str, float | int | None]
    result: SimResult | None = None


def simulate(
    tasks: Sequence[Task],
    config: SimConfig,
    policy: str,
    seed: int,
    progress: Callable[[int, int], None] | None = None,
) -> SimResult:
    """Run one policy (``oracle`` included; not ``lower-bound``) on ``tasks``."""
    if policy not in SIM_POLICIES or policy == LOWER_BOUND:
        raise ValueError(f"policy: cannot simulate {policy!r}")
    warm_up()  # load the numba kernels once, so the first round's solve time is not charged
    cls = scheduler(policy)

    def make(s: Simulator) -> object:
        if config.domains > 1 and cls is PooledScheduler:
            return DomainScheduler(s, policy, config.domains)
        return cls(s, policy)

    sim = Simulator(
        tasks,
        config,
        make,
        policy=policy,
        seed=seed,
        oracle=policy == ORACLE,
    )
    return sim.run(progress)


def run_grid(
    make_tasks: Callable[[int], list[Task]],
    config: SimConfig,
    policies: Sequence[str],
    seeds: Sequence[int],
    workers: Sequence[int | None],
    progress: Callable[[str, int, int], None] | None = None,
) -> list[Run]:
    """Every (workers, seed, policy) cell, tasks generated once per seed (common random
    numbers: every policy sees the same tasks)."""
    runs: list[Run] = []
    for seed in seeds:
        tasks = make_tasks(seed)
        for w in workers:
            cfg = replace(config, workers=w)
            for pol in policies:
                label = f"{pol} seed={seed} workers={w if w is not None else 'open'}"
                if pol == LOWER_BOUND:
                    metrics = lower_bound_metrics(tasks, cfg)
                    runs.append(Run(pol, seed, w, cfg.nodes, metrics))
                    if progress is not None:
                        progress(label, len(tasks), len(tasks))
                    continue

                def step(done: int, total: int, label: str = label) -> None:
                    if progress is not None:
                        progress(label, done, total)

                res = simulate(tasks, cfg, pol, seed, step if progress else None)
                metrics = compute_metrics(res, pol in DP_POLICIES)
                runs.append(Run(pol, seed, w, cfg.nodes, metrics, res))
    return runs
