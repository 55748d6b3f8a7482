"""The verify-and-apply step's eligibility check (DESIGN 3.4): an admit carries its candidate's
eligibility digest, and the plan is discarded when the session's live eligible set differs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.problem import ZERO, PlanResult
from shared.core.session import Session, on_request
from shared.core.signature import eligibility_digest
from shared.core.tick import (
    Decision,
    Move,
    apply_decision,
    decide,
    live_digest,
    live_eligible,
    live_free,
    value_snapshot,
)
from shared.core.valuation import NodeView, ValuationParams

PARAMS = ValuationParams(quantum=512, reserve=512, credit_unit=256)
_RESULT = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")

NODES = (
    NodeView(id="n1", capacity_tokens=10_000, models=frozenset({"m"})),
    NodeView(id="n2", capacity_tokens=10_000, models=frozenset({"m", "x"})),
    NodeView(id="n3", capacity_tokens=10_000, models=frozenset({"x"})),
    NodeView(id="n4", capacity_tokens=10_000, healthy=False, models=frozenset({"m"})),
)
"""Live at valuation: a session of model ``m`` may go to n1 and n2 (n3 serves only ``x``, n4
is unhealthy)."""


def _waiting(sid: str, tokens: int, model: str | None = "m") -> Session:
    s, _ = on_request(Session(id=sid), f"{sid}-r", 0.0, tokens_estimate=tokens, model=model)
    return s


def _node(nid: str, **change: object) -> tuple[NodeView, ...]:
    """:data:`NODES` with node ``nid`` changed (a new one appended when not there)."""
    if all(nv.id != nid for nv in NODES):
        return (*NODES, NodeView(id=nid, **change))  # type: ignore[arg-type]
    return tuple(replace(nv, **change) if nv.id == nid else nv for nv in NODES)  # type: ignore[arg-type]


def _apply(move: Move, s: Session, nodes: tuple[NodeView, ...]) -> tuple[bool, tuple[str, ...]]:
    d = Decision(tick=1, interrupts=(), admits=(move,), result=_RESULT)
    applied = apply_decision(d, {s.id: s}, live_free(nodes), 2.0, nodes=nodes)
    return applied.discarded, applied.changed


class TestLiveEligible:
    def test_the_valuation_rule(self) -> None:
        """Healthy, serving the model (None: any on either side), usable holds the weight."""
        assert live_eligible(NODES, "m", 3512) == {"n1", "n2"}
        assert live_eligible(NODES, None, 3512) == {"n1", "n2", "n3"}
        assert live_eligible(NODES, "m", 10_001) == frozenset()
        anyone = (NodeView(id="a", capacity_tokens=4000, target_utilisation=0.5),)
        assert live_eligible(anyone, "m", 2000) == {"a"}
        assert live_eligible(anyone, "m", 2001) == frozenset()
        assert live_digest(NODES, "m", 3512) == eligibility_digest(["n2", "n1"])

    def test_matches_the_snapshot(self) -> None:
        """The candidate's digest is the live digest while nothing changed."""
        s = _waiting("a", 3000)
        (c,) = value_snapshot([s], NODES, {}, History(), 0.0, params=PARAMS).candidates
        assert c.eligible == live_eligible(NODES, s.model, c.weight)
        assert c.digest == live_digest(NODES, s.model, c.weight)


# (what changed in flight, live nodes at apply, discarded)
CASES: list[tuple[str, tuple[NodeView, ...], bool]] = [
    ("nothing", NODES, False),
    ("another eligible node went unhealthy", _node("n2", healthy=False), True),
    ("another eligible node stopped serving the model", _node("n2", models=frozenset({"x"})), True),
    ("an eligible node's usable capacity fell below the weight",
     _node("n2", capacity_tokens=3000), True),
    ("an eligible node's usable capacity fell, the weight still fits",
     _node("n2", capacity_tokens=4000), False),
    ("an eligible node filled up (reserved: not eligibility)", _node("n2", reserved=9000), False),
    ("an ineligible node came back healthy", _node("n4", healthy=True), True),
    ("an ineligible node started serving the model", _node("n3", models=None), True),
    ("a node of another model changed its models", _node("n3", models=frozenset({"y"})), False),
    ("an ineligible node went unhealthy", _node("n3", healthy=False), False),
    ("a node serving the model joined", _node("n5", capacity_tokens=10_000), True),
    ("a node too small for the weight joined", _node("n5", capacity_tokens=3000), False),
]  # fmt: skip


class TestApplyChecksEligibility:
    @pytest.mark.parametrize(("what", "nodes", "discarded"), CASES, ids=[c[0] for c in CASES])
    def test_table(self, what: str, nodes: tuple[NodeView, ...], discarded: bool) -> None:
        """An admit to n1 planned on :data:`NODES`: discarded, naming the session, exactly when
        the session's eligible set moved in flight."""
        s = _waiting("a", 3000)
        move = Move("a", "n1", 3512, s.version, live_digest(NODES, "m", 3512))
        assert _apply(move, s, nodes) == (discarded, ("a",) if discarded else ())

    def test_no_digest_or_no_nodes_is_not_checked(self) -> None:
        """An admit without a digest (ThunderAgent's resumes), or an apply that sees no node
        views, checks versions and target nodes only."""
        s = _waiting("a", 3000)
        moved = _node("n2", healthy=False)
        assert _apply(Move("a", "n1", 3512, s.version), s, moved) == (False, ())
        d = Decision(1, (), (Move("a", "n1", 3512, s.version, "0" * 16),), _RESULT)
        assert not apply_decision(d, {"a": s}, live_free(moved), 2.0).discarded

    def test_the_whole_plan_is_discarded_and_changed_is_ordered(self) -> None:
        """One stale digest discards every admit; ``changed`` lists version changes first,
        then admits to a dead node, then eligibility changes, each once."""
        a, b, c = (_waiting(sid, 3000) for sid in "abc")
        m = _waiting("m", 100)
        ok = live_digest(NODES, "m", 3512)
        stale = eligibility_digest(["n1"])
        admits = (
            Move("a", "n1", 3512, a.version, stale),
            Move("b", "n4", 3512, b.version, ok),
            Move("c", "n1", 3512, c.version + 1, stale),
            Move("m", "n2", 612, m.version, live_digest(NODES, "m", 612)),
        )
        d = Decision(1, (), admits, _RESULT)
        live = {s.id: s for s in (a, b, c, m)}
        got = apply_decision(d, live, live_free(NODES), 2.0, nodes=NODES)
        assert got.discarded and got.changed == ("c", "b", "a") and not got.sessions

    def test_per_session_model(self) -> None:
        """Each admit is checked against its own session's model: n3 serving ``m`` changes the
        set of ``m`` sessions only."""
        m, x = _waiting("m", 3000), _waiting("x", 3000, model="x")
        d = Decision(
            1,
            (),
            (
                Move("m", "n1", 3512, m.version, live_digest(NODES, "m", 3512)),
                Move("x", "n3", 3512, x.version, live_digest(NODES, "x", 3512)),
            ),
            _RESULT,
        )
        live = {"m": m, "x": x}
        moved = _node("n3", models=frozenset({"x", "m"}))
        got = apply_decision(d, live, live_free(moved), 2.0, nodes=moved)
        assert got.discarded and got.changed == ("m",)
        assert not apply_decision(d, live, live_free(NODES), 2.0, nodes=NODES).discarded


class TestDecideCarriesDigests:
    def test_admits_carry_the_candidates_digests(self) -> None:
        """decide's admits carry their candidates' digests; the same round applies on the
        nodes it was valued on and is discarded once an eligible node died in flight."""
        a, b = _waiting("a", 3000), _waiting("b", 1000)
        snap = value_snapshot([a, b], NODES, {}, History(), 0.0, params=PARAMS)
        d = decide(snap, get_policy("tao"))
        digests = {c.id: c.digest for c in snap.candidates}
        assert {m.session for m in d.admits} == {"a", "b"}
        assert all(m.digest == digests[m.session] != "" for m in d.admits)
        live = {"a": a, "b": b}
        assert not apply_decision(d, live, live_free(NODES), 1.0, nodes=NODES).discarded
        moved = _node("n3", models=None)  # a third node now serves m: both sets grew
        got = apply_decision(d, live, live_free(moved), 1.0, nodes=moved)
        assert got.discarded and set(got.changed) == {"a", "b"}
