"""Run one policy on a snapshot and shape its result as the ``tao plan`` output.

The clock lives here, in the shell: ``--time-limit-ms`` becomes a deadline on
``time.perf_counter()`` and the core only receives the ``expired`` callback (DESIGN 3.2; the
core owns no clock). ``elapsed_ms`` is measured around ``policy.plan`` alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.core.planner import warm_up
from shared.core.policies import PlanOptions, get_policy
from shared.core.problem import PlanResult, Problem


@dataclass(frozen=True, slots=True)
class TimedResult:
    """A policy's result with the wall time ``policy.plan`` took, in milliseconds."""

    policy: str
    result: PlanResult
    elapsed_ms: float


def deadline_after(ms: float, clock: Callable[[], float] = time.perf_counter) -> Callable[[], bool]:
    """A callback that turns true once ``ms`` milliseconds have passed on ``clock`` from now."""
    deadline = clock() + ms / 1000.0

    def expired() -> bool:
        return clock() >= deadline

    return expired


def run_policy(
    problem: Problem, name: str, *, budget: int, time_limit_ms: float | None = None
) -> TimedResult:
    """Plan ``problem`` with the policy called ``name`` (raises ``UnknownPolicyError``)."""
    policy = get_policy(name)
    if name.startswith("tao"):
        warm_up()  # kernel loading is start-up cost, not solve time
    expired = deadline_after(time_limit_ms) if time_limit_ms is not None else None
    options = PlanOptions(budget=budget, expired=expired)
    start = time.perf_counter()
    result = policy.plan(problem, options)
    elapsed_ms = (time.perf_counter() - start) * 1000.0
    return TimedResult(policy=name, result=result, elapsed_ms=round(elapsed_ms, 3))


def plan_document(timed: TimedResult) -> dict[str, object]:
    """The ``tao plan`` output object; its key order is part of the format.

    Values are coerced to plain Python types, so a policy returning numpy scalars still encodes.
    """
    res = timed.result
    obj = res.objective
    return {
        "assignments": [{"session": a.session, "node": a.node} for a in res.assignments],
        "objective": {
            "credit": int(obj.credit),
            "ready": int(obj.ready),
            "tokens": int(obj.tokens),
            "admitted": int(obj.admitted),
        },
        "exact": bool(res.exact),
        "method": str(res.method),
        "states": int(res.states),
        "elapsed_ms": timed.elapsed_ms,
        "reason": None if res.reason is None else str(res.reason),
        "policy": timed.policy,
    }
