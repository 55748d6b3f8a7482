"""mini-swe-agent wrapper payloads → TAO tool and session messages (pure; see :mod:`.base`).

mini-swe-agent has no hooks: every command the agent runs goes through its environment's
``execute`` (``minisweagent/environments/*.py``), so :class:`~.miniswe_env.TaoEnvironment`
wraps the environment and reports each call on ``tao.v1.hook.miniswe`` (through the gateway's
``POST /hooks/miniswe`` or straight to NATS). The payloads are TAO's own::

    {"event": "start", "session_id": str, "call_id": str, "tool": "bash",
     "ts": epoch s, "timeout_s": float | null}
    {"event": "end", "session_id": str, "call_id": str, "tool": "bash",
     "ts": epoch s, "duration_s": float, "returncode": int | null,
     "timed_out": bool, "error": str | null, "submitted": bool}

``ts`` and ``duration_s`` are the wrapper's own clock around ``execute`` (the receive time
stands in for a missing ``ts``). ``call_id`` is the model's tool-call id when mini-swe-agent
passes one (v2 actions carry ``tool_call_id``, the id the gateway infers the call under), else
one the wrapper makes. ``timed_out``: the command hit its timeout (v1 environments raise
``subprocess.TimeoutExpired``; v2 ones return ``extra.exception_type``). ``error`` names an
exception that failed the call. ``submitted``: the command was the agent's submission (v2
environments raise ``Submitted`` from ``execute``), which ends the task.

=====  ======================================================================================
start  ToolStart(source = "wrapper", timeout_s)
end    ToolEnd(duration_s, ok = no error and not timed out, censored = timed_out), followed by
       SessionEnd(reason = "completed") when ``submitted``
=====  ======================================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from shared.contracts.base import Message
from shared.contracts.session import END_COMPLETED, SessionEnd
from shared.contracts.tool import SOURCE_WRAPPER, ToolEnd, ToolStart

from .fields import Fields

__all__ = ["HARNESS", "MiniSweMapper"]

HARNESS: Final = "mini-swe-agent"
_F: Final = Fields(HARNESS)


class MiniSweMapper:
    """Maps :mod:`.miniswe_env` payloads (module docstring); keeps no state."""

    harness: str = HARNESS

    def map(self, body: Mapping[str, Any], received_at: float) -> list[Message]:
        """The messages ``body`` implies; :class:`HookPayloadError` names a bad field."""
        event = _F.text(body, "event")
        if event not in ("start", "end"):
            return []
        sid = _F.session(body, "session_id")
        call = _F.text(body, "call_id")
        tool = _F.text(body, "tool")
        ts = _F.opt_number(body, "ts")
        at = received_at if ts is None else ts
        if event == "start":
            timeout_s = _F.opt_number(body, "timeout_s")
            return [
                ToolStart(
                    session_id=sid,
                    call_id=call,
                    tool=tool,
                    started_at=at,
                    source=SOURCE_WRAPPER,
                    harness=HARNESS,
                    timeout_s=timeout_s or None,
                )
            ]
        duration_s = _F.opt_number(body, "duration_s")
        _F.opt_int(body, "returncode")
        timed_out = _F.flag(body, "timed_out")
        error = _F.opt_text(body, "error")
        submitted = _F.flag(body, "submitted")
        out: list[Message] = [
            ToolEnd(
                session_id=sid,
                call_id=call,
                ended_at=at,
                tool=tool,
                source=SOURCE_WRAPPER,
                duration_s=duration_s,
                ok=error is None and not timed_out,
                censored=timed_out,
            )
        ]
        if submitted:
            out.append(SessionEnd(session_id=sid, ended_at=at, reason=END_COMPLETED))
        return out
