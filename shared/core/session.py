"""The session record and its pure transitions (DESIGN 2, 3.4; paper §3.1–3.5).

One :class:`Session` per agent task. The live services keep it in Redis (one record per session,
written by the valuation service from the gateway's session events, by the tools service from
tool events, and by the planner's apply step); the offline simulator keeps the same records in
memory and calls the same transitions. Every transition returns a new record with ``version``
incremented, which is what the apply-time signature check compares (DESIGN 3.4).

Activity (what the session is doing now)::

    idle     no request pending and no tool running (between turns, or finished)
    waiting  a model request is pending admission (the gateway holds it)
    running  a model request is being served on ``node``
    tool     the model asked for a tool; the call runs (or has completed, not yet followed by
             the next request — its readiness is then 1)

Admission is orthogonal: ``node`` is set while the session holds a reservation of ``weight``
tokens there. A session is in the *pool* (:attr:`Session.pooled`) when it is not admitted, not
ended, and either waiting or in a tool (an interrupted session rejoins the pool and may be
restarted before its tool ends). An admitted session's requests go to its node at once.

Tool calls have two sources. The gateway infers them: a response with ``tool_calls`` starts one
(``source="gateway"``) and the session's next request ends it. Harness hooks report them
explicitly (``source="hook"`` and others); hook events take precedence over inferred ones for
the same call: a hook start replaces an inferred call, and an inferred end never overrides a
hook end. Only explicit ends carry a trustworthy duration for the statistics; an inferred end
(next request) includes the model's think time after the tool and is not recorded.

Pure: ``at`` is always an argument; no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, TypeVar

import msgspec

from shared.core.predictor import ToolCallView
from shared.core.problem import Phase
from shared.core.rules import RuleSet, growth_reserve

__all__ = [
    "INFERRED",
    "Activity",
    "Session",
    "ToolCall",
    "admit",
    "on_cancel",
    "on_end",
    "on_request",
    "on_response",
    "on_tool_end",
    "on_tool_progress",
    "on_tool_start",
    "release",
    "set_probe_mark",
]

Activity = Literal["idle", "waiting", "running", "tool"]

_R = TypeVar("_R", bound=msgspec.Struct)

INFERRED: Final = "gateway"
"""``source`` of a tool call the gateway inferred from ``tool_calls`` in a response."""


class ToolCall(msgspec.Struct, frozen=True):
    """The session's current tool call; all times are absolute seconds.

    ``deadline`` is when the tool interface cuts the call (start + timeout); ``expected_end`` /
    ``progress`` are reported predictions with the time they were reported (``*_ts``).
    ``completed_at`` is set once the end was observed; ``background`` once the call went to the
    background (the session is runnable again although the work continues).
    """

    call_id: str
    tool: str
    started_at: float
    source: str = INFERRED
    deadline: float | None = None
    expected_end: float | None = None
    expected_end_ts: float | None = None
    progress: float | None = None
    progress_ts: float | None = None
    background: bool = False
    completed_at: float | None = None

    def view(self) -> ToolCallView:
        """What the predictor reads."""
        return ToolCallView(
            tool=self.tool,
            started_at=self.started_at,
            completed_at=self.completed_at,
            background=self.background,
            expected_end=self.expected_end,
            expected_end_ts=self.expected_end_ts,
            progress=self.progress,
            progress_ts=self.progress_ts,
            deadline=self.deadline,
        )

    @property
    def open(self) -> bool:
        """True while the call has neither completed nor gone to the background."""
        return self.completed_at is None and not self.background


class Session(msgspec.Struct, frozen=True):
    """One agent task as the scheduler sees it (module docstring).

    ``waiting_since`` is when the pending request began to wait for admission (read only while
    ``activity == "waiting"``); ``home`` the node that served its last response (kept after a
    release: where its prefix may still be). Neither changes on :func:`admit`, so the store's
    verify-and-apply script, which writes only the admission fields, stays its exact mirror.
    ``last_total`` is the context size of the last response and ``growth_*`` Welford's count,
    mean and sum of squared deviations of the per-turn growth between responses (the growth
    rule's history, :mod:`shared.core.rules`).
    """

    id: str
    version: int = 0
    activity: Activity = "idle"
    node: str | None = None
    weight: int = 0
    tokens: int = 0
    model: str | None = None
    gateway_id: str | None = None
    request_id: str | None = None
    tool: ToolCall | None = None
    probe_mark: float | None = None
    turns: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    ended: bool = False
    waiting_since: float | None = None
    home: str | None = None
    last_total: int = 0
    growth_n: int = 0
    growth_mean: float = 0.0
    growth_m2: float = 0.0
    ended_calls: tuple[str, ...] = ()
    """The last :data:`ENDED_CALLS_KEPT` call ids whose end was recorded (:func:`on_tool_end`),
    so that the same end delivered again after the session moved on records nothing twice."""
    shared: int = 0
    """Tokens at the start of its context that are a prefix other sessions share (a harness's
    system prompt and tool schemas): held once per node, so they are not part of its weight
    (paper App. B.1, ``w_i = tokens − shared + reserve``; :func:`on_request` sets it)."""

    @property
    def admitted(self) -> bool:
        return self.node is not None

    @property
    def pooled(self) -> bool:
        """Wants admission: not admitted, not ended, and waiting or in a tool."""
        return self.node is None and not self.ended and self.activity in ("waiting", "tool")

    @property
    def phase(self) -> Phase:
        """ThunderAgent's class: ``acting`` in a tool, ``new`` before its first response,
        else ``reasoning`` (a model call pending or in flight)."""
        if self.activity == "tool":
            return "acting"
        return "new" if self.turns == 0 else "reasoning"


def _touch(s: Session, at: float, **changes: Any) -> Session:
    """``s`` with ``changes``, one version later, updated at ``at``."""
    changes["version"] = s.version + 1
    changes["updated_at"] = at
    return msgspec.structs.replace(s, **changes)


def _evolve(obj: _R, **changes: Any) -> _R:
    """A :class:`Session` or :class:`ToolCall` with ``changes`` (``msgspec.structs.replace``:
    the copy in C, 0.16 µs a session where ``dataclasses.replace`` took 5.7 µs and a slot copy
    in Python 2.7; the transitions make two or three per tool event)."""
    return msgspec.structs.replace(obj, **changes)


def on_request(
    s: Session,
    request_id: str,
    at: float,
    *,
    model: str | None = None,
    gateway_id: str | None = None,
    tokens_estimate: int = 0,
    shared: int | None = None,
) -> tuple[Session, ToolCall | None]:
    """A model request arrived: ``waiting`` (pooled) or, when admitted, ``running``.

    The request ends the session's open tool call, if any (the inferred end); that call is
    returned completed at ``at`` so the caller can log it. ``tokens_estimate`` raises the token
    count when the prompt grew (the node's usage replaces it on the response). ``shared`` (when
    known) is the prompt's prefix shared with other sessions (:attr:`Session.shared`).
    """
    ended: ToolCall | None = None
    if s.tool is not None and s.tool.open:
        ended = _evolve(s.tool, completed_at=at)
    created = s.created_at if s.version > 0 else at
    waiting = s.node is None
    out = _touch(
        s,
        at,
        activity="running" if not waiting else "waiting",
        waiting_since=(s.waiting_since if s.activity == "waiting" else at) if waiting else None,
        request_id=request_id,
        model=model if model is not None else s.model,
        gateway_id=gateway_id if gateway_id is not None else s.gateway_id,
        tokens=max(s.tokens, tokens_estimate),
        tool=None,
        probe_mark=None,
        created_at=created,
        ended=False,
        shared=s.shared if shared is None else max(0, shared),
    )
    return out, ended


def on_response(
    s: Session,
    at: float,
    *,
    total_tokens: int,
    tool_calls: Sequence[tuple[str, str]] = (),
    reserve: int | None = None,
    rules: RuleSet | None = None,
) -> Session:
    """A model request completed with ``total_tokens`` of context; ``tool_calls`` is a list of
    ``(call_id, tool name)``. With tool calls the session enters ``tool`` (the first call is the
    one tracked), unless a hook already started a call; otherwise it goes ``idle``.

    With ``reserve`` given, an admitted session's reservation follows its grown context:
    ``weight = total_tokens − shared + reserve`` (the weight rule of DESIGN 3.2), so
    the node's reserved total keeps tracking what its sessions will need on their next turn.
    With ``rules`` too, ``reserve`` is only the default of the growth rule
    (:func:`shared.core.rules.growth_reserve` over the session's per-turn growth, this
    response's included)."""
    tool = s.tool
    if tool_calls and (tool is None or tool.source == INFERRED):
        call_id, name = tool_calls[0]
        tool = ToolCall(call_id=call_id, tool=name, started_at=at, source=INFERRED)
    activity: Activity = "tool" if tool is not None else "idle"
    total = max(0, total_tokens)
    n, mean, m2 = s.growth_n, s.growth_mean, s.growth_m2
    if s.turns > 0 and s.last_total > 0:
        g = float(total - s.last_total)
        n += 1
        delta = g - mean
        mean += delta / n
        m2 += delta * (g - mean)
    weight = s.weight
    if reserve is not None and s.node is not None:
        if rules is not None:
            reserve = growth_reserve(n, mean, m2, reserve, rules)
        weight = max(total - s.shared, 0) + reserve
    return _touch(
        s,
        at,
        activity=activity,
        weight=weight,
        tokens=total,
        turns=s.turns + 1,
        request_id=None,
        tool=tool,
        last_total=total,
        home=s.node if s.node is not None else s.home,
        growth_n=n,
        growth_mean=mean,
        growth_m2=m2,
    )


def on_cancel(s: Session, at: float, request_id: str | None = None) -> Session:
    """The request was withdrawn before a node served it (client gone, hold timeout): back to
    ``idle``. A waiting session is always reset; a ``running`` one only when ``request_id``
    names its current request (the planner admitted it just as the client left, so no response
    will ever come for it)."""
    if s.activity == "waiting" or (
        s.activity == "running" and request_id is not None and request_id == s.request_id
    ):
        return _touch(s, at, activity="idle", request_id=None, waiting_since=None)
    return s


def on_tool_start(
    s: Session,
    call_id: str,
    tool: str,
    at: float,
    *,
    source: str,
    deadline: float | None = None,
    expected_end: float | None = None,
    background: bool = False,
) -> Session:
    """A tool call started. A hook start replaces an inferred call (hooks take precedence);
    an inferred start never replaces a hook's call. A start while a request is pending or
    running is recorded but does not change the activity (the harness may report late). A
    start of the current call after that call already ended (a harness's events crossing on
    the way), or of any call whose end was recorded (``ended_calls``: the end of a call the
    session did not track came first), changes nothing: an ended call is never reopened."""
    cur = s.tool
    if source == INFERRED and cur is not None and cur.source != INFERRED and cur.open:
        return s
    if cur is not None and cur.call_id == call_id and not cur.open:
        return s
    if call_id in s.ended_calls:  # its end came first (another stream, a slower hook)
        return s
    started = at
    if cur is not None and cur.call_id == call_id:
        started = min(cur.started_at, at)
    call = ToolCall(
        call_id=call_id,
        tool=tool,
        started_at=started,
        source=source,
        deadline=deadline,
        expected_end=expected_end,
        expected_end_ts=at if expected_end is not None else None,
        background=background,
    )
    activity: Activity = s.activity if s.activity in ("waiting", "running") else "tool"
    return _touch(s, at, tool=call, activity=activity, probe_mark=None)


def on_tool_end(
    s: Session,
    call_id: str,
    at: float,
    *,
    source: str,
    duration_s: float | None = None,
    background: bool = False,
) -> tuple[Session, float | None]:
    """A tool call ended (or went to the background). Returns the new record and the duration
    to record in the statistics: the reported duration, else ``at - started_at`` when this call
    was being tracked; ``None`` for background moves, unknown calls without a duration, and a
    call whose end was recorded already (``ended_calls``: a redelivery after the session moved
    on). Censoring (a call cut by its timeout) is the caller's to decide from the event."""
    cur = s.tool
    if call_id in s.ended_calls:  # its end was recorded already: a repeat
        return s, None
    if cur is None or cur.call_id != call_id:
        if duration_s is None or duration_s < 0:
            return s, None
        return _touch(s, at, ended_calls=_kept(s, call_id)), duration_s  # a late end
    if source == INFERRED and cur.source != INFERRED:
        return s, None
    if background:
        return _touch(s, at, tool=_evolve(cur, background=True)), None
    duration = duration_s if duration_s is not None else max(0.0, at - cur.started_at)
    done = _evolve(cur, completed_at=at)
    return _touch(s, at, tool=done, ended_calls=_kept(s, call_id)), duration


ENDED_CALLS_KEPT: Final = 8


def _kept(s: Session, call_id: str) -> tuple[str, ...]:
    return (*s.ended_calls, call_id)[-ENDED_CALLS_KEPT:]


def on_tool_progress(
    s: Session,
    call_id: str,
    at: float,
    *,
    fraction: float | None = None,
    expected_end: float | None = None,
) -> Session:
    """A running call reported progress or an updated expected end (fresh evidence)."""
    cur = s.tool
    if cur is None or cur.call_id != call_id or not cur.open:
        return s
    call = cur
    if fraction is not None:
        call = _evolve(call, progress=min(max(fraction, 0.0), 1.0), progress_ts=at)
    if expected_end is not None:
        call = _evolve(call, expected_end=expected_end, expected_end_ts=at)
    return _touch(s, at, tool=call)


def on_end(s: Session, at: float) -> Session:
    """The session is over: it leaves its node and the pool."""
    return _touch(
        s,
        at,
        ended=True,
        activity="idle",
        node=None,
        weight=0,
        request_id=None,
        tool=None,
        waiting_since=None,
    )


def admit(s: Session, node: str, weight: int, at: float) -> Session:
    """The planner admitted the session on ``node`` reserving ``weight`` tokens; a waiting
    request now runs there (a tool-running session stays in its tool: an early restart)."""
    activity: Activity = "running" if s.activity == "waiting" else s.activity
    return _touch(s, at, node=node, weight=weight, activity=activity)


def release(s: Session, at: float) -> Session:
    """The session's admission is released (interrupt or revoke); it rejoins the pool if it
    is waiting or in a tool."""
    return _touch(s, at, node=None, weight=0)


def set_probe_mark(s: Session, mark: float | None) -> Session:
    """Persist the readiness probe mark. Not a change of the session's state: the version is
    kept, so spending a probe does not invalidate a plan about the session."""
    return s if s.probe_mark == mark else _evolve(s, probe_mark=mark)
