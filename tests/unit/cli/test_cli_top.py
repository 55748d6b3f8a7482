"""`tao top`: the frame's panes (pure render), why a pooled session waits, the keys."""

from __future__ import annotations

import msgspec
import pytest
from rich.console import Console

from shared.cli.top import Frame, TopView, render, why_waiting
from shared.core.session import Session, ToolCall
from shared.infra.store_types import NodeRecord

NOW = 1_000.0


def node(nid: str, free: int, *, healthy: bool = True, models: frozenset[str] | None = None,
         capacity: int = 10_000) -> NodeRecord:  # fmt: skip
    reserved = capacity - free
    return NodeRecord(id=nid, capacity_tokens=capacity, reserved=reserved, healthy=healthy,
                      models=models, target_utilisation=1.0)  # fmt: skip


def waiting(sid: str, tokens: int, since: float, model: str | None = "m") -> Session:
    return Session(sid, version=1, activity="waiting", tokens=tokens, waiting_since=since,
                   model=model, request_id="r")  # fmt: skip


def text(view: TopView, frame: Frame) -> str:
    console = Console(width=160, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(view, frame))
    return console.export_text()


@pytest.mark.parametrize(
    ("session", "nodes", "why"),
    [
        (waiting("a", 1000, 0), [node("n1", 5000)], "room on n1: waits for the next plan"),
        (waiting("a", 6000, 0), [node("n1", 5000), node("n2", 100)],
         "needs ~6512 tokens; most free is 5000 on n1"),
        (waiting("a", 20_000, 0), [node("n1", 5000)], "more than any node holds"),
        (waiting("a", 10, 0), [node("n1", 5000, healthy=False)], "no node serves m"),
        (waiting("a", 10, 0), [node("n1", 5000, models=frozenset({"x"}))], "no node serves m"),
        (msgspec.structs.replace(waiting("a", 10, 0), activity="tool",
                                 tool=ToolCall("c", "pytest", 1.0)),
         [node("n1", 0)], "in its tool (pytest)"),
    ],
)  # fmt: skip
def test_why_waiting(session: Session, nodes: list[NodeRecord], why: str) -> None:
    assert why in why_waiting(session, nodes)


def frame() -> Frame:
    tool = Session("t1", version=2, activity="tool", node="n2", weight=900, tokens=800,
                   tool=ToolCall("c1", "bash", NOW - 3.0))  # fmt: skip
    return Frame(
        domain="d1",
        now=NOW,
        nodes=[node("n1", 4000), node("n2", 100)],
        sessions=[waiting("old", 100, NOW - 90), waiting("big", 9000, NOW - 5), tool],
        planner={"ticks": 7, "plans_applied": 3, "solve_ms": {"p50": 0.5, "p99": 2.0}},
    )


def test_panes() -> None:
    out = text(TopView(), frame())
    assert "domain d1" in out and "sort: wait" in out and "node: all" in out
    assert "pool: 2 waiting" in out and "in a tool: 1" in out
    assert out.index("old") < out.index("big")  # longest wait first
    assert "1.5 min" in out and "needs ~9512 tokens; most free is 4000 on n1" in out
    assert "bash" in out and "3.0 s" in out  # t1 ran 3 s of the 5 s default prediction
    assert "planner: ticks 7  solve ms p50 0.5 p99 2.0" in out


def test_keys_sort_filter_and_quit() -> None:
    view, f = TopView(), frame()
    assert view.key("s", f) and view.sort == "tokens"
    out = text(view, f)
    assert out.index("big") < out.index("old")
    assert view.key("n", f) and view.node == "n1"
    filtered = text(view, f)
    assert "node: n1" in filtered and "in a tool: 0" in filtered
    assert view.key("n", f) and view.node == "n2" and "in a tool: 1" in text(view, f)
    assert view.key("n", f) and view.node is None
    assert view.key("s", f) and view.key("s", f) and view.sort == "wait"
    assert not view.key("q", f)
