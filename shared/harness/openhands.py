"""OpenHands hook payloads → TAO tool and session messages (pure; see :mod:`.base`).

OpenHands (the software-agent SDK behind its CLI, GUI and Cloud) runs the commands configured
in ``.openhands/hooks.json`` with one JSON object on stdin, ``HookEvent.model_dump_json()``
(``openhands-sdk/openhands/sdk/hooks/types.py`` and ``executor.py``)::

    {"event_type": "PreToolUse" | "PostToolUse" | "UserPromptSubmit" | "Stop"
                   | "SessionStart" | "SessionEnd",
     "tool_name": str | null, "tool_input": object | null,
     "tool_response": object | null,      # PostToolUse: the observation, model_dump()
     "tool_output": str | null,           # older SDKs, instead of tool_response
     "message": str | null, "session_id": str | null, "working_dir": str | null,
     "metadata": object}

``PreToolUse`` runs when the agent emits a tool action, ``PostToolUse`` when its observation
arrives (``hooks/conversation_hooks.py``); neither carries a call id nor a timestamp. The
terminal tool's action has ``timeout`` (seconds, optional: the hard limit after which the call
returns), its observation ``exit_code`` (-1: the soft timeout hit and the process still runs),
``timeout`` (true: cut by the limit) and, like every observation, ``is_error``
(``openhands-tools/openhands/tools/terminal/definition.py``).

Pairing. Starts and ends are paired in order per (session, tool): each ``PreToolUse`` gets a
synthesised call id ``oh-<epoch ms>-<n>`` (the receive time keeps ids unique across restarts of
the tools service) and joins its key's FIFO queue; a ``PostToolUse`` ends the oldest start of
its key, with ``duration_s`` = its receive time − the start's, so the statistics get a sample
even when a later call has replaced it as the session's current one. A ``PostToolUse`` with no
start waiting is held (the last :data:`MAX_HELD` per key): hooks marked ``"async": true`` run
as background processes, so an end can arrive before its start; the next ``PreToolUse`` of
that key pairs with the oldest held end received no earlier than itself (both then map at
once) and drops held ends received before it, which cannot be its end. An end that never
finds its start (a start lost to a restart) thus maps to ``[]``: with no start time and no
duration it could only end the wrong call.

=====================  =====================================================================
PreToolUse             ToolStart(call_id = oh-…; timeout_s = tool_input.timeout, seconds)
PostToolUse            ToolEnd(oldest start of its (session, tool); ok = not is_error;
                       censored = tool_response.timeout or exit_code == -1)
Stop                   ToolStart of the pseudo-tool ``user`` (the human turn, as for Claude
                       Code): the agent finished and waits for its user
UserPromptSubmit       ToolEnd of that ``user`` call
SessionEnd             SessionEnd(reason = "completed")
SessionStart, other    []
=====================  =====================================================================

Limits. A tool action blocked by another hook, or one that fails before executing, gets no
``PostToolUse``: its start waits in the queue and would pair with the next end of the same
tool, so ``Stop``, ``UserPromptSubmit``, ``SessionStart`` and ``SessionEnd`` clear the
session's queues (a turn's calls never outlive it). Fields inside ``tool_input`` and
``tool_response`` are tool-specific: ones of another type than the terminal's are ignored,
not refused. The memory is local: run one tools-service replica per stream.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from shared.contracts.base import Message
from shared.contracts.session import END_COMPLETED, SessionEnd
from shared.contracts.tool import SOURCE_HOOK, ToolEnd, ToolStart

from .claude import USER_TOOL
from .fields import Fields, trim_oldest

__all__ = ["HARNESS", "MAX_HELD", "MAX_KEYS", "OpenHandsMapper"]

HARNESS: Final = "openhands"
MAX_KEYS: Final = 4096
"""(session, tool) queues and sessions' ``user`` calls kept per mapper (the oldest go first)."""
MAX_HELD: Final = 64
"""Starts waiting, and ends held, per (session, tool) key."""

_F: Final = Fields(HARNESS)
_KNOWN: Final = frozenset(
    {"PreToolUse", "PostToolUse", "UserPromptSubmit", "Stop", "SessionStart", "SessionEnd"}
)


@dataclass(frozen=True, slots=True)
class _End:
    at: float
    tool: str
    ok: bool
    censored: bool


class OpenHandsMapper:
    """Maps OpenHands hook payloads (module docstring), pairing starts and ends in order."""

    harness: str = HARNESS

    def __init__(self, max_keys: int = MAX_KEYS, max_held: int = MAX_HELD) -> None:
        self._max_keys = max(1, max_keys)
        self._max_held = max(1, max_held)
        self._starts: OrderedDict[tuple[str, str], deque[tuple[str, float]]] = OrderedDict()
        self._held: OrderedDict[tuple[str, str], deque[_End]] = OrderedDict()
        self._user: OrderedDict[str, str] = OrderedDict()
        self._n = 0

    def map(self, body: Mapping[str, Any], received_at: float) -> list[Message]:
        """The messages ``body`` implies; :class:`HookPayloadError` names a bad field."""
        event = _F.text(body, "event_type")
        if event not in _KNOWN:
            return []
        sid = _F.session(body, "session_id")
        at = received_at
        if event == "PreToolUse":
            return self._pre(body, sid, at)
        if event == "PostToolUse":
            return self._post(body, sid, at)
        self._forget(sid)  # a turn boundary: no call outlives it
        if event == "Stop":
            if sid in self._user:
                return []
            call = f"user-{_F.millis(at, 'received_at')}"
            self._user[sid] = call
            trim_oldest(self._user, self._max_keys)
            return [_start(sid, call, USER_TOOL, at, None)]
        call_or_none = self._user.pop(sid, None)
        if event == "UserPromptSubmit":
            if call_or_none is None:
                return []
            return [_end(sid, call_or_none, _End(at, USER_TOOL, True, False), None)]
        if event == "SessionEnd":
            return [SessionEnd(session_id=sid, ended_at=at, reason=END_COMPLETED)]
        return []  # SessionStart

    def _pre(self, body: Mapping[str, Any], sid: str, at: float) -> list[Message]:
        tool = _F.text(body, "tool_name")
        args = _F.opt_obj(body, "tool_input")
        call = f"oh-{_F.millis(at, 'received_at')}-{self._n}"
        self._n += 1
        start = _start(sid, call, tool, at, _seconds(args.get("timeout")))
        key = (sid, tool)
        held = self._held.get(key)
        while held and held[0].at < at:
            held.popleft()  # ended before this start began: not its end
        if held:
            end = held.popleft()
            return [start, _end(sid, call, end, end.at - at)]
        queue = _queue(self._starts, key, self._max_keys, self._max_held)
        queue.append((call, at))
        return [start]

    def _post(self, body: Mapping[str, Any], sid: str, at: float) -> list[Message]:
        tool = _F.text(body, "tool_name")
        _F.opt_obj(body, "tool_input")
        _F.opt_text(body, "tool_output")
        response = _F.opt_obj(body, "tool_response")
        exit_code = response.get("exit_code")
        censored = response.get("timeout") is True or (
            isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code == -1
        )
        end = _End(at, tool, ok=response.get("is_error") is not True, censored=censored)
        key = (sid, tool)
        queue = self._starts.get(key)
        if not queue:
            _queue(self._held, key, self._max_keys, self._max_held).append(end)
            return []
        call, started = queue.popleft()
        return [_end(sid, call, end, at - started)]

    def _forget(self, sid: str) -> None:
        for table in (self._starts, self._held):
            for key in [k for k in table if k[0] == sid]:
                del table[key]


def _queue(
    table: OrderedDict[tuple[str, str], deque[Any]],
    key: tuple[str, str],
    max_keys: int,
    max_len: int,
) -> deque[Any]:
    queue = table.get(key)
    if queue is None:
        queue = table[key] = deque(maxlen=max_len)
        trim_oldest(table, max_keys)
    table.move_to_end(key)
    return queue


def _seconds(value: object) -> float | None:
    """The terminal's ``timeout`` (seconds) when it is a usable number; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < float("inf") else None


def _start(sid: str, call: str, tool: str, at: float, timeout_s: float | None) -> ToolStart:
    return ToolStart(
        session_id=sid,
        call_id=call,
        tool=tool,
        started_at=at,
        source=SOURCE_HOOK,
        harness=HARNESS,
        timeout_s=timeout_s,
    )


def _end(sid: str, call: str, end: _End, duration_s: float | None) -> ToolEnd:
    return ToolEnd(
        session_id=sid,
        call_id=call,
        ended_at=end.at,
        tool=end.tool,
        source=SOURCE_HOOK,
        duration_s=None if duration_s is None else max(0.0, duration_s),
        ok=end.ok,
        censored=end.censored,
    )
