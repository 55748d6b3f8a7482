"""Synthetic agent workloads: built-in families, the TOML workload format, task generation.

A *task* is one agent session: a shared system-prompt prefix, then turns. Turn ``j`` appends
``added`` prompt tokens (the task text for turn 0, the previous tool's observation after),
asks the model for ``output`` tokens, and — unless it is the last turn — calls ``tool`` for
``duration`` seconds. The next turn's prompt is the previous prompt + its output + the new
observation, so a turn re-reads everything before it (prefix caching pays off).

Built-in families (every number cites where it comes from; "assumption" marks those that are
ours, stated so a reader can change them with a workload file):

``swe-lite`` — mini-swe-agent on SWE-bench Lite (https://www.swebench.com/lite.html, 300
  tasks; https://github.com/SWE-agent/mini-swe-agent: one bash command per step).
  * turns: ~30 per task (issue 5 measurements); the TAO paper (arXiv 2610.37230, Appendix G)
    reports 6,995 model requests and 6,942 tool records for its SWE-Lite replay, ≈ 23 per
    task over 300 tasks. We draw log-normal median 26, p90 45, clipped to [5, 100].
  * context: ~5k tokens at the first request, growing to 20–40k (issue 5); the mini-swe-agent
    trajectory fixture's first request has 5,120 prompt tokens. Shared prefix 1,500 tokens
    (assumption: mini-swe-agent's system + instance templates), task text 3,000–4,000.
    Observation tokens per tool call: log-normal median 450, p90 1,500, max 8,000
    (assumption, chosen so ~26 turns grow 5k to 20–40k).
  * output: 50–300 tokens per turn (issue 5), uniform.
  * tools: log-normal median 0.4 s, p90 0.7 s, plus a few-percent tail: 3 % at 5 s and
    1 % uniform 60–600 s (issue 5; paper Figure 6: MAE 0.410 s, 82.9 % of predictions within
    0.5 s, consistent with short calls). The tool name is the command's program (assumption:
    the execute() wrapper reports it; mini-swe-agent itself calls everything ``bash``).
``terminal-bench`` — Claude Code on Terminal-Bench 2.0 (https://www.tbench.ai, 89 tasks).
  Claude Code's Bash tool has a 120 s default timeout (``BASH_DEFAULT_TIMEOUT_MS``,
  https://docs.anthropic.com/en/docs/claude-code/settings) and ``run_in_background``; Read,
  Edit, Grep, Glob are local and fast. Assumptions: 15k-token shared prefix (system prompt and
  tool schemas), turns median 40 / p90 90, longer Bash calls (median 1.5 s, p90 12 s), 8 % of
  Bash calls sent to the background.
``mixed`` — both, in the paper's Table 3 proportion: 300 SWE-Lite + 89 Terminal-Bench tasks.
``automation`` — AutomationBench-like remote-API tools (paper Table 3, 800 tasks). Assumptions:
  12 turns median, small contexts (3k → ~10k), API latency log-normal median 1.0 s, p90 6 s
  ("high variance"), 2 % of calls 20–90 s.
``swe-agent`` — SWE-agent 1.1 on SWE-Bench Pro (github.com/nilenso/swe-bench-pro-cost-token-time-
  analysis: 616 tasks × 2 models). Measured there: median step ≈ 0.42 s, 2.4–3.7 % of steps
  over 10 s, 0.7–1.05 % over 60 s, the longest call per task p50 16–39 s; steps per task
  p10/p50/p90 28/59/113 and 52/78/105; mean context per call 35–42k tokens. Fit: turns log-normal
  median 66, p90 110 (between the two models), clipped to [10, 250]; tools 96.4 % quick
  editor/shell calls (log-normal median 0.4 s, p90 1.5 s), 3 % test runs (median 14 s, p90 45 s),
  0.6 % long runs uniform 60–600 s. Context: 6k first request, observations median 350 / p90
  1,400 tokens and outputs median 200 / p90 600 (assumptions, chosen so the mean context per
  call lands in 35–42k). Tool names are the command's program, so per-tool history can separate
  the quick calls from test runs (assumption, as for swe-lite).
``claude-code`` — interactive Claude Code / Codex with the heavy tail of TraceLab
  (github.com/uw-syfi/TraceLab, 357k steps of real Claude Code and Codex use): per call p50
  0.3 s, p90 13.6 s, p99 3.6 min, mean 18.4 s; 61 % < 1 s, 27 % 1–10 s, 8 % 10–60 s, 4 % > 60 s,
  and the calls over 60 s hold 85 % of all tool time; Claude's Bash p50 0.41 s, Read 36 ms, Edit
  95 ms; median append 875 tokens, median output 214. Fit: Read (median 36 ms), Edit (95 ms),
  Grep/Glob (0.15 s), Bash (median 0.9 s, p90 5 s, Claude Code's 120 s default timeout),
  ``Bash:test`` (test and build runs, median 15 s, p90 45 s, a 600 s timeout: the Bash tool's
  maximum) and ``Task`` (sub-agents and other long work, median 100 s, p90 800 s, ≤ 1 h). The
  ``Bash:<kind>`` names assume the hook reports a test or build command apart from other Bash
  calls. Turns, prefix and the tails of the token distributions are terminal-bench's
  assumptions. ``tao sim --describe-workload`` prints the fit's quantiles beside these.
``chat`` — no tools, one turn (assumption: prompt log-normal median 800, output median 250).

The TOML format (docs/evaluation.md) has exactly the keys of :data:`BUILTIN`'s tables.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from shared.sim.dists import Dist, WorkloadError, parse_dist

__all__ = [
    "BUILTIN",
    "FOLDED_NAMES",
    "Task",
    "ToolSpec",
    "Turn",
    "WorkloadSpec",
    "folded_name",
    "generate_tasks",
    "load_workload",
    "parse_workload",
]


@dataclass(frozen=True, slots=True)
class Turn:
    """One model request and the tool call that follows it (``tool`` None = last turn)."""

    added: int
    output: int
    tool: str | None = None
    duration: float = 0.0
    timeout: float | None = None
    background: bool = False


@dataclass(frozen=True, slots=True)
class Task:
    """One agent session. ``arrival`` is set for open-loop / trace replay, else None."""

    id: str
    family: str
    shared_prefix: int
    turns: tuple[Turn, ...]
    arrival: float | None = None

    @property
    def prompt_tokens(self) -> list[int]:
        """Prompt length of each turn."""
        out, ctx = [], self.shared_prefix
        for t in self.turns:
            ctx += t.added
            out.append(ctx)
            ctx += t.output
        return out


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    weight: float
    duration: Dist
    timeout: float | None = None
    background: float = 0.0


_CONST_1000 = Dist("constant", 1000.0)
_CONST_1 = Dist("constant", 1.0)
_CONST_100 = Dist("constant", 100.0)
_CONST_0 = Dist("constant", 0.0)


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A parsed workload family, or a mix of families (``mix`` non-empty)."""

    name: str
    shared_prefix: int = 0
    initial: Dist = _CONST_1000
    turns: Dist = _CONST_1
    output: Dist = _CONST_100
    observation: Dist = _CONST_0
    tools: tuple[ToolSpec, ...] = ()
    max_context: int = 120_000
    mix: tuple[tuple[WorkloadSpec, float], ...] = ()
    description: str = ""


_SHORT = {"dist": "lognormal", "median": 0.4, "p90": 0.7}
_QUICK = {"dist": "lognormal", "median": 0.4, "p90": 1.5, "max": 30}

BUILTIN: dict[str, dict[str, object]] = {
    "swe-lite": {
        "description": "mini-swe-agent on SWE-bench Lite",
        "shared_prefix_tokens": 1500,
        "initial_tokens": {"dist": "uniform", "lo": 3000, "hi": 4000},
        "turns": {"dist": "lognormal", "median": 26, "p90": 45, "min": 5, "max": 100},
        "output_tokens": {"dist": "uniform", "lo": 50, "hi": 300},
        "observation_tokens": {"dist": "lognormal", "median": 450, "p90": 1500, "max": 8000},
        "max_context": 60000,
        "tools": [
            {"name": "cat", "weight": 24.0, "duration": _SHORT},
            {"name": "grep", "weight": 19.0, "duration": _SHORT},
            {"name": "sed", "weight": 15.0, "duration": _SHORT},
            {"name": "ls", "weight": 10.0, "duration": _SHORT},
            {"name": "find", "weight": 5.0, "duration": _SHORT},
            {"name": "git", "weight": 5.0, "duration": _SHORT},
            {"name": "python", "weight": 18.0, "duration": _SHORT},
            {"name": "python", "weight": 2.0, "duration": {"dist": "constant", "value": 5.0}},
            {"name": "pytest", "weight": 1.0, "duration": {"dist": "constant", "value": 5.0}},
            {"name": "pytest", "weight": 1.0, "duration": {"dist": "uniform", "lo": 60, "hi": 600}},
        ],
    },
    "terminal-bench": {
        "description": "Claude Code on Terminal-Bench 2.0",
        "shared_prefix_tokens": 15000,
        "initial_tokens": {"dist": "uniform", "lo": 1000, "hi": 3000},
        "turns": {"dist": "lognormal", "median": 40, "p90": 90, "min": 5, "max": 200},
        "output_tokens": {"dist": "lognormal", "median": 150, "p90": 600, "min": 20, "max": 4000},
        "observation_tokens": {"dist": "lognormal", "median": 600, "p90": 3000, "max": 20000},
        "max_context": 120000,
        "tools": [
            {"name": "Read", "weight": 25.0, "duration": {"dist": "lognormal", "median": 0.05,
                                                           "p90": 0.2}},
            {"name": "Edit", "weight": 15.0, "duration": {"dist": "lognormal", "median": 0.05,
                                                           "p90": 0.2}},
            {"name": "Grep", "weight": 10.0, "duration": {"dist": "lognormal", "median": 0.2,
                                                           "p90": 0.8}},
            {"name": "Bash", "weight": 50.0, "timeout_s": 120.0, "background_prob": 0.08,
             "duration": {"dist": "lognormal", "median": 1.5, "p90": 12.0, "max": 900}},
        ],
    },
    "automation": {
        "description": "remote-API automation agent (AutomationBench-like)",
        "shared_prefix_tokens": 2000,
        "initial_tokens": {"dist": "uniform", "lo": 500, "hi": 1500},
        "turns": {"dist": "lognormal", "median": 12, "p90": 25, "min": 2, "max": 60},
        "output_tokens": {"dist": "uniform", "lo": 40, "hi": 400},
        "observation_tokens": {"dist": "lognormal", "median": 300, "p90": 1500, "max": 6000},
        "max_context": 60000,
        "tools": [
            {"name": "http", "weight": 98.0, "duration": {"dist": "lognormal", "median": 1.0,
                                                          "p90": 6.0, "max": 60}},
            {"name": "http", "weight": 2.0, "duration": {"dist": "uniform", "lo": 20, "hi": 90}},
        ],
    },
    "swe-agent": {
        "description": "SWE-agent 1.1 on SWE-Bench Pro (measured tool times)",
        "shared_prefix_tokens": 2000,
        "initial_tokens": {"dist": "uniform", "lo": 3000, "hi": 5000},
        "turns": {"dist": "lognormal", "median": 66, "p90": 110, "min": 10, "max": 250},
        "output_tokens": {"dist": "lognormal", "median": 200, "p90": 600, "min": 20, "max": 4000},
        "observation_tokens": {"dist": "lognormal", "median": 350, "p90": 1400, "max": 16000},
        "max_context": 128000,
        "tools": [
            {"name": "view", "weight": 30.0, "duration": _QUICK},
            {"name": "edit", "weight": 20.0, "duration": _QUICK},
            {"name": "grep", "weight": 15.0, "duration": _QUICK},
            {"name": "find", "weight": 8.0, "duration": _QUICK},
            {"name": "ls", "weight": 8.0, "duration": _QUICK},
            {"name": "git", "weight": 5.0, "duration": _QUICK},
            {"name": "python", "weight": 10.4, "duration": _QUICK},
            {"name": "pytest", "weight": 3.0, "duration": {"dist": "lognormal", "median": 14,
                                                            "p90": 45, "max": 600}},
            {"name": "pytest", "weight": 0.4, "duration": {"dist": "uniform", "lo": 60, "hi": 600}},
            {"name": "make", "weight": 0.2, "duration": {"dist": "uniform", "lo": 60, "hi": 600}},
        ],
    },
    "claude-code": {
        "description": "interactive Claude Code / Codex (TraceLab tool times)",
        "shared_prefix_tokens": 15000,
        "initial_tokens": {"dist": "uniform", "lo": 1000, "hi": 3000},
        "turns": {"dist": "lognormal", "median": 40, "p90": 90, "min": 5, "max": 200},
        "output_tokens": {"dist": "lognormal", "median": 214, "p90": 800, "min": 20, "max": 4000},
        "observation_tokens": {"dist": "lognormal", "median": 875, "p90": 4000, "max": 20000},
        "max_context": 120000,
        "tools": [
            {"name": "Read", "weight": 21.0, "duration": {"dist": "lognormal", "median": 0.036,
                                                           "p90": 0.15, "max": 10}},
            {"name": "Edit", "weight": 13.0, "duration": {"dist": "lognormal", "median": 0.095,
                                                           "p90": 0.4, "max": 10}},
            {"name": "Grep", "weight": 6.0, "duration": {"dist": "lognormal", "median": 0.15,
                                                          "p90": 0.8, "max": 30}},
            {"name": "Glob", "weight": 4.0, "duration": {"dist": "lognormal", "median": 0.15,
                                                          "p90": 0.8, "max": 30}},
            {"name": "Bash", "weight": 40.0, "timeout_s": 120.0,
             "duration": {"dist": "lognormal", "median": 0.9, "p90": 5.0, "max": 120}},
            {"name": "Bash:test", "weight": 11.0, "timeout_s": 600.0,
             "duration": {"dist": "lognormal", "median": 15.0, "p90": 45.0, "max": 600}},
            {"name": "Task", "weight": 4.2, "duration": {"dist": "lognormal", "median": 100.0,
                                                          "p90": 800.0, "max": 3600}},
        ],
    },
    "chat": {
        "description": "chat: one request, no tools",
        "shared_prefix_tokens": 300,
        "initial_tokens": {"dist": "lognormal", "median": 800, "p90": 3000, "max": 16000},
        "turns": 1,
        "output_tokens": {"dist": "lognormal", "median": 250, "p90": 800, "max": 4000},
    },
    "mixed": {
        "description": "300 SWE-Lite + 89 Terminal-Bench tasks (paper Table 3 proportion)",
        "mix": [{"workload": "swe-lite", "weight": 300}, {"workload": "terminal-bench",
                                                          "weight": 89}],
    },
}  # fmt: skip
"""Built-in families as TOML-shaped tables (the workload file format, see docs/evaluation.md)."""


def _int(doc: Mapping[str, object], key: str, default: int, lo: int = 0) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise WorkloadError(key, f"must be an integer >= {lo}, got {value!r}")
    return value


def _tool(doc: object, i: int) -> ToolSpec:
    where = f"tools[{i}]"
    if not isinstance(doc, Mapping):
        raise WorkloadError(where, "must be a table")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise WorkloadError(f"{where}.name", "must be a non-empty string")
    weight = doc.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
        raise WorkloadError(f"{where}.weight", f"must be a number >= 0, got {weight!r}")
    timeout = doc.get("timeout_s")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise WorkloadError(f"{where}.timeout_s", f"must be a number > 0, got {timeout!r}")
    bg = doc.get("background_prob", 0.0)
    if isinstance(bg, bool) or not isinstance(bg, int | float) or not 0 <= bg <= 1:
        raise WorkloadError(f"{where}.background_prob", f"must lie in [0, 1], got {bg!r}")
    if "duration" not in doc:
        raise WorkloadError(f"{where}.duration", "missing")
    duration = parse_dist(doc["duration"], f"{where}.duration")
    return ToolSpec(
        name, float(weight), duration, None if timeout is None else float(timeout), float(bg)
    )


def parse_workload(doc: Mapping[str, object], name: str, depth: int = 0) -> WorkloadSpec:
    """A :class:`WorkloadSpec` from a TOML-shaped table (built-in or read from a file)."""
    known = {
        "name", "description", "shared_prefix_tokens", "initial_tokens", "turns",
        "output_tokens", "observation_tokens", "max_context", "tools", "mix",
    }  # fmt: skip
    for key in doc:
        if key not in known:
            raise WorkloadError(key, f"unknown key; known: {', '.join(sorted(known))}")
    desc = doc.get("description", "")
    if "mix" in doc:
        raw = doc["mix"]
        if not isinstance(raw, list) or not raw:
            raise WorkloadError("mix", "must be a non-empty list of {workload, weight}")
        parts: list[tuple[WorkloadSpec, float]] = []
        for i, part in enumerate(raw):
            if not isinstance(part, Mapping) or not isinstance(part.get("workload"), str):
                raise WorkloadError(f"mix[{i}].workload", "must name a built-in workload")
            sub = str(part["workload"])
            if sub not in BUILTIN or depth > 2:
                raise WorkloadError(f"mix[{i}].workload", f"unknown built-in {sub!r}")
            w = part.get("weight", 1.0)
            if isinstance(w, bool) or not isinstance(w, int | float) or w <= 0:
                raise WorkloadError(f"mix[{i}].weight", f"must be a number > 0, got {w!r}")
            parts.append((parse_workload(BUILTIN[sub], sub, depth + 1), float(w)))
        return WorkloadSpec(name=name, mix=tuple(parts), description=str(desc))
    tools_raw = doc.get("tools", [])
    if not isinstance(tools_raw, list):
        raise WorkloadError("tools", "must be a list of tables")
    tools = tuple(_tool(t, i) for i, t in enumerate(tools_raw))
    if tools and sum(t.weight for t in tools) <= 0:
        raise WorkloadError("tools", "weights must have a positive sum")
    return WorkloadSpec(
        name=name,
        shared_prefix=_int(doc, "shared_prefix_tokens", 0),
        initial=parse_dist(doc.get("initial_tokens", 1000), "initial_tokens"),
        turns=parse_dist(doc.get("turns", 1), "turns"),
        output=parse_dist(doc.get("output_tokens", 100), "output_tokens"),
        observation=parse_dist(doc.get("observation_tokens", 0), "observation_tokens"),
        tools=tools,
        max_context=_int(doc, "max_context", 120_000, lo=1),
        description=str(desc),
    )


def load_workload(name_or_path: str) -> WorkloadSpec:
    """A built-in family by name, or a TOML workload file by path."""
    if name_or_path in BUILTIN:
        return parse_workload(BUILTIN[name_or_path], name_or_path)
    try:
        with open(name_or_path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        known = ", ".join(BUILTIN)
        raise WorkloadError(
            "--workload", f"{name_or_path!r} is neither a built-in ({known}) nor a file"
        ) from None
    except OSError as exc:
        raise WorkloadError("--workload", f"cannot read {name_or_path!r}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise WorkloadError("--workload", f"{name_or_path}: invalid TOML: {exc}") from None
    name = doc.get("name", name_or_path)
    return parse_workload(doc, str(name))


def _pick_tool(spec: WorkloadSpec, rng: np.random.Generator) -> ToolSpec:
    weights = np.asarray([t.weight for t in spec.tools])
    return spec.tools[int(rng.choice(len(spec.tools), p=weights / weights.sum()))]


def _one_task(spec: WorkloadSpec, task_id: str, rng: np.random.Generator) -> Task:
    n = max(1, round(spec.turns.sample(rng)))
    ctx = spec.shared_prefix
    turns: list[Turn] = []
    added = max(1, round(spec.initial.sample(rng)))
    for j in range(n):
        out = max(1, round(spec.output.sample(rng)))
        if turns and ctx + added + out > spec.max_context:
            break  # the agent stops at its context limit
        ctx += added + out
        last = j == n - 1 or not spec.tools
        if last:
            turns.append(Turn(added, out))
            break
        tool = _pick_tool(spec, rng)
        dur = max(0.0, tool.duration.sample(rng))
        bg = tool.background > 0 and float(rng.random()) < tool.background
        if bg:  # run_in_background: the call returns at once, the work goes on elsewhere
            dur = min(dur, 0.1)
        turns.append(Turn(added, out, tool.name, dur, tool.timeout, bg))
        added = max(1, round(spec.observation.sample(rng)))
    if turns[-1].tool is not None:  # cut by the context limit: the last turn calls no tool
        last_turn = turns[-1]
        turns[-1] = Turn(last_turn.added, last_turn.output)
    return Task(task_id, spec.name, spec.shared_prefix, tuple(turns))


_SHELL_PROGRAMS = ("grep", "find", "ls", "git", "python", "pytest", "make", "cat", "sed")
FOLDED_NAMES: dict[str, dict[str, str]] = {
    "swe-agent": dict.fromkeys(_SHELL_PROGRAMS, "bash"),
    "swe-lite": dict.fromkeys(_SHELL_PROGRAMS, "bash"),
}
"""Per family, the tool names a harness that reports only its tools (not the command run)
would show: SWE-agent's and mini-swe-agent's shell programs all run through ``bash`` (its
editor tools ``view`` / ``edit`` keep their names). Every family also drops a ``:kind``
suffix (claude-code's ``Bash:test`` is ``Bash``): :func:`folded_name`."""


def folded_name(family: str, name: str) -> str:
    """The name ``name`` of a ``family`` call has when long and short calls share one name."""
    return FOLDED_NAMES.get(family, {}).get(name, name).split(":", 1)[0]


def _folded(task: Task) -> Task:
    turns = tuple(
        t if t.tool is None else replace(t, tool=folded_name(task.family, t.tool))
        for t in task.turns
    )
    return replace(task, turns=turns)


def generate_tasks(
    spec: WorkloadSpec,
    n: int,
    seed: int,
    *,
    extra_tool_delay: tuple[float, float] | None = None,
    arrival_rate: float | None = None,
    fold_tools: bool = False,
) -> list[Task]:
    """``n`` tasks, deterministic for ``seed``; task ``i`` depends only on ``(seed, i)``.

    ``extra_tool_delay = (lo, hi)`` adds one fixed delay per session, drawn uniformly, to every
    tool call of that session (the paper's Table 8 setup). ``arrival_rate`` (tasks/s) gives
    Poisson arrival times for an open-loop run. ``fold_tools`` renames each call with
    :func:`folded_name` after drawing it: the same calls (durations, timeouts, tokens) as
    without, under the names a harness that does not label its commands reports.
    """
    tasks: list[Task] = []
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        fam = spec
        if spec.mix:
            w = np.asarray([p[1] for p in spec.mix])
            fam = spec.mix[int(rng.choice(len(spec.mix), p=w / w.sum()))][0]
        task = _one_task(fam, f"s{seed}-t{i:05d}", rng)
        if extra_tool_delay is not None:
            lo, hi = extra_tool_delay
            extra = float(np.random.default_rng([seed, i, 7]).uniform(lo, hi))
            task = Task(
                task.id,
                task.family,
                task.shared_prefix,
                tuple(_delayed(t, extra) for t in task.turns),
            )
        tasks.append(task)
    if arrival_rate is not None:
        gaps = np.random.default_rng([seed, 1 << 20]).exponential(1.0 / arrival_rate, size=n)
        times = np.cumsum(gaps) - gaps[0]
        tasks = [_at(t, float(a)) for t, a in zip(tasks, times, strict=True)]
    if fold_tools:
        tasks = [_folded(t) for t in tasks]
    return tasks


def _delayed(turn: Turn, extra: float) -> Turn:
    if turn.tool is None or turn.background:
        return turn
    return Turn(turn.added, turn.output, turn.tool, turn.duration + extra, turn.timeout)


def _at(task: Task, arrival: float) -> Task:
    return Task(task.id, task.family, task.shared_prefix, task.turns, arrival)


def summarize(tasks: Sequence[Task]) -> dict[str, float]:
    """Mean turns, mean final context, mean tool time: for docs and sanity tests."""
    if not tasks:
        return {"tasks": 0.0}
    turns = [len(t.turns) for t in tasks]
    final = [t.prompt_tokens[-1] + t.turns[-1].output for t in tasks]
    durs = [u.duration for t in tasks for u in t.turns if u.tool is not None]
    return {
        "tasks": float(len(tasks)),
        "turns_mean": float(np.mean(turns)),
        "final_context_mean": float(np.mean(final)),
        "final_context_p50": float(np.median(final)),
        "tool_time_median": float(np.median(durs)) if durs else math.nan,
        "tool_time_mean": float(np.mean(durs)) if durs else math.nan,
    }
