"""OpenCode event logs and ``opencode export`` files → sessions (several per file).

Shapes, from OpenCode's sources (anomalyco/opencode, formerly sst/opencode):

* ``packages/opencode/src/session/message-v2.ts``: bus events ``message.updated``
  (``properties.info``: a message; assistant messages carry ``id``, ``sessionID``,
  ``time {created, completed}`` in epoch ms, ``tokens {input, output, reasoning, cache {read,
  write}}``, ``error``) and ``message.part.updated`` (``properties.part``: ``id``,
  ``sessionID``, ``messageID``, ``type``; a ``tool`` part has ``callID``, ``tool``, ``state
  {status, input, time {start, end}}`` in epoch ms; a ``step-finish`` part has the ``tokens`` of
  one model call); ``message.removed`` / ``message.part.removed`` delete.
* ``packages/opencode/src/session/processor.ts``: each ``finish-step`` of the model stream writes
  a ``step-finish`` part with that step's usage and *replaces* the message's ``tokens`` with it;
  a tool part goes ``running`` with ``time.start`` when the call arrives and ``completed`` /
  ``error`` with ``time.end`` when it returns; ``time.completed`` is set after the stream, i.e.
  after the tools ran.
* ``getUsage`` (``session/index.ts``): ``tokens.input`` excludes cached tokens for every
  provider, so prompt = input + cache.read + cache.write and cached = cache.read; completion =
  ``tokens.output`` (the provider's output count, reasoning included as AI SDK reports it).
* ``packages/opencode/src/cli/cmd/export.ts``: ``opencode export`` prints ``{"info": session,
  "messages": [{"info", "parts"}]}`` — the same messages and parts, accepted as well.

Log lines are the event objects ``{"type", "properties"}`` that ``Bus.subscribeAll`` sees: what a
plugin's ``event`` hook receives, and what the server's ``GET /event`` SSE stream sends as
``data: <event>`` (``packages/opencode/src/server/server.ts``; so ``curl -N
http://127.0.0.1:4096/event > events.jsonl`` next to ``opencode serve`` records one). SSE
``data:`` prefixes are stripped and other SSE field lines ignored; an event wrapped under
``event`` or ``payload`` is unwrapped. The last update of a message or part wins. (TAO's own
OpenCode plugin forwards only tool parts, which carry no token counts: record the event stream
or use ``opencode export``.)

Mapping. A turn is one model call: each ``step-finish`` part (its tokens), the tool parts before
it in the message belonging to it; a message without step parts is one call with the message's
``tokens``. Tool duration = ``state.time.end − state.time.start``; a call that never ended is left
out and counted. ``request_ts``: the message's ``time.created`` for its first step, the previous
step's last tool end after; ``response_ts``: the first tool start of the step, else (last step)
``time.completed``. Messages are ordered by ``time.created`` (then log order), one session per
``sessionID`` (subagent sessions have their own ids).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.trace.model import (
    BadRecord,
    ImportResult,
    LineErrors,
    ModelCall,
    ToolCall,
    TraceImportError,
    TraceSession,
    count,
    iter_jsonl,
    read_text,
    seconds,
)

__all__ = ["FAMILY", "from_opencode"]

FAMILY = "opencode"
_MS = 1e-3
_SSE_FIELDS = ("event:", "id:", "retry:", ":")
_HANDLED = ("message.updated", "message.part.updated", "message.removed", "message.part.removed")


@dataclass
class _Message:
    info: Mapping[str, object]
    order: int
    parts: dict[str, Mapping[str, object]] = field(default_factory=dict)


@dataclass
class _Session:
    messages: dict[str, _Message] = field(default_factory=dict)


class _Store:
    """Last state of every message and part, per session, in first-seen order."""

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.seen = 0
        self.parts_without_message: dict[tuple[str, str], dict[str, Mapping[str, object]]] = {}

    def message(self, sid: str, mid: str) -> _Message | None:
        return self.sessions.get(sid, _Session()).messages.get(mid)

    def put_message(self, info: Mapping[str, object]) -> None:
        sid, mid = _str(info, "sessionID", "info"), _str(info, "id", "info")
        sess = self.sessions.setdefault(sid, _Session())
        msg = sess.messages.get(mid)
        if msg is None:
            self.seen += 1
            msg = sess.messages[mid] = _Message(info, self.seen)
            msg.parts.update(self.parts_without_message.pop((sid, mid), {}))
        else:
            msg.info = info

    def put_part(self, part: Mapping[str, object], sid_hint: object) -> None:
        sid = part.get("sessionID", sid_hint)
        if not isinstance(sid, str):
            raise BadRecord("part.sessionID: must be a string")
        mid, pid = _str(part, "messageID", "part"), _str(part, "id", "part")
        msg = self.message(sid, mid)
        parts = msg.parts if msg else self.parts_without_message.setdefault((sid, mid), {})
        parts[pid] = part

    def remove(self, props: Mapping[str, object]) -> None:
        sid, mid = props.get("sessionID"), props.get("messageID")
        if not isinstance(sid, str) or not isinstance(mid, str):
            return
        msg = self.message(sid, mid)
        pid = props.get("partID")
        if isinstance(pid, str):
            if msg is not None:
                msg.parts.pop(pid, None)
        elif msg is not None:
            del self.sessions[sid].messages[mid]


def _str(doc: Mapping[str, object], key: str, where: str) -> str:
    v = doc.get(key)
    if not isinstance(v, str) or not v:
        raise BadRecord(f"{where}.{key}: must be a non-empty string, got {v!r}")
    return v


def _event(doc: Mapping[str, object]) -> Mapping[str, object]:
    for wrapper in ("payload", "event"):
        inner = doc.get(wrapper)
        if "type" not in doc and isinstance(inner, Mapping):
            return inner
    return doc


def _take_event(store: _Store, doc: Mapping[str, object], other: dict[str, int]) -> None:
    ev = _event(doc)
    kind = ev.get("type")
    if kind not in _HANDLED:
        label = kind if isinstance(kind, str) else "untyped"
        other[label] = other.get(label, 0) + 1
        return
    props = ev.get("properties")
    if not isinstance(props, Mapping):
        raise BadRecord(f"{kind}: properties must be an object")
    if kind == "message.updated":
        info = props.get("info")
        if not isinstance(info, Mapping):
            raise BadRecord("message.updated: properties.info must be an object")
        store.put_message(info)
    elif kind == "message.part.updated":
        part = props.get("part")
        if not isinstance(part, Mapping):
            raise BadRecord("message.part.updated: properties.part must be an object")
        store.put_part(part, props.get("sessionID"))
    else:
        store.remove(props)


def _read_log(text: str, result: ImportResult, store: _Store) -> dict[str, int]:
    errors = LineErrors(result)
    other: dict[str, int] = {}
    lines = [
        ln[5:].lstrip() if ln.startswith("data:") else "" if ln.startswith(_SSE_FIELDS) else ln
        for ln in text.splitlines()
    ]
    for lineno, doc in iter_jsonl("\n".join(lines), errors):
        try:
            _take_event(store, doc, other)
        except BadRecord as exc:
            errors.add(lineno, str(exc))
    return other


def _read_export(doc: Mapping[str, object], path: str, store: _Store) -> None:
    messages = doc.get("messages")
    if not isinstance(messages, list):
        raise TraceImportError(path, "messages: must be a list (opencode export)")
    for i, m in enumerate(messages):
        try:
            info = m.get("info") if isinstance(m, Mapping) else None
            if not isinstance(m, Mapping) or not isinstance(info, Mapping):
                raise BadRecord("must be an object with info")
            store.put_message(info)
            parts = m.get("parts", [])
            if not isinstance(parts, list):
                raise BadRecord("parts: must be a list")
            for j, part in enumerate(parts):
                if not isinstance(part, Mapping):
                    raise BadRecord(f"parts[{j}]: must be an object")
                store.put_part(part, info.get("sessionID"))
        except BadRecord as exc:
            raise TraceImportError(path, f"messages[{i}]: {exc}") from None


def _is_export(text: str) -> Mapping[str, object] | None:
    """The parsed document when the file is one JSON object with ``messages`` (an export)."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, Mapping) and "messages" in doc else None


def from_opencode(path: str) -> ImportResult:
    """Import one event log or export (see the module docstring); raises TraceImportError."""
    text = read_text(path)
    result = ImportResult(path)
    store = _Store()
    other: dict[str, int] = {}
    export = _is_export(text)
    if export is not None:
        _read_export(export, path, store)
    else:
        other = _read_log(text, result, store)
    orphans = sum(len(p) for p in store.parts_without_message.values())
    result.skip("parts of messages never logged", orphans)
    for sid, sess in store.sessions.items():
        try:
            calls = _session_calls(sess, result)
        except BadRecord as exc:
            raise TraceImportError(path, f"session {sid}: {exc}") from None
        if calls:
            result.sessions.append(TraceSession(sid, FAMILY, tuple(calls)))
    seen = ", ".join(f"{k} x{v}" for k, v in sorted(other.items())[:4])
    return result.require_turns(
        "expected OpenCode message.updated events of assistant messages with tokens"
        + (f"; found only {seen}" if seen else "")
    )


def _session_calls(sess: _Session, result: ImportResult) -> list[ModelCall]:
    def created(m: _Message) -> tuple[float, int]:
        t = m.info.get("time")
        c = t.get("created") if isinstance(t, Mapping) else None
        return (float(c) if isinstance(c, int | float) else float("inf"), m.order)

    calls: list[ModelCall] = []
    for msg in sorted(sess.messages.values(), key=created):
        if msg.info.get("role") == "assistant":
            calls.extend(_message_calls(msg, result))
    return calls


def _message_calls(msg: _Message, result: ImportResult) -> list[ModelCall]:
    info = msg.info
    where = f"message {info.get('id')}"
    t = info.get("time")
    t = t if isinstance(t, Mapping) else {}
    created = seconds(t.get("created"), f"{where}.time.created", scale=_MS)
    completed = seconds(t.get("completed"), f"{where}.time.completed", scale=_MS)
    steps: list[tuple[Mapping[str, object], list[Mapping[str, object]]]] = []
    tools: list[Mapping[str, object]] = []
    for part in msg.parts.values():
        if part.get("type") == "tool":
            tools.append(part)
        elif part.get("type") == "step-finish":
            steps.append((part, tools))
            tools = []
    if steps:
        steps[-1][1].extend(tools)
    else:
        steps = [(info, tools)]
    calls: list[ModelCall] = []
    request = created
    for k, (holder, parts) in enumerate(steps):
        tokens = _tokens(holder.get("tokens"), f"{where}.tokens")
        timed = [_tool(p, f"{where} part {p.get('id')}", result) for p in parts]
        calls_tools = tuple(c for c in timed if c is not None)
        starts = [c.start_ts for c in calls_tools if c.start_ts is not None]
        ends = [c.end_ts for c in calls_tools if c.end_ts is not None]
        response = min(starts) if starts else (completed if k == len(steps) - 1 else None)
        if tokens is None or tokens[0] < 1:
            result.skip("model calls without tokens")
        else:
            calls.append(ModelCall(*tokens, request, response, calls_tools))
        request = max(ends) if ends else None
    return calls


def _tokens(value: object, where: str) -> tuple[int, int, int | None] | None:
    if not isinstance(value, Mapping):
        return None
    cache = value.get("cache")
    cache = cache if isinstance(cache, Mapping) else {}
    inp = count(value.get("input"), f"{where}.input") or 0
    out = count(value.get("output"), f"{where}.output") or 0
    read = count(cache.get("read"), f"{where}.cache.read")
    write = count(cache.get("write"), f"{where}.cache.write") or 0
    return inp + (read or 0) + write, out, read


def _tool(part: Mapping[str, object], where: str, result: ImportResult) -> ToolCall | None:
    name = part.get("tool")
    state = part.get("state")
    if not isinstance(name, str) or not isinstance(state, Mapping):
        raise BadRecord(f"{where}: a tool part needs tool and state")
    times = state.get("time")
    times = times if isinstance(times, Mapping) else {}
    start = seconds(times.get("start"), f"{where}.state.time.start", scale=_MS)
    end = seconds(times.get("end"), f"{where}.state.time.end", scale=_MS)
    if start is None or end is None:
        result.skip("tool calls without an end")
        return None
    return ToolCall(name, start, end)
