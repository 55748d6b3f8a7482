"""mini-swe-agent ``.traj.json`` trajectories → session-trace sessions (one per file).

The format, from mini-swe-agent's sources (SWE-agent/mini-swe-agent): ``save_traj`` /
``DefaultAgent.save`` write ``{"info": {...}, "messages": [...], "trajectory_format": ...}``;
``"mini-swe-agent-1"`` for v1.x, ``"mini-swe-agent-1.1"`` since v2.0
(docs/advanced/v2_migration.md: messages are the model's native message plus an ``extra`` dict).

* Assistant messages: ``LitellmModel.query`` (src/minisweagent/models/litellm_model.py) sets
  ``extra = {"actions": [...], "response": response.model_dump(), "cost": ..., "timestamp":
  time.time()}`` — the timestamp is taken **after** the response arrived, and the usage is
  ``extra.response.usage`` (LiteLLM's OpenAI-shaped usage; other model classes and forks put it
  in ``extra.usage`` or ``usage``, both accepted). v1 messages carry ``extra.response`` but no
  timestamp.
* Observations: ``format_toolcall_observation_messages`` (models/utils/actions_toolcall.py)
  writes one ``role: "tool"`` message per action (``tool_call_id``), text-based models one
  ``role: "user"`` message (models/litellm_model.py ``format_observation_messages``), each with
  ``extra = {"raw_output", "returncode", "timestamp": time.time()}`` stamped when the outputs are
  formatted, i.e. after **all** of the response's actions ran, one after another. Format errors
  are ``role: "user"`` messages with ``extra.interrupt_type``: not observations.

So a turn's tool time is the last observation's ``extra.timestamp`` minus the assistant's: an
upper bound that includes parsing and formatting overhead, and with several actions in one
response the whole sequential window is recorded for each (the longest is the window). The next
call's ``request_ts`` is that last observation's timestamp. A trajectory without timestamps (v1)
imports with tokens but no tool durations (counted as skipped tool calls).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shared.trace.model import (
    BadRecord,
    ImportResult,
    ModelCall,
    ToolCall,
    TraceImportError,
    TraceSession,
    read_text,
    seconds,
    session_stem,
    usage_tokens,
)

__all__ = ["FAMILY", "from_miniswe"]

FAMILY = "mini-swe-agent"
_FORMAT_PREFIX = "mini-swe-agent-1"


@dataclass
class _Pending:
    """An assistant message waiting for its observations."""

    prompt: int
    output: int
    cached: int | None
    request_ts: float | None
    response_ts: float | None
    names: list[str]
    observed: list[float | None] = field(default_factory=list)


def from_miniswe(path: str) -> ImportResult:
    """Import one ``.traj.json`` (see the module docstring); raises :class:`TraceImportError`."""
    text = read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceImportError(
            f"{path}:{exc.lineno}", f"invalid JSON ({exc.msg}, column {exc.colno})"
        ) from None
    if not isinstance(doc, Mapping):
        raise TraceImportError(path, "not a mini-swe-agent trajectory (top level is not an object)")
    fmt = doc.get("trajectory_format")
    if not isinstance(fmt, str) or not fmt.startswith(_FORMAT_PREFIX):
        raise TraceImportError(
            path,
            f"not a mini-swe-agent trajectory (trajectory_format is {fmt!r}, "
            f"expected {_FORMAT_PREFIX!r} or {_FORMAT_PREFIX + '.1'!r})",
        )
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise TraceImportError(path, "messages: must be a list")
    result = ImportResult(path)
    try:
        calls = _walk(messages, result)
    except BadRecord as exc:
        raise TraceImportError(path, str(exc)) from None
    sid = doc.get("instance_id")
    if not isinstance(sid, str) or not sid:
        sid = session_stem(path, (".traj.json", ".json"))
    if calls:
        result.sessions.append(TraceSession(sid, FAMILY, tuple(calls)))
    return result.require_turns("no assistant message with usage")


def _walk(messages: Sequence[object], result: ImportResult) -> list[ModelCall]:
    calls: list[ModelCall] = []
    pending: _Pending | None = None
    last_obs: float | None = None
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise BadRecord(f"{where}: must be an object")
        role = msg.get("role")
        extra = msg.get("extra", {})
        if extra is None:
            extra = {}
        if not isinstance(extra, Mapping):
            raise BadRecord(f"{where}.extra: must be an object")
        ts = seconds(extra.get("timestamp", msg.get("timestamp")), f"{where}.extra.timestamp")
        if role == "assistant":
            if pending is not None:
                calls.append(_finish(pending, result))
            pending = _assistant(msg, extra, where, last_obs, ts, result)
        else:
            if pending is not None and role in ("tool", "user") and "interrupt_type" not in extra:
                pending.observed.append(ts)
            if ts is not None and role != "exit":
                last_obs = ts  # the next request follows the last observation or notice
    if pending is not None:
        calls.append(_finish(pending, result))
    return calls


def _assistant(
    msg: Mapping[str, object],
    extra: Mapping[str, object],
    where: str,
    last_obs: float | None,
    ts: float | None,
    result: ImportResult,
) -> _Pending | None:
    usage, uwhere = _find_usage(msg, extra, where)
    if usage is None:
        result.skip("assistant messages without usage")
        return None
    prompt, output, cached = usage_tokens(usage, uwhere)
    if prompt < 1:
        result.skip("assistant messages with an empty prompt")
        return None
    return _Pending(prompt, output, cached, last_obs, ts, _action_names(msg, extra, where))


def _find_usage(
    msg: Mapping[str, object], extra: Mapping[str, object], where: str
) -> tuple[Mapping[str, object] | None, str]:
    response = extra.get("response")
    candidates: list[tuple[object, str]] = [
        (response.get("usage") if isinstance(response, Mapping) else None,
         f"{where}.extra.response.usage"),
        (extra.get("usage"), f"{where}.extra.usage"),
        (msg.get("usage"), f"{where}.usage"),
    ]  # fmt: skip
    for usage, uwhere in candidates:
        if usage is None:
            continue
        if not isinstance(usage, Mapping):
            raise BadRecord(f"{uwhere}: must be an object")
        return usage, uwhere
    return None, where


def _action_names(msg: Mapping[str, object], extra: Mapping[str, object], where: str) -> list[str]:
    """Tool names of the response: its ``tool_calls`` (tool-calling models), else one ``bash``
    per parsed action (text-based models run shell commands), else one ``bash``."""
    tool_calls = msg.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        names = []
        for j, call in enumerate(tool_calls):
            fn = call.get("function") if isinstance(call, Mapping) else None
            name = fn.get("name") if isinstance(fn, Mapping) else None
            if not isinstance(name, str) or not name:
                raise BadRecord(f"{where}.tool_calls[{j}].function.name: must be a string")
            names.append(name)
        return names
    actions = extra.get("actions")
    if isinstance(actions, list) and actions:
        return ["bash"] * len(actions)
    return ["bash"]


def _finish(p: _Pending, result: ImportResult) -> ModelCall:
    tools: tuple[ToolCall, ...] = ()
    if p.observed:
        ends = [t for t in p.observed if t is not None]
        if ends and p.response_ts is not None:
            end = max(ends)
            tools = tuple(ToolCall(n, p.response_ts, end) for n in p.names)
        else:
            tools = tuple(ToolCall(n) for n in p.names)
            result.skip("tool calls without timestamps", len(p.names))
    return ModelCall(p.prompt, p.output, p.cached, p.request_ts, p.response_ts, tools)
