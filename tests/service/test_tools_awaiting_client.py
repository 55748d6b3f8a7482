"""A session whose client left, or was split off, never holds room that others wait for.

The tools service's steps (services.tools.steps) put an admitted session answered with no
tool call in an inferred call of unknown end, ``(client)``; the planner then sees it as any
session in a tool and may release it for a waiting session, where an admitted ``idle``
session was never released until the idle timeout.
"""

from __future__ import annotations

from services.tools.steps import AWAITING_CLIENT, Outcome, request_step, response_step
from shared.contracts import SessionRequest, SessionResponse, ToolCallInfo, Usage
from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.session import Session, admit, set_probe_mark
from shared.core.tick import decide, value_snapshot
from shared.core.valuation import NodeView, ValuationParams

PARAMS = ValuationParams(quantum=512, reserve=512, credit_unit=256)
NODE = (NodeView(id="n1", capacity_tokens=10_000, reserved=8_000),)


def _served(sid: str, calls: int, at: float = 0.0) -> Session:
    """An admitted session of 7,488 tokens whose request was answered with ``calls`` calls."""
    out = Outcome()
    req = SessionRequest(session_id=sid, request_id="r1", model="m", arrived_at=at, gateway_id="gw")
    s = request_step(req, out)(None)
    assert s is not None
    s = admit(s, "n1", 8000, at)
    resp = SessionResponse(
        session_id=sid,
        request_id="r1",
        node_id="n1",
        gateway_id="gw",
        finished_at=at + 1,
        usage=Usage(prompt_tokens=7000, completion_tokens=488, total_tokens=7488),
        tool_calls=[ToolCallInfo(id=f"c{i}", name="bash") for i in range(calls)],
    )
    answered = response_step(resp, out)(s)
    assert answered is not None
    return answered


def _waiting(sid: str, at: float) -> Session:
    req = SessionRequest(
        session_id=sid,
        request_id="w1",
        model="m",
        arrived_at=at,
        gateway_id="gw",
        prompt_tokens_estimate=5000,
    )
    s = request_step(req, Outcome())(None)
    assert s is not None
    return s


class TestAwaitingClient:
    """An answer without tool calls leaves an admitted session releasable."""

    def test_answered_session_is_in_the_clients_call(self) -> None:
        s = _served("gone", calls=0)
        assert s.activity == "tool" and s.tool is not None and s.tool.tool == AWAITING_CLIENT
        assert s.node == "n1"

    def test_its_room_goes_to_a_waiting_session(self) -> None:
        """A split-off or abandoned session holds the node's room; a new session waits. The
        planner (the default tao rules) releases the abandoned one and admits the waiting one."""
        gone = _served("gone", calls=0)
        new = _waiting("new", 60.0)
        # Past its predicted end (no history: the default duration) its readiness is probed
        # once, as any tool's; the next round prices its release.
        first = value_snapshot([gone, new], NODE, {}, History(), 60.0, params=PARAMS)
        gone = set_probe_mark(gone, first.probe_marks["gone"])
        snap = value_snapshot([gone, new], NODE, {}, History(), 61.0, params=PARAMS)
        assert [ic.id for ic in snap.interrupts] == ["gone"]
        d = decide(snap, get_policy("tao"))
        assert [m.session for m in d.interrupts] == ["gone"]
        assert [(m.session, m.node) for m in d.admits] == [("new", "n1")]

    def test_a_session_not_admitted_stays_idle(self) -> None:
        """Nothing is held, so nothing changes: it stays idle and out of the pool."""
        out = Outcome()
        req = SessionRequest(
            session_id="s", request_id="r1", model="m", arrived_at=0.0, gateway_id="gw"
        )
        s = request_step(req, out)(None)
        assert s is not None
        resp = SessionResponse(
            session_id="s", request_id="r1", node_id="n1", gateway_id="gw", finished_at=1.0
        )
        answered = response_step(resp, out)(s)
        assert answered is not None and answered.activity == "idle" and not answered.pooled
