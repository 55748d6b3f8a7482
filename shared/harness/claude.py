"""Claude Code hook payloads → TAO tool and session messages (pure; see :mod:`.base`).

Claude Code runs a command hook with one JSON object on stdin (an ``http`` hook gets the same
object as the POST body). Fields read here, as documented in the hooks reference
(https://code.claude.com/docs/en/hooks, formerly docs.anthropic.com/en/docs/claude-code/hooks):

* every event: ``session_id``, ``hook_event_name`` (plus ``transcript_path``, ``cwd``,
  ``permission_mode``, ignored);
* ``PreToolUse``: ``tool_name``, ``tool_input``, ``tool_use_id``;
* ``PostToolUse``: the same plus ``tool_response``; ``PostToolUseFailure``: the same plus
  ``error`` and the optional ``is_interrupt``;
* ``duration_ms`` on ``PostToolUse`` / ``PostToolUseFailure`` since Claude Code 2.1.119: the
  tool's execution wall time, without permission prompts and PreToolUse hooks
  (anthropics/claude-code issues #52047 and #52607); absent on older versions, where the tools
  service measures end − start instead;
* ``Stop`` (``stop_hook_active``), ``UserPromptSubmit`` (``prompt``), ``SessionStart``
  (``source``), ``SessionEnd`` (``reason``);
* ``agent_id`` (and ``agent_type``) on the events of a sub-agent (the ``Agent`` tool): its
  payloads carry the parent's ``session_id``; its model requests the same
  ``X-Claude-Code-Session-Id`` plus ``x-claude-code-agent-id: <agent_id>`` (Claude Code
  2.1.197, captured by tests/harness).

Tool inputs and responses (Claude Code's own tool schemas):

* ``Bash``: reported as ``Bash:test`` when ``tool_input.command`` runs tests or a build
  (:mod:`.commands`: its calls last far longer than the rest, so the predictor keeps their
  history apart), else ``Bash``; ``tool_input.timeout`` in milliseconds, 120000 (2 min) when
  absent (the default kill of anthropics/claude-code #90725), and ``run_in_background``. A
  foreground command that reaches its timeout is either moved to the background or killed
  (anthropics/claude-code #79879, #87439): the first ends with a ``PostToolUse`` whose
  ``tool_response`` has ``backgroundTaskId`` (and ``timedOutAfterMs``), the second fails with
  an ``error`` such as
  "Command timed out after 2m 0s". ``run_in_background`` commands answer at once with a
  ``backgroundTaskId``.
* ``Monitor`` (Claude Code 2.1.98+): ``tool_input.timeout_ms``, 300000 when absent and capped
  at 1800000 (``MonitorInput`` in the bundled ``sdk-tools.d.ts``, anthropics/claude-code
  #94393); its response carries the watcher's ``taskId`` and ``timeoutMs``. The call returns
  once the watcher is armed and the watcher runs on in the background.

Mapping:

=====================  ===========================================================
PreToolUse             ToolStart(call_id=tool_use_id; Bash/Monitor timeout → timeout_s and
                       deadline = received_at + timeout; Bash run_in_background → background)
PostToolUse            ToolEnd(duration_s = duration_ms / 1000; background when the command
                       went to the background or the tool is Monitor; censored when it was
                       cut by its timeout or interrupted)
PostToolUseFailure     ToolEnd(ok=False; censored for an interrupt or a timeout kill)
Stop                   ToolStart of the pseudo-tool ``user`` (see below)
UserPromptSubmit       ToolEnd of that pseudo-tool call
SessionEnd             SessionEnd(reason="completed")
anything else          [] (SessionStart included: nothing in it that TAO needs)
=====================  ===========================================================

Sub-agents. A sub-agent runs while its parent waits in the ``Agent`` call, so it is a session
of its own, :func:`sub_agent_session` (``<session_id>-agent-<agent_id>``), which the gateway
gives its requests too (``services.gateway.requests``, with the parent as
``SessionRequest.parent_session_id``): the parent's ``Agent`` call stays open while the
sub-agent's turns and tool calls run. The ``PostToolUse`` of a foreground ``Agent`` call
(``tool_response.status`` ``completed``, its ``agentId``) also ends the sub-agent's session.

The human turn. ``Stop`` means the agent finished its answer and waits for its user; the next
``UserPromptSubmit`` is the user answering. TAO models that wait as a tool call of the
pseudo-tool ``user`` (:data:`USER_TOOL`): readiness then predicts the session's return from
the history of human turns, as for any tool, instead of treating the session as ready at once.
Hook payloads carry no turn id, so the call id is made from the ``Stop``'s receive time
(``user-<epoch ms>``; stable under redelivery) and remembered per session until the session
ends, for the ``UserPromptSubmit`` that closes it; a prompt with no ``Stop`` before it (the
first one, or after a tools-service restart) maps to nothing, and the session's next model
request then ends the call as an inferred end. Several tools-service replicas would split this
memory: run one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from shared.contracts.base import Message
from shared.contracts.session import END_COMPLETED, SessionEnd
from shared.contracts.tool import SOURCE_HOOK, ToolEnd, ToolStart

from .commands import shell_tool_key
from .fields import Fields, trim_oldest

__all__ = [
    "BASH_DEFAULT_TIMEOUT_MS",
    "HARNESS",
    "MONITOR_DEFAULT_TIMEOUT_MS",
    "MONITOR_MAX_TIMEOUT_MS",
    "SUB_AGENT_INFIX",
    "USER_TOOL",
    "ClaudeMapper",
    "sub_agent_session",
]

HARNESS: Final = "claude-code"
USER_TOOL: Final = "user"
"""The pseudo-tool of a human turn (``Stop`` → ``UserPromptSubmit``)."""

BASH_DEFAULT_TIMEOUT_MS: Final = 120_000
MONITOR_DEFAULT_TIMEOUT_MS: Final = 300_000
MONITOR_MAX_TIMEOUT_MS: Final = 1_800_000
_TIMEOUT_KILL_TEXT: Final = "timed out after"
SUB_AGENT_INFIX: Final = "-agent-"
_MAX_SESSIONS: Final = 4096
_MAX_ENDED: Final = 16_384


def sub_agent_session(session_id: str, agent_id: str) -> str:
    """The TAO session of Claude Code sub-agent ``agent_id`` of session ``session_id``."""
    return f"{session_id}{SUB_AGENT_INFIX}{agent_id}"


class ClaudeMapper:
    """Maps Claude Code hook payloads (module docstring); remembers each session's open
    ``user`` call, for at most ``max_sessions`` sessions (the oldest is forgotten first).

    Tool hooks are installed ``async``, so each runs as its own background process and a fast
    tool's ``PostToolUse`` can reach TAO before its ``PreToolUse``. The mapper remembers the
    last ``max_ended`` ended ``tool_use_id`` values and maps a ``PreToolUse`` arriving after its
    own end to nothing, so a call that already ended is never reopened.
    """

    harness: str = HARNESS

    def __init__(self, max_sessions: int = _MAX_SESSIONS, max_ended: int = _MAX_ENDED) -> None:
        self._user_calls: OrderedDict[str, str] = OrderedDict()
        self._max_sessions = max(1, max_sessions)
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._max_ended = max(1, max_ended)

    def map(self, body: Mapping[str, Any], received_at: float) -> list[Message]:
        """The messages ``body`` implies; :class:`HookPayloadError` names a bad field."""
        event = _F.text(body, "hook_event_name")
        if event not in _KNOWN:
            return []
        sid = _F.session(body, "session_id")
        agent = _F.opt_text(body, "agent_id")
        if agent:
            sid = sub_agent_session(sid, agent)
            _F.session({"session_id": sid}, "session_id")  # still fits a subject token
        match event:
            case "PreToolUse":
                start = self._tool_start(body, sid, received_at)
                return [] if (sid, start.call_id) in self._ended else [start]
            case "PostToolUse" | "PostToolUseFailure":
                end = _tool_end(body, sid, received_at, ok=event == "PostToolUse")
                self._ended[(sid, end.call_id)] = None
                trim_oldest(self._ended, self._max_ended)
                done = _finished_agent(body, sid) if event == "PostToolUse" else None
                if done is None:
                    return [end]
                return [
                    end,
                    SessionEnd(session_id=done, ended_at=received_at, reason=END_COMPLETED),
                ]
            case "Stop":
                call = f"user-{_F.millis(received_at, 'received_at')}"
                self._remember(sid, call)
                return [_start(sid, call, USER_TOOL, received_at)]
            case "UserPromptSubmit":
                user_call = self._user_calls.get(sid)
                if user_call is None:
                    return []
                return [
                    ToolEnd(session_id=sid, call_id=user_call, ended_at=received_at, tool=USER_TOOL)
                ]
            case "SessionEnd":
                self._user_calls.pop(sid, None)
                return [SessionEnd(session_id=sid, ended_at=received_at, reason=END_COMPLETED)]
        return []  # SessionStart

    def _tool_start(self, body: Mapping[str, Any], sid: str, at: float) -> ToolStart:
        tool = _F.text(body, "tool_name")
        call = _F.text(body, "tool_use_id")
        args = _F.opt_obj(body, "tool_input")
        timeout_ms: float | None = None
        background = False
        if tool == "Bash":
            background = _F.flag(args, "run_in_background", "tool_input.")
            timeout_ms = _ms(args, "timeout", "tool_input.")
            timeout_ms = BASH_DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
        elif tool == "Monitor":
            timeout_ms = _ms(args, "timeout_ms", "tool_input.")
            timeout_ms = MONITOR_DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
            timeout_ms = min(timeout_ms, MONITOR_MAX_TIMEOUT_MS)
        if background:  # answers at once; its timeout bounds the background work, not the call
            timeout_ms = None
        key = _history_key(tool, args)
        return _start(sid, call, key, at, timeout_ms=timeout_ms, background=background)

    def _remember(self, sid: str, call: str) -> None:
        self._user_calls[sid] = call
        self._user_calls.move_to_end(sid)
        trim_oldest(self._user_calls, self._max_sessions)


_KNOWN: Final = frozenset(
    {
        "PreToolUse",
        "PostToolUse",
        "PostToolUseFailure",
        "Stop",
        "UserPromptSubmit",
        "SessionStart",
        "SessionEnd",
    }
)


def _start(
    sid: str,
    call: str,
    tool: str,
    at: float,
    *,
    timeout_ms: float | None = None,
    background: bool = False,
) -> ToolStart:
    timeout_s = None if timeout_ms is None else timeout_ms / 1000.0
    return ToolStart(
        session_id=sid,
        call_id=call,
        tool=tool,
        started_at=at,
        source=SOURCE_HOOK,
        harness=HARNESS,
        deadline=None if timeout_s is None else at + timeout_s,
        timeout_s=timeout_s,
        background=background,
    )


def _tool_end(body: Mapping[str, Any], sid: str, at: float, *, ok: bool) -> ToolEnd:
    tool = _F.text(body, "tool_name")
    call = _F.text(body, "tool_use_id")
    args = _F.opt_obj(body, "tool_input")
    duration_ms = _ms(body, "duration_ms")
    background = censored = False
    if ok:
        raw = body.get("tool_response")
        response: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        task = response.get("backgroundTaskId")
        if task is not None and not isinstance(task, str):
            raise _F.bad("tool_response.backgroundTaskId", "a string", task)
        background = bool(task) or tool == "Monitor"
        background = background or _F.flag(args, "run_in_background", "tool_input.")
        censored = _ms(response, "timedOutAfterMs", "tool_response.") is not None
        censored = censored or _F.flag(response, "interrupted", "tool_response.")
    else:
        error = body.get("error")
        if error is not None and not isinstance(error, str):
            raise _F.bad("error", "a string", error)
        censored = _F.flag(body, "is_interrupt") or _TIMEOUT_KILL_TEXT in (error or "").lower()
    return ToolEnd(
        session_id=sid,
        call_id=call,
        ended_at=at,
        tool=_history_key(tool, args),
        source=SOURCE_HOOK,
        duration_s=None if duration_ms is None else duration_ms / 1000.0,
        ok=ok,
        censored=censored,
        background=background,
    )


def _history_key(tool: str, args: Mapping[str, Any] | None) -> str:
    """The tool name reported (and the predictor's history key): ``Bash:test`` for a Bash
    command that runs tests or a build (:mod:`.commands`), else the tool's own name."""
    if tool != "Bash" or args is None:
        return tool
    return shell_tool_key(tool, args.get("command"))


def _finished_agent(body: Mapping[str, Any], sid: str) -> str | None:
    """The sub-agent session a finished foreground ``Agent`` call ran, else ``None``."""
    if body.get("tool_name") != "Agent":
        return None
    raw = body.get("tool_response")
    response: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    agent = _F.opt_text(response, "agentId", "tool_response.")
    if not agent or response.get("status") != "completed":
        return None
    return sub_agent_session(sid, agent)


_F: Final = Fields(HARNESS)


def _ms(m: Mapping[str, Any], key: str, prefix: str = "") -> float | None:
    """An optional non-negative, finite number of milliseconds (absent or null: None)."""
    return _F.opt_number(m, key, prefix, expected="a number of milliseconds")
