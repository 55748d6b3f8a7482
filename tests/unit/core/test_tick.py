"""One scheduling round: snapshot values, interrupt rule, plan, and verify-and-apply."""

from __future__ import annotations

from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.session import Session, admit, on_request, on_response, on_tool_end
from shared.core.tick import (
    Decision,
    Move,
    apply_decision,
    decide,
    live_free,
    value_snapshot,
)
from shared.core.valuation import NodeView, ValuationParams

PARAMS = ValuationParams(quantum=512, reserve=512, credit_unit=256)


def _waiting(sid: str, tokens: int, at: float = 0.0) -> Session:
    s, _ = on_request(Session(id=sid), f"{sid}-r", at, tokens_estimate=tokens)
    return s


def _tooling(sid: str, tokens: int, node: str, weight: int, at: float = 0.0) -> Session:
    s = admit(_waiting(sid, tokens, at), node, weight, at)
    return on_response(s, at, total_tokens=tokens, tool_calls=[(f"{sid}-c", "bash")])


NODES = (
    NodeView(id="n1", capacity_tokens=10_000, reserved=0),
    NodeView(id="n2", capacity_tokens=10_000, reserved=0),
)


class TestValueSnapshot:
    """The pool and interrupt candidates are valued with decayed credit and readiness."""

    def test_pool_candidate_values(self) -> None:
        """A waiting session gets weight tokens+reserve, credit where resident, r = 1."""
        s = _waiting("a", 3000)
        snap = value_snapshot(
            [s], NODES, {"a": {"n2": (2048, 0.0)}}, History(), 0.0, tick=7, params=PARAMS
        )
        (c,) = snap.candidates
        assert (c.id, c.weight, c.tokens, c.ready) == ("a", 3512, 3000, 1)
        assert dict(c.credit) == {"n2": 2048} and c.eligible == frozenset({"n1", "n2"})
        assert snap.versions == {"a": s.version} and snap.tick == 7

    def test_unhealthy_and_oversize_nodes_are_ineligible(self) -> None:
        """An unhealthy node and a node too small even when empty are excluded."""
        nodes = (
            NodeView(id="n1", capacity_tokens=10_000, healthy=False),
            NodeView(id="n2", capacity_tokens=2_000),
            NodeView(id="n3", capacity_tokens=10_000, reserved=9_000),
        )
        snap = value_snapshot([_waiting("a", 3000)], nodes, {}, History(), 0.0, params=PARAMS)
        assert snap.candidates[0].eligible == frozenset({"n3"})
        assert [nd.free for nd in snap.nodes] == [0, 2000, 1000]

    def test_admitted_tool_sessions_are_interrupt_candidates(self) -> None:
        """An admitted session in a tool is offered to the interrupt rule with its node credit."""
        s = _tooling("b", 4000, "n1", 4512)
        snap = value_snapshot([s], NODES, {"b": {"n1": (4000, 0.0)}}, History(), 0.0)
        assert snap.candidates == ()
        (ic,) = snap.interrupts
        assert (ic.id, ic.node, ic.weight, ic.credit, ic.ready) == ("b", "n1", 4512, 4096, 0)

    def test_idle_and_running_sessions_are_left_out(self) -> None:
        """Running or idle admitted sessions are neither candidates nor interruptible."""
        run = admit(_waiting("r", 100), "n1", 612, 0.0)
        idle = on_response(run, 1.0, total_tokens=200)
        snap = value_snapshot([run, idle], NODES, {}, History(), 1.0)
        assert snap.candidates == () and snap.interrupts == ()


class TestDecide:
    """The interrupt rule frees room before the policy plans."""

    def test_admits_in_plan_order_with_versions(self) -> None:
        """Each admit carries the weight and the version the snapshot saw."""
        a, b = _waiting("a", 3000), _waiting("b", 1000)
        snap = value_snapshot([a, b], NODES, {"a": {"n1": (3000, 0.0)}}, History(), 0.0)
        d = decide(snap, get_policy("tao"))
        assert {m.session for m in d.admits} == {"a", "b"}
        first = d.admits[0]
        assert (first.session, first.node, first.version) == ("a", "n1", a.version)
        assert d.interrupts == ()

    def test_short_capacity_interrupts_then_admits(self) -> None:
        """When the pool cannot fit, a non-ready tool session is interrupted and its room used."""
        nodes = (NodeView(id="n1", capacity_tokens=10_000, reserved=8_000),)
        holder = _tooling("h", 7488, "n1", 8000)
        new = _waiting("w", 5000)
        snap = value_snapshot([holder, new], nodes, {}, History(), 0.0, params=PARAMS)
        d = decide(
            snap, get_policy("tao-paper")
        )  # the paper's demand step: releases whatever the price
        assert [m.session for m in d.interrupts] == ["h"]
        assert [(m.session, m.node) for m in d.admits] == [("w", "n1")]

    def test_grown_reservations_interrupt_on_their_node(self) -> None:
        """A node whose admitted reservations grew past usable releases tool sessions there,
        even with an empty pool, until the overflow is paid back."""
        nodes = (
            NodeView(id="n1", capacity_tokens=10_000, reserved=12_000),
            NodeView(id="n2", capacity_tokens=10_000, reserved=0),
        )
        big = _tooling("big", 5488, "n1", 6000)
        small = _tooling("small", 2488, "n1", 3000)
        other = _tooling("other", 1488, "n2", 2000)
        snap = value_snapshot([big, small, other], nodes, {}, History(), 0.0, params=PARAMS)
        assert dict(snap.overflow) == {"n1": 2000}
        d = decide(snap, get_policy("tao-paper"))  # the paper's reservation trigger
        assert [m.session for m in d.interrupts] == ["small"]  # lowest (k, r, t) first

    def test_ready_tool_session_is_not_interrupted(self) -> None:
        """A session whose tool has returned keeps its admission."""
        nodes = (NodeView(id="n1", capacity_tokens=10_000, reserved=8_000),)
        holder, _ = on_tool_end(_tooling("h", 7488, "n1", 8000), "h-c", 0.5, source="hook")
        snap = value_snapshot([holder, _waiting("w", 5000)], nodes, {}, History(), 1.0)
        d = decide(snap, get_policy("tao"))
        assert d.interrupts == () and d.admits == ()


class TestApply:
    """Verify-and-apply discards on changed versions and truncates to live capacity."""

    def _decision(self, *admits: Move, interrupts: tuple[Move, ...] = ()) -> Decision:
        snap = value_snapshot([], NODES, {}, History(), 0.0)
        result = decide(snap, get_policy("tao")).result
        return Decision(tick=1, interrupts=interrupts, admits=admits, result=result)

    def test_applies_all_when_unchanged(self) -> None:
        """Unchanged sessions are admitted and their versions bumped."""
        a = _waiting("a", 1000)
        applied = apply_decision(
            self._decision(Move("a", "n1", 1512, a.version)), {"a": a}, {"n1": 5000}, 2.0
        )
        assert not applied.discarded and not applied.truncated
        assert applied.sessions["a"].node == "n1"
        assert applied.sessions["a"].version == a.version + 1

    def test_changed_version_discards_whole_plan(self) -> None:
        """One selected session that moved on discards every move of the plan."""
        a, b = _waiting("a", 1000), _waiting("b", 1000)
        d = self._decision(Move("a", "n1", 1512, a.version), Move("b", "n1", 1512, b.version))
        b2, _ = on_request(b, "again", 1.0)
        applied = apply_decision(d, {"a": a, "b": b2}, {"n1": 5000}, 2.0)
        assert applied.discarded and applied.changed == ("b",) and applied.sessions == {}

    def test_unhealthy_target_discards(self) -> None:
        """An admit to a node that is no longer healthy discards the plan."""
        a = _waiting("a", 1000)
        applied = apply_decision(
            self._decision(Move("a", "n2", 1512, a.version)), {"a": a}, {"n1": 5000}, 2.0
        )
        assert applied.discarded and applied.changed == ("a",)

    def test_shrunk_capacity_applies_prefix(self) -> None:
        """When live room shrank, the longest fitting prefix is applied and marked truncated."""
        s = {k: _waiting(k, 1000) for k in "abc"}
        d = self._decision(*(Move(k, "n1", 1512, s[k].version) for k in "abc"))
        applied = apply_decision(d, s, {"n1": 3100}, 2.0)
        assert [m.session for m in applied.admitted] == ["a", "b"] and applied.truncated
        assert set(applied.sessions) == {"a", "b"}

    def test_interrupt_room_is_used_by_admits(self) -> None:
        """An interrupt applied first frees the room a later admit needs."""
        h = _tooling("h", 3000, "n1", 3512)
        w = _waiting("w", 2000)
        d = self._decision(
            Move("w", "n1", 2512, w.version), interrupts=(Move("h", "n1", 3512, h.version),)
        )
        applied = apply_decision(d, {"h": h, "w": w}, {"n1": 0}, 2.0)
        assert [m.session for m in applied.admitted] == ["w"]
        assert applied.sessions["h"].node is None and applied.sessions["h"].pooled

    def test_live_free_skips_unhealthy(self) -> None:
        """Live room lists healthy nodes only, net of reservations, negative when over."""
        nodes = (
            NodeView(id="a", capacity_tokens=1000, target_utilisation=0.9, reserved=100),
            NodeView(id="b", capacity_tokens=1000, healthy=False),
            NodeView(id="c", capacity_tokens=1000, reserved=1200),
        )
        assert live_free(nodes) == {"a": 800, "c": -200}

    def test_interrupt_on_over_committed_node_pays_overflow_first(self) -> None:
        """Room freed on an over-committed node goes to the overflow before any admit."""
        h = _tooling("h", 3000, "n1", 3512)
        w = _waiting("w", 2000)
        d = self._decision(
            Move("w", "n1", 2512, w.version), interrupts=(Move("h", "n1", 3512, h.version),)
        )
        applied = apply_decision(d, {"h": h, "w": w}, {"n1": -1500}, 2.0)
        assert applied.admitted == () and applied.truncated
        assert [m.session for m in applied.interrupted] == ["h"]
