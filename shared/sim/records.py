"""What one simulation run records: per request, per task, samples over time, per tick."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.core.problem import Problem


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One model request.

    ``issued`` is when the agent sent it (the previous tool ended, or the task started);
    ``submitted`` when it reached an engine (after any hold in the pool); ``tool_end`` is the
    end of the tool call that preceded it (None for a task's first request). ``release`` says
    whether the scheduler released the session's admission since its previous request finished
    (during the tool call between them): None if not, else the cause of the last release —
    ``"payback"`` (TAO, on a node whose reservations exceeded its capacity in the round's
    snapshot), ``"demand"`` (TAO, any other interrupt), ``"pause"`` (ThunderAgent).
    """

    session: str
    turn: int
    node: str
    issued: float
    submitted: float
    first_token: float
    finished: float
    prompt: int
    cached: int
    completion: int
    tool_end: float | None
    release: str | None = None


@dataclass(frozen=True, slots=True)
class TaskRecord:
    session: str
    family: str
    start: float
    end: float
    turns: int
    tool_time: float


@dataclass(frozen=True, slots=True)
class Sample:
    """State at one instant: engine-running and engine-waiting requests (all nodes), sessions
    held in the pool with a pending request, and sessions admitted."""

    t: float
    running: int
    waiting: int
    held: int
    admitted: int


@dataclass(frozen=True, slots=True)
class TickRecord:
    """One scheduling round of a pooled policy.

    ``demand`` Σ pool weights, ``free`` Σ free tokens before interrupts, ``capacity`` Σ usable
    capacity; ``exact``/``method`` from the plan; ``solve_s`` wall time of decide().
    """

    t: float
    pool: int
    demand: int
    free: int
    capacity: int
    exact: bool
    method: str
    solve_s: float
    interrupts: int
    admits: int
    truncated: bool


@dataclass(slots=True)
class SimResult:
    """Everything a run produced; :mod:`shared.sim.metrics` turns it into numbers.

    ``preemptions``: Σ ``Engine.num_preemptions`` over the nodes, set at the end of the run."""

    policy: str
    seed: int
    workers: int | None
    nodes: int
    profile: str
    requests: list[RequestRecord] = field(default_factory=list)
    tasks: list[TaskRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    ticks: list[TickRecord] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    snapshots: list[tuple[float, Problem]] = field(default_factory=list)
    rounds: list[dict[str, object]] = field(default_factory=list)
    """Each applied round's record as plain values (``SimConfig.record_rounds``)."""
    wall_s: float = 0.0
    end_time: float = 0.0
    preemptions: int = 0
