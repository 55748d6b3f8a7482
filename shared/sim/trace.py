"""Session-trace JSONL: replay an operator's recorded agent sessions (docs/evaluation.md).

One JSON object per line, one line per session::

    {"session": "django-11099", "family": "swe-lite", "start": 12.5,
     "shared_prefix_tokens": 1500,
     "turns": [
       {"prompt_tokens_added": 3600, "output_tokens": 120, "tool": "pytest",
        "tool_duration_s": 4.2, "tool_timeout_s": null, "background": false,
        "request_ts": 1767225600.1, "response_ts": 1767225603.9,
        "tool_start_ts": 1767225603.9, "tool_end_ts": 1767225608.1},
       {"prompt_tokens": 5410, "output_tokens": 96, "cached_tokens": 5120}
     ]}

Per turn, the prompt growth is ``prompt_tokens_added`` (tokens appended before this request: the
task for turn 0, the tool observation after) or ``prompt_tokens`` (the whole prompt, as APIs
report usage; the growth is then prompt − previous prompt − previous output, at least 1).
``tool`` (null or absent: no tool; ignored on the last turn) with ``tool_duration_s``, or the
duration from ``tool_end_ts − tool_start_ts``. Timestamps are optional epoch or relative
seconds; only differences are used. ``start`` is the session's arrival offset in seconds;
without it the first turn's ``request_ts`` (relative to the earliest in the file) is used, and
without either the session has no arrival time (closed-loop replay only). ``family`` (default
``"trace"``) names whose shared prefix the session shares; ``shared_prefix_tokens`` defaults
to 0 and counts inside turn 0's prompt when ``prompt_tokens`` is used. ``cached_tokens`` (the
prompt tokens the recorded provider served from its cache) and ``tools`` (every tool name of a
response with parallel calls; ``tool`` is the longest) are checked and otherwise not used: the
simulator models its own cache. ``tao trace import`` (:mod:`shared.trace`) writes these files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from shared.sim.dists import WorkloadError
from shared.sim.workloads import Task, Turn

__all__ = ["load_trace", "parse_trace_line", "trace_line"]


def _num(doc: Mapping[str, object], key: str, where: str, *, lo: float = 0.0) -> float | None:
    if key not in doc or doc[key] is None:
        return None
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < lo:
        raise WorkloadError(f"{where}.{key}", f"must be a number >= {lo:g}, got {v!r}")
    return float(v)


def _int(doc: Mapping[str, object], key: str, where: str, *, lo: int = 0) -> int | None:
    if key not in doc or doc[key] is None:
        return None
    v = doc[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise WorkloadError(f"{where}.{key}", f"must be an integer >= {lo}, got {v!r}")
    return v


def parse_trace_line(doc: object, where: str) -> tuple[Task, float | None]:
    """One session: the task and its raw arrival reference (``start`` or first request_ts)."""
    if not isinstance(doc, Mapping):
        raise WorkloadError(where, "must be a JSON object")
    sid = doc.get("session")
    if not isinstance(sid, str) or not sid:
        raise WorkloadError(f"{where}.session", "must be a non-empty string")
    family = doc.get("family", "trace")
    if not isinstance(family, str):
        raise WorkloadError(f"{where}.family", "must be a string")
    shared = _int(doc, "shared_prefix_tokens", where) or 0
    turns_raw = doc.get("turns")
    if not isinstance(turns_raw, list) or not turns_raw:
        raise WorkloadError(f"{where}.turns", "must be a non-empty list")
    turns: list[Turn] = []
    ctx = shared
    for j, t in enumerate(turns_raw):
        tw = f"{where}.turns[{j}]"
        if not isinstance(t, Mapping):
            raise WorkloadError(tw, "must be an object")
        out = _int(t, "output_tokens", tw, lo=1)
        if out is None:
            raise WorkloadError(f"{tw}.output_tokens", "missing")
        added = _int(t, "prompt_tokens_added", tw, lo=0)
        if added is None:
            total = _int(t, "prompt_tokens", tw, lo=1)
            if total is None:
                raise WorkloadError(tw, "needs prompt_tokens_added or prompt_tokens")
            added = max(1, total - ctx)
        if j == 0 and added < 1:
            raise WorkloadError(f"{tw}.prompt_tokens_added", "must be >= 1 on the first turn")
        _int(t, "cached_tokens", tw, lo=0)  # recorded provider cache hits: checked, not used
        names = t.get("tools")
        if names is not None and not (
            isinstance(names, list) and all(isinstance(n, str) for n in names)
        ):
            raise WorkloadError(f"{tw}.tools", "must be a list of strings")
        tool = t.get("tool")
        if tool is not None and not isinstance(tool, str):
            raise WorkloadError(f"{tw}.tool", "must be a string or null")
        last = j == len(turns_raw) - 1
        if tool is None or last:
            turns.append(Turn(added, out))
        else:
            dur = _num(t, "tool_duration_s", tw)
            if dur is None:
                t0, t1 = _num(t, "tool_start_ts", tw), _num(t, "tool_end_ts", tw)
                if t0 is None or t1 is None or t1 < t0:
                    raise WorkloadError(
                        f"{tw}.tool_duration_s", "missing (and no tool_start_ts <= tool_end_ts)"
                    )
                dur = t1 - t0
            timeout = _num(t, "tool_timeout_s", tw)
            bg = t.get("background", False)
            if not isinstance(bg, bool):
                raise WorkloadError(f"{tw}.background", "must be true or false")
            turns.append(Turn(added, out, tool, dur, timeout if timeout else None, bg))
        ctx += added + out
    start = _num(doc, "start", where)
    ref = start
    if ref is None and isinstance(turns_raw[0], Mapping):
        ref = _num(turns_raw[0], "request_ts", f"{where}.turns[0]")
    return Task(sid, family, shared, tuple(turns)), ref


def load_trace(path: str) -> list[Task]:
    """Every session of a trace file, in file order, with arrivals relative to the earliest."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except OSError as exc:
        raise WorkloadError("--trace", f"cannot read {path!r}: {exc.strerror or exc}") from None
    parsed: list[tuple[Task, float | None]] = []
    seen: set[str] = set()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{i}", f"invalid JSON: {exc.msg}") from None
        task, ref = parse_trace_line(doc, f"{path}:{i}")
        if task.id in seen:
            raise WorkloadError(f"{path}:{i}.session", f"duplicate session {task.id!r}")
        seen.add(task.id)
        parsed.append((task, ref))
    if not parsed:
        raise WorkloadError("--trace", f"{path!r} holds no sessions")
    refs = [r for _, r in parsed if r is not None]
    if len(refs) != len(parsed):
        return [t for t, _ in parsed]
    base = min(refs)
    return [
        Task(t.id, t.family, t.shared_prefix, t.turns, r - base) for t, r in parsed if r is not None
    ]


def trace_line(task: Task) -> dict[str, object]:
    """``task`` as one trace line (what :func:`parse_trace_line` reads back as the same task):
    ``tao sim --write-trace`` writes a generated workload so that ``tao demo --trace`` can run
    on real engines exactly what ``tao sim --trace`` simulates."""
    turns: list[dict[str, object]] = []
    for t in task.turns:
        turn: dict[str, object] = {"prompt_tokens_added": t.added, "output_tokens": t.output}
        if t.tool is not None:
            turn.update(
                tool=t.tool,
                tool_duration_s=t.duration,
                tool_timeout_s=t.timeout,
                background=t.background,
            )
        turns.append(turn)
    doc: dict[str, object] = {
        "session": task.id,
        "family": task.family,
        "shared_prefix_tokens": task.shared_prefix,
        "turns": turns,
    }
    if task.arrival is not None:
        doc["start"] = task.arrival
    return doc
