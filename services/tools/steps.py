"""Session-record steps of the tools service: one pure ``SessionFn`` per incoming event.

The store calls a step with the stored record (or ``None``) inside its optimistic transaction
and may call it several times, so a step has no side effects beyond overwriting its own
:class:`Outcome` (the last call is the one whose result was written). Every step is idempotent
under JetStream redelivery: a repeated event finds the record already changed and returns
``None`` (no write).

Rules on top of :mod:`shared.core.session` (the transitions themselves are the core's):

* only a :class:`SessionRequest` creates a record; tool events and responses for an unknown or
  ended session change nothing (a late hook after ``SessionEnd`` must not resurrect it into the
  pool);
* a response or cancel applies only to the session's current ``request_id`` (a stale or
  repeated one is ignored);
* a failed response (``error`` set) returns the session to where a response leaves it (below,
  or its hook-started tool) without touching its token count or turn count;
* a response or cancel that leaves an admitted session with no tool (no ``tool_calls``, no
  hook's call) puts it in an inferred call of :data:`AWAITING_CLIENT`, of unknown end, which
  the client's next request ends like any inferred call. Until then the session waits on its
  client, who may be thinking, may have left, or may have been split off by continuation by
  content
  (:mod:`services.gateway.continuation`: a fork or a retry that started a new session): none
  of these should hold room that waiting sessions need, so the planner sees it as any session
  in a tool and prices its release as any other (readiness from the tool history, the
  release's recompute cost), where an admitted ``idle`` session is never released until TAO's
  idle timeout ends it. Once released it is in the pool as any session in a tool; a session
  not admitted holds nothing and stays ``idle``, out of the pool. The call's end is inferred
  (the next request), so it is never recorded in the tool statistics;
* a ``ToolEnd`` of a call already completed records nothing twice;
* a response's ``shared`` prefix (when the handler's registry knows it,
  :mod:`shared.core.sharedprefix`) is recorded before the response re-weighs the session, so
  its weight leaves the prefix out in the same write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import msgspec

from shared.contracts.session import SessionCancel, SessionRequest, SessionResponse
from shared.contracts.tool import ToolEnd, ToolProgress, ToolStart
from shared.core.rules import RuleSet
from shared.core.session import (
    INFERRED,
    Session,
    ToolCall,
    on_cancel,
    on_request,
    on_response,
    on_tool_end,
    on_tool_progress,
    on_tool_start,
)
from shared.infra.store_types import SessionFn

__all__ = [
    "AWAITING_CLIENT",
    "Outcome",
    "cancel_step",
    "request_step",
    "response_step",
    "tool_end_step",
    "tool_progress_step",
    "tool_start_step",
]


AWAITING_CLIENT: Final = "(client)"
"""The tool of a session whose last response asked for none: its client's next request (module
docstring). Parenthesised, as no harness's tool is."""


def _awaiting_client(s: Session, request_id: str, at: float) -> Session:
    """``s`` after a response or cancel: in an inferred call of :data:`AWAITING_CLIENT` when it
    is admitted and was left with no tool (module docstring)."""
    if s.activity != "idle" or s.tool is not None or s.node is None:
        return s
    return on_tool_start(s, f"{request_id}:client", AWAITING_CLIENT, at, source=INFERRED)


@dataclass(slots=True)
class Outcome:
    """What the last call of a step decided, for the handler's log line and follow-ups.

    ``skipped`` names why nothing was written; ``ended_call`` is the open tool call a request
    ended (the inferred end); ``duration`` / ``tool`` what a tool end has to record;
    ``shared_changed`` whether a response changed the session's shared prefix.
    """

    skipped: str | None = None
    ended_call: ToolCall | None = None
    duration: float | None = None
    tool: str | None = None
    shared_changed: bool = False


def request_step(ev: SessionRequest, out: Outcome) -> SessionFn:
    """Register a model request; creates the record for a new session."""

    def step(s: Session | None) -> Session | None:
        out.skipped, out.ended_call = None, None
        if s is None:
            s = Session(id=ev.session_id)
        elif s.request_id == ev.request_id and s.activity in ("waiting", "running"):
            out.skipped = "duplicate"
            return None
        new, ended = on_request(
            s,
            ev.request_id,
            ev.arrived_at,
            model=ev.model,
            gateway_id=ev.gateway_id,
            tokens_estimate=ev.prompt_tokens_estimate,
        )
        out.ended_call = ended
        return new

    return step


def _live(s: Session | None, out: Outcome) -> Session | None:
    if s is None or s.ended:
        out.skipped = "unknown session" if s is None else "ended"
        return None
    out.skipped = None
    return s


def _current(s: Session | None, request_id: str, out: Outcome) -> Session | None:
    cur = _live(s, out)
    if cur is not None and cur.request_id != request_id:
        out.skipped = "stale request"
        return None
    return cur


def response_step(
    ev: SessionResponse,
    out: Outcome,
    reserve: int | None = None,
    rules: RuleSet | None = None,
    shared: int | None = None,
) -> SessionFn:
    """A request completed: tokens from usage, tool calls start an inferred tool (none: the
    wait for the client, :data:`AWAITING_CLIENT`); with
    ``reserve`` an admitted session's weight follows its grown context (tokens − shared +
    reserve; with ``rules`` the growth rule's reserve, ``reserve`` its default). ``shared``:
    the prompt's prefix other live sessions share (``None``: unknown, the record's is kept)."""

    def step(s: Session | None) -> Session | None:
        out.shared_changed = False
        cur = _current(s, ev.request_id, out)
        if cur is None:
            return None
        if ev.error is not None:
            back = on_response(cur, ev.finished_at, total_tokens=cur.tokens)
            back = msgspec.structs.replace(back, turns=cur.turns)
            return _awaiting_client(back, ev.request_id, ev.finished_at)
        if shared is not None and shared != cur.shared:
            cur = msgspec.structs.replace(cur, shared=max(0, shared))
            out.shared_changed = True
        u = ev.usage
        total = u.total_tokens or (u.prompt_tokens + u.completion_tokens)
        answered = on_response(
            cur,
            ev.finished_at,
            total_tokens=total if total > 0 else cur.tokens,
            tool_calls=[(tc.id, tc.name) for tc in ev.tool_calls],
            reserve=reserve,
            rules=rules,
        )
        return _awaiting_client(answered, ev.request_id, ev.finished_at)

    return step


def cancel_step(ev: SessionCancel, out: Outcome) -> SessionFn:
    """The request was withdrawn before a node served it (also just after its admission: the
    core then idles the running session, as no response will come)."""

    def step(s: Session | None) -> Session | None:
        cur = _current(s, ev.request_id, out)
        if cur is None:
            return None
        back = on_cancel(cur, ev.cancelled_at, ev.request_id)
        return back if back is cur else _awaiting_client(back, ev.request_id, ev.cancelled_at)

    return step


def tool_start_step(ev: ToolStart, out: Outcome) -> SessionFn:
    """A tool call started (hook starts supersede inferred ones: the core decides)."""
    deadline = ev.deadline
    if deadline is None and ev.timeout_s is not None:
        deadline = ev.started_at + ev.timeout_s

    def step(s: Session | None) -> Session | None:
        cur = _live(s, out)
        if cur is None:
            return None
        return on_tool_start(
            cur,
            ev.call_id,
            ev.tool,
            ev.started_at,
            source=ev.source,
            deadline=deadline,
            expected_end=ev.expected_end,
            background=ev.background,
        )

    return step


def tool_end_step(ev: ToolEnd, out: Outcome) -> SessionFn:
    """A tool call ended; the duration to record (if any) lands in ``out``."""

    def step(s: Session | None) -> Session | None:
        out.duration, out.tool = None, ev.tool
        if s is not None and not s.ended:
            call = s.tool
            if call is not None and call.call_id == ev.call_id:
                out.tool = ev.tool or call.tool
                if call.completed_at is not None:
                    out.skipped = "duplicate"
                    return None
            new, duration = on_tool_end(
                s,
                ev.call_id,
                ev.ended_at,
                source=ev.source,
                duration_s=ev.duration_s,
                background=ev.background,
            )
            out.skipped = None
            out.duration = duration
            return new
        out.skipped = "unknown session" if s is None else "ended"
        if ev.duration_s is not None and ev.duration_s >= 0 and not ev.background:
            out.duration = ev.duration_s
        return None

    return step


def tool_progress_step(ev: ToolProgress, out: Outcome) -> SessionFn:
    """A running tool call reported progress or a new expected end."""

    def step(s: Session | None) -> Session | None:
        cur = _live(s, out)
        if cur is None:
            return None
        return on_tool_progress(
            cur, ev.call_id, ev.ts, fraction=ev.fraction, expected_end=ev.expected_end
        )

    return step
