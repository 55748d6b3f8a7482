"""OpenCode plugin payloads → TAO tool and session messages (pure; see :mod:`.base`).

What OpenCode gives a plugin (``@opencode-ai/plugin``, ``packages/plugin/src/index.ts``, the
``Hooks`` interface; event types from ``@opencode-ai/sdk`` ``types.gen.ts``):

* ``tool.execute.before(input: {tool, sessionID, callID}, output: {args})``, run just before
  a tool executes; ``tool.execute.after(input: {tool, sessionID, callID, args},
  output: {title, output, metadata})`` just after it returns (not when it throws).
* ``event({event})`` for every bus event. ``message.part.updated`` carries ``{part}``; a tool
  part (``ToolPart``: ``id, sessionID, messageID, type: "tool", callID, tool, state``) moves
  through ``state.status`` pending → running (``time.start``) → completed (``output``,
  ``time.start``, ``time.end``) or error (``error``, ``time.start``, ``time.end``), times in
  epoch milliseconds. ``session.idle`` (``{sessionID}``) says the agent finished its turn and
  waits for its user; ``session.deleted`` (``{info: Session}``) that the session is gone.
* ``chat.message(input: {sessionID, ...})`` when a user message arrives.
* The bash tool's ``args.timeout`` is in milliseconds, 2 min when absent
  (``DEFAULT_TIMEOUT = OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS || 2 * 60 * 1000`` in
  ``packages/opencode/src/tool/bash.ts``). A command cut by its timeout still completes; the
  only trace is a line appended to its output, ``bash tool terminated command after exceeding
  timeout N ms`` inside ``<bash_metadata>`` (``shell tool …`` in ``<shell_metadata>`` in later
  builds; ``(Command timed out after N ms)`` in early ones): :data:`TIMEOUT_MARKER`.

What TAO's plugin (``opencode_plugin/tao.ts``) POSTs to ``/hooks/opencode``, one object per
call, in the order OpenCode raised them (the plugin sends one request at a time)::

    {"hook": "tool.execute.before", "ts": ms, "input": {tool, sessionID, callID},
     "output": {"args": {"timeout": ms}}}
    {"hook": "tool.execute.after", "ts": ms, "input": {tool, sessionID, callID},
     "output": {"output": "<last 2 KiB>", "metadata": {"exit": int|null}}}
    {"hook": "event", "ts": ms, "event": {"type": "message.part.updated",
     "properties": {"part": <ToolPart, output cut to its last 2 KiB>}}}
    {"hook": "event", "ts": ms, "event": {"type": "session.idle" | "session.deleted", ...}}
    {"hook": "chat.message", "ts": ms, "input": {"sessionID"}}

``ts`` is the plugin's clock when the hook ran (epoch ms); without it the receive time is used.
A bare event object (``{"type": ..., "properties": ...}``, a line of an OpenCode event log) is
read as ``{"hook": "event", "event": <it>}``. Other hooks and events map to ``[]``.

Mapping. A call is keyed by (sessionID, callID); OpenCode's ``callID`` is the model's tool-call
id, the same id the gateway infers a call under, so hook and inferred records meet.

=========================================  ====================================================
event, tool part running                   ToolStart(started_at = time.start), once per call
event, tool part completed / error         ToolEnd(ended_at = time.end, duration_s = end −
                                           start, ok = completed, censored = marker or an
                                           abort; an aborted part is re-stamped with start
                                           = end, so the running event's start is kept)
tool.execute.before                        ToolStart(started_at = ts), unless already started
tool.execute.after                         ToolEnd(ended_at = ts, censored = marker), only when
                                           no event record exists for the call (else the
                                           marker is kept for the event's end)
session.idle                               ToolStart of the pseudo-tool ``user`` (the human
                                           turn, as for Claude Code's ``Stop``), once until
                                           the next chat.message; the turn's unfinished
                                           calls are forgotten
chat.message                               ToolEnd of that ``user`` call
session.deleted                            SessionEnd(reason = "client_closed")
=========================================  ====================================================

The event hook's timings win: they are OpenCode's own, taken around the execution, while the
plugin's ``ts`` is later by the hop into the plugin. OpenCode's session processor
(``packages/opencode/src/session/processor.ts``) marks the part running on the stream's
``tool-call`` (``time.start``) as the tool starts, and completed or error on ``tool-result`` /
``tool-error`` (``time.end``) after the tool, and so after ``tool.execute.after``, returned. A
call seen by the event hook is thus ended by its completed event (a ``tool.execute.before``
seen first starts it a few ms late); the before/after pair serves only calls the event hook
never reported. Each call starts once and
ends once: ended calls are remembered (the last :data:`MAX_CALLS`) so a late duplicate maps to
``[]``. The bash ``timeout`` (ms) gives ``timeout_s``; the tools service adds it to
``started_at`` for the deadline. Run one tools-service replica per stream: the memory is local.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.contracts.base import Message
from shared.contracts.session import END_CLIENT_CLOSED, SessionEnd
from shared.contracts.tool import SOURCE_PLUGIN, ToolEnd, ToolStart

from .claude import USER_TOOL
from .fields import Fields, trim_oldest

__all__ = [
    "BASH_DEFAULT_TIMEOUT_MS",
    "HARNESS",
    "MAX_CALLS",
    "SHELL_TOOLS",
    "TIMEOUT_MARKER",
    "OpenCodeMapper",
]

HARNESS: Final = "opencode"
SHELL_TOOLS: Final = frozenset({"bash", "shell"})
"""Tools whose ``timeout`` argument is in milliseconds and whose output may carry the marker."""
BASH_DEFAULT_TIMEOUT_MS: Final = 120_000
TIMEOUT_MARKER: Final = re.compile(
    r"terminated command after exceeding timeout|\(Command timed out after \d+ ms\)"
)
MAX_CALLS: Final = 4096
"""Open calls, and ended calls remembered against duplicates, kept per mapper (oldest go)."""

_F: Final = Fields(HARNESS)


@dataclass(slots=True)
class _Call:
    started: bool = False  # a ToolStart was emitted
    evented: bool = False  # the event hook reported it: its end comes from there
    censored: bool = False  # tool.execute.after saw the timeout marker
    start_ms: float | None = None


class OpenCodeMapper:
    """Maps the TAO OpenCode plugin's payloads (module docstring). Keeps open calls, recently
    ended calls and each session's open ``user`` call, each bounded by ``max_calls``."""

    harness: str = HARNESS

    def __init__(self, max_calls: int = MAX_CALLS) -> None:
        self._max = max(1, max_calls)
        self._open: OrderedDict[tuple[str, str], _Call] = OrderedDict()
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._user: OrderedDict[str, str] = OrderedDict()

    def map(self, body: Mapping[str, Any], received_at: float) -> list[Message]:
        """The messages ``body`` implies; :class:`HookPayloadError` names a bad field."""
        if "hook" not in body and "type" in body:
            return self._event(body, received_at, "")
        hook = _F.text(body, "hook")
        ms = _F.opt_number(body, "ts")
        at = received_at if ms is None else ms / 1000.0
        match hook:
            case "tool.execute.before":
                return self._before(body, at)
            case "tool.execute.after":
                return self._after(body, at)
            case "event":
                return self._event(_F.obj(body, "event"), at, "event.")
            case "chat.message":
                sid = _F.session(_F.obj(body, "input"), "sessionID", "input.")
                call = self._user.pop(sid, None)
                if call is None:
                    return []
                return [_end(sid, call, USER_TOOL, at)]
        return []

    # -- tool.execute.before / after ----------------------------------------------------------

    def _before(self, body: Mapping[str, Any], at: float) -> list[Message]:
        sid, call_id, tool = _ids(_F.obj(body, "input"), "input.")
        args = _F.opt_obj(_F.obj(body, "output"), "args", "output.")
        timeout_ms = _timeout_ms(tool, args, "output.args.")
        key = (sid, call_id)
        if key in self._ended:
            return []
        call = self._call(key)
        if call.started:
            return []
        call.started = True
        return [_start(sid, call_id, tool, at, timeout_ms)]

    def _after(self, body: Mapping[str, Any], at: float) -> list[Message]:
        sid, call_id, tool = _ids(_F.obj(body, "input"), "input.")
        out = _F.obj(body, "output")
        censored = _marked(_F.opt_text(out, "output", "output."))
        key = (sid, call_id)
        if key in self._ended:
            return []
        call = self._call(key)
        if call.evented:  # the completed event ends it, with OpenCode's own times
            call.censored = call.censored or censored
            return []
        self._finish(key)
        return [_end(sid, call_id, tool, at, censored=censored)]

    # -- event --------------------------------------------------------------------------------

    def _event(self, event: Mapping[str, Any], at: float, path: str) -> list[Message]:
        kind = _F.text(event, "type", path)
        if kind not in ("message.part.updated", "session.idle", "session.deleted"):
            return []
        props = _F.obj(event, "properties", path)
        path += "properties."
        if kind == "session.idle":
            sid = _F.session(props, "sessionID", path)
            self._forget(sid)
            if sid in self._user:  # already waiting for its user (a repeated idle)
                return []
            call = f"user-{_F.millis(at, 'ts')}"
            self._user[sid] = call
            self._user.move_to_end(sid)
            trim_oldest(self._user, self._max)
            return [_start(sid, call, USER_TOOL, at, None)]
        if kind == "session.deleted":
            sid = _F.session(_F.obj(props, "info", path), "id", path + "info.")
            self._forget(sid)
            self._user.pop(sid, None)
            return [SessionEnd(session_id=sid, ended_at=at, reason=END_CLIENT_CLOSED)]
        part = _F.obj(props, "part", path)
        if part.get("type") != "tool":
            return []
        return self._tool_part(part, path + "part.")

    def _tool_part(self, part: Mapping[str, Any], path: str) -> list[Message]:
        sid, call_id, tool = _ids(part, path)
        state = _F.obj(part, "state", path)
        status = _F.text(state, "status", path + "state.")
        if status not in ("running", "completed", "error"):
            return []  # pending: not executing yet
        time = _F.obj(state, "time", path + "state.")
        start_ms = _F.number(time, "start", path + "state.time.")
        key = (sid, call_id)
        if key in self._ended:
            return []
        call = self._call(key)
        call.evented = True
        if call.start_ms is None:  # an aborted part is re-stamped with start = end
            call.start_ms = start_ms
        if status == "running":
            if call.started:
                return []
            call.started = True
            timeout_ms = _timeout_ms(tool, _F.opt_obj(state, "input", path + "state."), "")
            return [_start(sid, call_id, tool, start_ms / 1000.0, timeout_ms)]
        end_ms = _F.number(time, "end", path + "state.time.")
        text_key = "output" if status == "completed" else "error"
        text = _F.opt_text(state, text_key, path + "state.")
        aborted = status == "error" and text is not None and "aborted" in text.lower()
        censored = call.censored or aborted or _marked(text)
        self._finish(key)
        return [
            _end(
                sid,
                call_id,
                tool,
                end_ms / 1000.0,
                duration_s=max(0.0, end_ms - call.start_ms) / 1000.0,
                ok=status == "completed",
                censored=censored,
            )
        ]

    # -- memory -------------------------------------------------------------------------------

    def _call(self, key: tuple[str, str]) -> _Call:
        call = self._open.get(key)
        if call is None:
            call = self._open[key] = _Call()
            trim_oldest(self._open, self._max)
        return call

    def _finish(self, key: tuple[str, str]) -> None:
        self._open.pop(key, None)
        self._ended[key] = None
        trim_oldest(self._ended, self._max)

    def _forget(self, sid: str) -> None:
        """The session's turn is over: its calls that never ended are dropped."""
        for key in [k for k in self._open if k[0] == sid]:
            del self._open[key]


def _ids(m: Mapping[str, Any], path: str) -> tuple[str, str, str]:
    return _F.session(m, "sessionID", path), _F.text(m, "callID", path), _F.text(m, "tool", path)


def _timeout_ms(tool: str, args: Mapping[str, Any], path: str) -> float | None:
    """The shell tools' timeout in ms (their default when absent); None for other tools."""
    if tool not in SHELL_TOOLS:
        return None
    value = _F.opt_number(args, "timeout", path)
    return BASH_DEFAULT_TIMEOUT_MS if value is None else value


def _marked(text: str | None) -> bool:
    return text is not None and TIMEOUT_MARKER.search(text) is not None


def _start(sid: str, call: str, tool: str, at: float, timeout_ms: float | None) -> ToolStart:
    return ToolStart(
        session_id=sid,
        call_id=call,
        tool=tool,
        started_at=at,
        source=SOURCE_PLUGIN,
        harness=HARNESS,
        timeout_s=None if timeout_ms is None else timeout_ms / 1000.0,
    )


def _end(
    sid: str,
    call: str,
    tool: str,
    at: float,
    *,
    duration_s: float | None = None,
    ok: bool = True,
    censored: bool = False,
) -> ToolEnd:
    return ToolEnd(
        session_id=sid,
        call_id=call,
        ended_at=at,
        tool=tool,
        source=SOURCE_PLUGIN,
        duration_s=duration_s,
        ok=ok,
        censored=censored,
    )
