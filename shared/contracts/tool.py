"""Tool lifecycle messages on ``tao.v1.tool.<session_id>``.

Sources: harness hooks (Claude Code PreToolUse/PostToolUse, OpenHands hooks), harness plugins
(OpenCode ``tool.execute.before/after``), wrappers (mini-swe-agent ``execute``) and the gateway
(a response with ``tool_calls`` starts a tool; the session's next request ends it). Hooks carry no
timestamp, so the receiver stamps ``started_at`` / ``ended_at`` on receipt.

Readiness (DESIGN §3.1) reads these: an observed :class:`ToolEnd` makes the session ready; a
``deadline``, ``timeout_s`` or ``expected_end`` exposed by the tool interface is the first-choice
prediction of when the tool returns; otherwise per-tool history. A call cut by its timeout is
``censored``: a lower bound on the duration, not a sample of it.
"""

from __future__ import annotations

from typing import Final

from .base import Message

__all__ = [
    "SOURCE_GATEWAY",
    "SOURCE_HOOK",
    "SOURCE_PLUGIN",
    "SOURCE_WRAPPER",
    "ToolEnd",
    "ToolEvent",
    "ToolProgress",
    "ToolStart",
]

# Known values of ``source``; a plain string on the wire so new sources need no schema change.
SOURCE_HOOK: Final = "hook"
SOURCE_PLUGIN: Final = "plugin"
SOURCE_WRAPPER: Final = "wrapper"
SOURCE_GATEWAY: Final = "gateway"


class ToolStart(Message, tag="ToolStart", frozen=True, kw_only=True):
    """Session ``session_id`` started tool call ``call_id`` at ``started_at``.

    ``deadline`` is the absolute time by which the tool interface will cut the call;
    ``timeout_s`` the same limit relative to ``started_at`` (Claude Code Bash ``timeout`` is in
    milliseconds on the hook: convert). ``expected_end`` is an explicit prediction from the tool.
    ``background`` means the call was started in the background (``run_in_background``), so the
    session does not wait for it.
    """

    session_id: str
    call_id: str
    tool: str
    started_at: float
    source: str = SOURCE_HOOK
    harness: str | None = None
    deadline: float | None = None
    timeout_s: float | None = None
    expected_end: float | None = None
    background: bool = False


class ToolEnd(Message, tag="ToolEnd", frozen=True, kw_only=True):
    """Tool call ``call_id`` of session ``session_id`` ended at ``ended_at``.

    ``duration_s`` is the duration reported by the source (Claude Code ``duration_ms`` / 1000)
    when it has one. ``ok`` is false for a failed call (PostToolUseFailure). ``censored`` marks a
    call cut by its timeout. ``background`` marks a call that went to the background (Claude
    Code ``backgroundTaskId``): the session is runnable again although the work continues.
    """

    session_id: str
    call_id: str
    ended_at: float
    tool: str | None = None
    source: str = SOURCE_HOOK
    duration_s: float | None = None
    ok: bool = True
    censored: bool = False
    background: bool = False


class ToolProgress(Message, tag="ToolProgress", frozen=True, kw_only=True):
    """A running tool call reported progress at ``ts``.

    ``fraction`` in [0, 1] is the share of work done, when the tool knows it; ``expected_end``
    an updated absolute prediction of its end. Either refreshes the readiness evidence.
    """

    session_id: str
    call_id: str
    ts: float
    source: str = SOURCE_HOOK
    fraction: float | None = None
    expected_end: float | None = None


ToolEvent = ToolStart | ToolEnd | ToolProgress
"""Everything published under ``tao.v1.tool.*``."""
