"""Reference solver: the discretised tick problem (DESIGN 3.2) solved exactly with HiGHS.

A MIP over binary ``x[i, b]`` for eligible pairs, with ``Σ_b x[i, b] <= 1`` per candidate and
``Σ_i w[i] x[i, b] <= cap[b]`` per node (``w`` and ``cap`` already in quanta). The lexicographic
objective ``(Σk, Σr, Σt, count)`` is solved stage by stage, never as a weighted sum:

1. maximise Σk;  2. add ``Σk >= K*``, maximise Σr;  3. add ``Σr >= R*``, maximise Σt;
4. add ``Σt >= T*``, maximise the count.

HiGHS works in floating point with tolerances, so after every stage the solution is rounded
to 0/1, checked for feasibility and its value recomputed in Python ints; that exact value (an
integer) is what the next stage fixes; it must also equal the value HiGHS reports, and no
earlier stage may fall below its fixed level, else the result is flagged not optimal. Gaps:
``mip_rel_gap = 0`` and ``mip_abs_gap = 0.5``: every objective has integer coefficients, so
an absolute gap below 1 proves optimality; ``mip_feasibility_tolerance = 1e-9``.

Stages are *not* warm-started: with highspy 1.16, ``setSolution`` before ``run`` sometimes
made ``getSolution`` return the warm-start point while the status and objective reported the
better optimum (seen on a 3-node × 7-candidate instance; the brute-force oracle caught it).

A stage whose coefficients are all zero is skipped (its optimum is 0). ``time_limit`` is the
total over stages; when it runs out, the best feasible solution found so far is returned with
``optimal=False``.

Used by the tests (as an oracle beside ``shared.core.brute``) and by the benchmarks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import highspy
import numpy as np
import numpy.typing as npt

from shared.core.problem import Dense, Objective, is_feasible, objective_of

STAGES = ("credit", "ready", "tokens", "admitted")
_banner_shown = False


class HighsResult(NamedTuple):
    choice: tuple[int, ...]
    objective: Objective
    elapsed_s: float
    statuses: tuple[str, ...]
    optimal: bool


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Hide the licence banner HiGHS prints (at C level) on the first ``Highs()``."""
    global _banner_shown
    if _banner_shown:
        yield
        return
    _banner_shown = True
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def _new_highs() -> highspy.Highs:
    make: Callable[[], highspy.Highs] = highspy.Highs  # the class is untyped in highspy
    with _quiet_stdout():
        h = make()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 0.0)
    h.setOptionValue("mip_abs_gap", 0.5)
    h.setOptionValue("mip_feasibility_tolerance", 1e-9)
    h.setOptionValue("threads", 1)
    return h


def _stage_coefficients(
    d: Dense, pi: npt.NDArray[np.int64], pb: npt.NDArray[np.int64]
) -> list[npt.NDArray[np.int64]]:
    return [
        d.k[pi, pb].astype(np.int64),
        d.r[pi].astype(np.int64),
        d.t[pi].astype(np.int64),
        np.ones(pi.shape[0], dtype=np.int64),
    ]


def _choice_from(
    values: Sequence[float], pi: npt.NDArray[np.int64], pb: npt.NDArray[np.int64], n: int
) -> tuple[int, ...]:
    choice = [-1] * n
    for j, v in enumerate(values):
        if v > 0.5:
            choice[int(pi[j])] = int(pb[j])
    return tuple(choice)


def solve(d: Dense, time_limit: float = 60.0) -> HighsResult:
    """Solve ``d`` exactly and lexicographically; see the module docstring."""
    start = time.perf_counter()
    n, m = d.n, d.m
    pi, pb = np.nonzero(d.elig)
    pi = pi.astype(np.int64)
    pb = pb.astype(np.int64)
    npairs = int(pi.shape[0])
    empty = tuple([-1] * n)
    if npairs == 0:
        return HighsResult(
            empty, objective_of(d, empty), time.perf_counter() - start, ("empty",) * 4, True
        )

    # Column-wise matrix: column j = pair (pi[j], pb[j]) has a 1 in row pi[j] (assignment)
    # and w[pi[j]] in row n + pb[j] (capacity).
    lp = highspy.HighsLp()
    lp.num_col_ = npairs
    lp.num_row_ = n + m
    lp.col_cost_ = np.zeros(npairs, dtype=np.float64)
    lp.col_lower_ = np.zeros(npairs, dtype=np.float64)
    lp.col_upper_ = np.ones(npairs, dtype=np.float64)
    inf = highspy.kHighsInf
    lp.row_lower_ = np.full(n + m, -inf, dtype=np.float64)
    lp.row_upper_ = np.concatenate([np.ones(n), d.cap.astype(np.float64)])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_ = npairs
    lp.a_matrix_.num_row_ = n + m
    lp.a_matrix_.start_ = np.arange(0, 2 * npairs + 1, 2, dtype=np.int32)
    index = np.empty(2 * npairs, dtype=np.int32)
    index[0::2] = pi
    index[1::2] = n + pb
    value = np.empty(2 * npairs, dtype=np.float64)
    value[0::2] = 1.0
    value[1::2] = d.w[pi].astype(np.float64)
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.sense_ = highspy.ObjSense.kMaximize
    lp.integrality_ = [highspy.HighsVarType.kInteger] * npairs

    h = _new_highs()
    h.passModel(lp)
    cols = np.arange(npairs, dtype=np.int32)
    coefs = _stage_coefficients(d, pi, pb)

    best = empty
    best_obj = objective_of(d, empty)
    statuses: list[str] = []
    optimal = True
    fixed = [0] * len(STAGES)  # exact level each solved stage is held at
    for stage, c in enumerate(coefs):
        if not c.any():
            statuses.append("skipped")  # optimum is 0 and adds no constraint
            continue
        remaining = time_limit - (time.perf_counter() - start)
        if remaining <= 0:
            statuses.append("not-run")
            optimal = False
            continue
        h.setOptionValue("time_limit", float(remaining))
        h.changeColsCost(npairs, cols, c.astype(np.float64))
        h.run()
        status = h.getModelStatus()
        statuses.append(h.modelStatusToString(status))
        sol = h.getSolution()
        if status != highspy.HighsModelStatus.kOptimal:
            optimal = False
        if not sol.value_valid:
            break
        values = list(sol.col_value)
        choice = _choice_from(values, pi, pb, n)
        if not is_feasible(d, choice):
            raise RuntimeError(f"HiGHS stage {STAGES[stage]}: rounded solution is infeasible")
        obj = objective_of(d, choice)
        if any(obj[j] < fixed[j] for j in range(stage)):
            # Tolerances let HiGHS undercut an earlier stage's level after rounding.
            statuses[-1] = "tolerance"
            optimal = False
            break
        if status == highspy.HighsModelStatus.kOptimal and obj[stage] != round(
            h.getInfo().objective_function_value
        ):
            statuses[-1] = "inconsistent"  # the returned point is not the one it reports
            optimal = False
        if obj > best_obj:
            best, best_obj = choice, obj
        if not optimal:
            break
        # Fix this stage at its exact integer optimum for the next ones.
        level = obj[stage]
        fixed[stage] = level
        nz = np.nonzero(c)[0].astype(np.int32)
        h.addRow(float(level), inf, int(nz.shape[0]), nz, c[nz].astype(np.float64))
    statuses.extend(["not-run"] * (len(STAGES) - len(statuses)))
    return HighsResult(best, best_obj, time.perf_counter() - start, tuple(statuses), optimal)
