"""A node that dies: the sessions admitted there and not in a model call are released."""

from __future__ import annotations

import pytest

from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.session import Session, admit, on_request, on_response
from shared.core.tick import apply_decision, decide, live_free, value_snapshot
from shared.core.valuation import NodeView, ValuationParams

PARAMS = ValuationParams(quantum=512, reserve=512, credit_unit=256)


def _waiting(sid: str, tokens: int) -> Session:
    s, _ = on_request(Session(id=sid), f"{sid}-r", 0.0, tokens_estimate=tokens)
    return s


def _admitted(sid: str, node: str, tokens: int, *, tool: bool) -> Session:
    s = admit(_waiting(sid, tokens), node, tokens + 512, 0.0)
    calls = [(f"{sid}-c", "bash")] if tool else None
    return on_response(s, 1.0, total_tokens=tokens, tool_calls=calls)


def _running(sid: str, node: str, tokens: int) -> Session:
    return admit(_waiting(sid, tokens), node, tokens + 512, 0.0)


def nodes(n1_healthy: bool) -> tuple[NodeView, ...]:
    return (
        NodeView(id="n1", capacity_tokens=10_000, reserved=3 * 1512, healthy=n1_healthy),
        NodeView(id="n2", capacity_tokens=10_000, reserved=0),
    )


SESSIONS = [
    _admitted("tool", "n1", 1000, tool=True),
    _admitted("idle", "n1", 1000, tool=False),
    _running("busy", "n1", 1000),  # a model call in flight: its answer (or error) comes first
    _admitted("other", "n2", 1000, tool=False),
]


@pytest.mark.parametrize("policy", ["tao", "tao-paper", "tao-fair", "cache-aware", "rr"])
def test_sessions_on_a_dead_node_are_released(policy: str) -> None:
    snap = value_snapshot(SESSIONS, nodes(False), {}, History(), 2.0, params=PARAMS)
    assert snap.unhealthy == frozenset({"n1"})
    assert sorted(c.id for c in snap.stranded) == ["idle", "tool"]
    d = decide(snap, get_policy(policy))
    assert sorted(m.session for m in d.interrupts) == ["idle", "tool"]
    assert dict(d.released_by) == {"evacuate": 2}
    live = {s.id: s for s in SESSIONS}
    applied = apply_decision(d, live, live_free(nodes(False)), 2.0)
    assert not applied.discarded
    out = applied.sessions
    assert out["tool"].node is None and out["tool"].pooled  # in its tool: back in the pool
    assert out["idle"].node is None and out["idle"].activity == "idle"
    assert "busy" not in out and "other" not in out


def test_a_healthy_node_keeps_its_sessions() -> None:
    snap = value_snapshot(SESSIONS, nodes(True), {}, History(), 2.0, params=PARAMS)
    assert snap.unhealthy == frozenset() and snap.stranded == ()
    assert [c.id for c in snap.interrupts] == ["tool"]  # idle ones are no candidates
    d = decide(snap, get_policy("tao"))
    assert d.interrupts == () and dict(d.released_by) == {}


def test_a_node_gone_from_the_inventory_is_evacuated_too() -> None:
    snap = value_snapshot(SESSIONS[:1], nodes(True)[1:], {}, History(), 2.0, params=PARAMS)
    assert [c.id for c in snap.stranded] == ["tool"]
    assert [m.session for m in decide(snap, get_policy("tao")).interrupts] == ["tool"]
