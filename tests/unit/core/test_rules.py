"""TAO's rule sets (shared/core/rules.py) as the priced round applies them
(shared/core/round.py): one table per rule, each case run with the rule on and off (its
ablation), on hand-built snapshots, and the round's record of each decision with its price."""

from __future__ import annotations

import math
from dataclasses import replace

import msgspec
import pytest

from shared.core.interrupt import InterruptCandidate
from shared.core.nodecost import DEFAULT_COST, NodeCost
from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.problem import Node
from shared.core.rules import (
    DEFAULT_RULES,
    PAPER,
    RULE_SETS,
    RuleSet,
    RuleSetError,
    expected_remaining,
    growth_reserve,
    rule_set,
)
from shared.core.session import Session, on_request, on_response
from shared.core.tick import (
    TickCandidate,
    TickSnapshot,
    context_pressure,
    decide,
    node_pressure,
    policy_rules,
    value_snapshot,
)
from shared.core.valuation import NodeView

Q = 512


def cand(
    sid: str,
    weight: int = 4 * Q,
    *,
    ready: int = 1,
    phase: str = "reasoning",
    credit: dict[str, int] | None = None,
    eligible: tuple[str, ...] = ("n0", "n1"),
    waiting_since: float | None = None,
    home: str | None = None,
) -> TickCandidate:
    return TickCandidate(
        id=sid,
        version=1,
        weight=weight,
        tokens=weight,
        ready=ready,
        credit=credit or {},
        eligible=frozenset(eligible),
        digest="",
        phase=phase,  # type: ignore[arg-type]
        waiting_since=waiting_since,
        home=home,
    )


def tool(
    sid: str,
    node: str = "n0",
    weight: int = 4 * Q,
    *,
    ready: int = 0,
    credit: int = 0,
    remaining_s: float = math.inf,
) -> InterruptCandidate:
    return InterruptCandidate(sid, node, weight, credit, ready, weight, remaining_s)


def snap(
    nodes: dict[str, int],
    cands: list[TickCandidate],
    tools: list[InterruptCandidate] = (),  # type: ignore[assignment]
    *,
    now: float = 100.0,
    overflow: dict[str, int] | None = None,
    pressure: dict[str, int] | None = None,
    costs: dict[str, NodeCost] | None = None,
) -> TickSnapshot:
    versions = {c.id: c.version for c in cands} | {t.id: 1 for t in tools}
    return TickSnapshot(
        tick=0,
        now=now,
        quantum=Q,
        nodes=tuple(Node(n, f) for n, f in nodes.items()),
        candidates=tuple(cands),
        interrupts=tuple(tools),
        versions=versions,
        overflow=overflow or {},
        pressure=pressure or {},
        costs=costs or {},
    )


def run(s: TickSnapshot, rules: RuleSet) -> tuple[list[str], list[tuple[str, str]]]:
    d = decide(s, get_policy("tao"), rules=rules)
    return [m.session for m in d.interrupts], [(m.session, m.node) for m in d.admits]


K = 20_480  # a 20k-token context (40 quanta)


class TestRuleSet:
    """A rule set is validated once: known rules, declared dependencies, parameters."""

    @pytest.mark.parametrize(
        ("rules", "message"),
        [
            ({"cache", "fast"}, r"unknown rule\(s\) fast"),
            ({"home", "cost"}, "home needs demand"),
            ({"home", "demand"}, "home needs cost"),
            ({"payback", "payback-reserved"}, "payback and payback-reserved exclude each other"),
        ],
    )
    def test_invalid(self, rules: set[str], message: str) -> None:
        with pytest.raises(RuleSetError, match=message):
            RuleSet("bad", frozenset(rules))

    def test_bad_parameter(self) -> None:
        with pytest.raises(RuleSetError, match="starve_s must be > 0"):
            RuleSet("bad", frozenset({"tail"}), starve_s=0.0)
        with pytest.raises(RuleSetError, match="growth_min <= growth_max"):
            RuleSet("bad", frozenset(), growth_min=9, growth_max=1)

    def test_every_rule_set_is_a_policy_with_its_rules(self) -> None:
        for name, rules in RULE_SETS.items():
            assert policy_rules(get_policy(name)) == rules
            assert rule_set(name) is rules
        assert policy_rules(get_policy("tao")) == DEFAULT_RULES
        assert policy_rules(get_policy("cache-aware")) == PAPER

    def test_unknown_name(self) -> None:
        with pytest.raises(RuleSetError, match="unknown rule set 'tao-hold'; known: tao"):
            rule_set("tao-hold")

    def test_ablations_differ_from_tao_in_their_rule(self) -> None:
        """Each ``tao-no-X`` is ``tao`` without X; ``tao-fair`` adds the tail."""
        for name, rules in RULE_SETS.items():
            if name.startswith("tao-no-"):
                gone = DEFAULT_RULES.rules - rules.rules
                assert gone and gone <= set(name.removeprefix("tao-no-").split("-no-"))
        assert RULE_SETS["tao-fair"].rules - DEFAULT_RULES.rules == {"tail"}

    def test_decide_uses_the_snapshots_rule_set(self) -> None:
        """The rule set's name travels in the snapshot: a planner whose own policy differs
        decides under the valuation's rule set (a long tool is released for the pool by
        ``tao``'s demand step, not by the paper's pay-back, which has no overflow to pay)."""
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", remaining_s=600.0)])
        valued = replace(s, rules="tao")
        d = decide(valued, get_policy("tao-fair"))
        assert d.record is not None and d.record.rules == "tao"


class TestPayback:
    """An over-committed node comes back within capacity."""

    def test_paper_protects_ready_sessions(self) -> None:
        """The paper's reservation pay-back keeps ``r = 1``; ``tao``'s context pay-back
        releases whatever the readiness (the engine would preempt otherwise)."""
        s = snap({"n0": 0}, [], [tool("ready", ready=1)], overflow={"n0": Q}, pressure={"n0": Q})
        assert run(s, PAPER)[0] == []
        assert run(s, DEFAULT_RULES)[0] == ["ready"]

    def test_lowest_value_first_in_the_papers_order(self) -> None:
        s = snap(
            {"n0": 0},
            [],
            [tool("keep", credit=4 * Q), tool("cheap", credit=0)],
            overflow={"n0": Q},
        )
        assert run(s, PAPER)[0] == ["cheap"]

    @pytest.mark.parametrize(
        ("rules", "overflow", "pressure", "released"),
        [
            (DEFAULT_RULES, {"n0": Q}, {}, []),  # reservations over, contexts fit: keep all
            (PAPER, {"n0": Q}, {}, ["a"]),  # the reservation trigger releases
            (DEFAULT_RULES, {"n0": Q}, {"n0": 1}, ["a"]),  # contexts over by a token
            (DEFAULT_RULES, {}, {"n0": 5 * Q}, ["a", "b"]),  # one context (4Q + 100) is short
            (PAPER, {}, {"n0": 5 * Q}, []),  # pressure is read only under ``payback``
        ],
    )
    def test_trigger(
        self,
        rules: RuleSet,
        overflow: dict[str, int],
        pressure: dict[str, int],
        released: list[str],
    ) -> None:
        tools = [tool("a"), tool("b", credit=Q)]
        s = snap({"n0": 0}, [], tools, overflow=overflow, pressure=pressure)
        assert run(s, rules)[0] == released

    def test_most_net_seconds_first(self) -> None:
        """``tao`` pays back with the release that nets most (the long call), whatever its
        credit; the record names the rule and the node's excess."""
        tools = [tool("short", remaining_s=0.3), tool("long", credit=4 * Q, remaining_s=300.0)]
        s = snap({"n0": 0}, [], tools, pressure={"n0": 1})
        d = decide(s, get_policy("tao"), rules=DEFAULT_RULES)
        assert [m.session for m in d.interrupts] == ["long"]
        assert d.record is not None
        (e,) = d.record.entries
        assert (e.kind, e.rule, e.node, e.gain_s) == ("release", "payback", "n0", 300.0)
        assert e.cost_s == pytest.approx(DEFAULT_COST.release_s(4 * Q, 0))
        assert e.note == "node over by 1 tokens"

    @pytest.mark.parametrize("rules", [DEFAULT_RULES, PAPER])
    def test_release_pays_the_over_commit_first(self, rules: RuleSet) -> None:
        """A node 2Q over on reservations: releasing its 4Q session leaves 2Q free, so a 3Q
        request is not planned there (the live apply would refuse it), under either trigger."""
        s = snap(
            {"n0": 0},
            [cand("w", 3 * Q, eligible=("n0",))],
            [tool("t", remaining_s=600.0)],
            overflow={"n0": 2 * Q},
        )
        assert run(s, rules) == (["t"], [])
        fits = replace(s, candidates=(cand("w", 2 * Q, eligible=("n0",)),))
        assert run(fits, rules) == (["t"], [("w", "n0")])

    def test_context_pressure(self) -> None:
        """Σ (tokens + headroom) of the sessions admitted on a healthy node, past its usable
        capacity (``full``: its whole cache); pooled and ended sessions count nowhere,
        unhealthy nodes are left out."""

        def on(sid: str, node: str | None, tokens: int, ended: bool = False) -> Session:
            return msgspec.structs.replace(Session(id=sid), node=node, tokens=tokens, ended=ended)

        nodes = [
            NodeView(id="n0", capacity_tokens=10_000),
            NodeView(id="n1", capacity_tokens=10_000, target_utilisation=0.5),
            NodeView(id="n2", capacity_tokens=100, healthy=False),
        ]
        sessions = [
            on("a", "n0", 6_000), on("b", "n0", 3_900), on("c", "n1", 4_950),
            on("p", None, 9_000), on("e", "n0", 9_000, ended=True), on("d", "n2", 5_000),
        ]  # fmt: skip
        assert context_pressure(sessions, nodes, 100) == {"n0": 100, "n1": 50}
        assert context_pressure(sessions, nodes, 0) == {}
        assert context_pressure(sessions, nodes, 100, full=True) == {"n0": 100}
        totals = {"n0": (9_900, 2), "n1": (4_950, 1), "n2": (5_000, 1)}
        counted = [replace(nv, contexts=totals[nv.id][0], held=totals[nv.id][1]) for nv in nodes]
        for headroom, full in ((100, False), (0, False), (100, True), (3_000, True)):
            assert node_pressure(counted, headroom, full=full) == context_pressure(
                sessions, nodes, headroom, full=full
            )

    def test_contexts_between_target_and_capacity_are_kept(self) -> None:
        """Contexts at 95 % of a node run at target 0.9 are inside the cache: ``tao`` keeps
        every session."""
        nodes = [NodeView(id="n0", capacity_tokens=10_000, target_utilisation=0.9)]
        a = msgspec.structs.replace(
            Session(id="a"), node="n0", tokens=4_650, weight=4_650, activity="tool"
        )
        b = msgspec.structs.replace(
            Session(id="b"), node="n0", tokens=4_650, weight=4_650, activity="tool"
        )
        snap_ = value_snapshot([a, b], nodes, {}, History(), 0.0, rules=DEFAULT_RULES)
        assert not snap_.pressure and not decide(snap_, get_policy("tao")).interrupts


class TestNeed:
    """Only sessions that use the GPU now claim room or cause releases."""

    @pytest.mark.parametrize(
        ("name", "interrupted", "admitted"),
        [
            ("tao", [], []),  # a deep-in-a-tool pooled session claims nothing
            ("tao-no-need", ["t"], [("pooled", "n0")]),
        ],
    )
    def test_pooled_tool_session(
        self, name: str, interrupted: list[str], admitted: list[tuple[str, str]]
    ) -> None:
        s = snap(
            {"n0": 0},
            [cand("pooled", phase="acting", ready=0, eligible=("n0",))],
            [tool("t", remaining_s=600.0)],
        )
        assert run(s, RULE_SETS[name]) == (interrupted, admitted)

    def test_pending_request_is_needy(self) -> None:
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", remaining_s=600.0)])
        assert run(s, DEFAULT_RULES) == (["t"], [("w", "n0")])


class TestReleasedBy:
    """The decision says which rule released each session (the planner logs it)."""

    @pytest.mark.parametrize(
        ("overflow", "waiting", "expected"),
        [
            ({"n0": Q}, False, (("payback", 1),)),  # an over-committed node pays back
            ({}, True, (("demand", 1),)),  # a needy request claims the room
            ({"n0": Q}, True, (("demand", 1), ("payback", 1))),  # both, one each
            ({}, False, ()),
        ],
    )
    def test_counts_per_rule(
        self, overflow: dict[str, int], waiting: bool, expected: tuple[tuple[str, int], ...]
    ) -> None:
        cands = [cand("w", eligible=("n0",))] if waiting else []
        tools = [tool("a", remaining_s=600.0), tool("b", remaining_s=600.0, credit=4 * Q)]
        s = snap({"n0": 0}, cands, tools, overflow=overflow)
        d = decide(s, get_policy("tao-paper"), rules=PAPER)
        assert d.released_by == expected
        assert sum(n for _, n in d.released_by) == len(d.interrupts)


class TestDemandPrice:
    """``tao`` releases a tool-running session for the pool only where the release nets
    seconds on *its node's* prices: the room's expected idle time beats the recompute of the
    whole context times the requests it delays, plus the re-queue."""

    FAST = NodeCost(prefill_s=26.5e-6, attn_s=2.7e-9, requeue_s=0.014)
    SLOW = NodeCost(prefill_s=176e-6, attn_s=2.7e-9 * 176 / 26.5, requeue_s=0.014)

    @pytest.mark.parametrize(
        ("remaining_s", "running", "cost", "released"),
        [
            (0.5, 0, FAST, []),  # 0.5 s of room for 1.7 s of recompute: keep it
            (3.0, 0, FAST, ["t"]),
            (3.0, 4, FAST, []),  # the recompute delays four running requests too
            (600.0, 16, FAST, ["t"]),
            (3.0, 0, SLOW, []),  # the same call on a CPU engine's prices: keep it
            (math.inf, 16, SLOW, ["t"]),  # no prediction: release
            (0.0, 0, FAST, []),  # the tool has ended: never
        ],
    )
    def test_decide(
        self, remaining_s: float, running: int, cost: NodeCost, released: list[str]
    ) -> None:
        s = snap(
            {"n0": 0},
            [cand("w", eligible=("n0",))],
            [tool("t", weight=K, remaining_s=remaining_s)],
            costs={"n0": cost},
        )
        s = replace(s, running={"n0": running} if running else {})
        assert run(s, DEFAULT_RULES)[0] == released
        assert run(s, PAPER)[0] == ["t"]  # the paper's round prices nothing

    def test_record_explains_both_outcomes(self) -> None:
        """Each tool-running session the demand step weighed is in the record: the released
        one with its gain (the remaining time) and cost (the node's price), the kept one as a
        ``hold`` at its price, and the admitted request as an ``admit`` of the search."""
        t = tool("t", weight=K, remaining_s=600.0)
        keep = tool("keep", weight=K, remaining_s=0.5)
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [t, keep], costs={"n0": self.FAST})
        d = decide(s, get_policy("tao"), rules=DEFAULT_RULES)
        assert d.record is not None
        by = {(e.session, e.kind): e for e in d.record.entries}
        rel = by[("t", "release")]
        assert (rel.rule, rel.gain_s) == ("demand", 600.0)
        assert rel.cost_s == pytest.approx(self.FAST.release_s(K, 0))
        hold = by[("keep", "hold")]
        assert hold.rule == "demand" and hold.note == "not worth it" and hold.net_s < 0
        adm = by[("w", "admit")]
        assert (adm.rule, adm.node, adm.gain_s) == ("search", "n0", 0.0)
        assert adm.cost_s == pytest.approx(self.FAST.recompute_s(4 * Q, 0))
        assert [e.kind for e in d.record.about("w")] == ["admit"]


class TestTail:
    """``tao-fair``: a request that has waited ``starve_s`` (200 s) and fits nowhere gets a
    node's tool-running sessions released until it fits, and goes first."""

    @pytest.mark.parametrize(
        ("name", "waited_s", "released", "placed"),
        [
            ("tao", 250.0, [], [("small", "n0")]),  # no tail rule: the room goes to what fits
            ("tao-fair", 150.0, [], [("small", "n0")]),  # not yet starving
            ("tao-fair", 250.0, ["t"], [("big", "n0")]),  # cleared for, then placed first
        ],
    )  # fmt: skip
    def test_the_tail_rule(
        self, name: str, waited_s: float, released: list[str], placed: list[tuple[str, str]]
    ) -> None:
        now = 1000.0
        big = cand("big", weight=6 * Q, waiting_since=now - waited_s, eligible=("n0",))
        small = cand("small", weight=2 * Q, waiting_since=now - 10.0, eligible=("n0",))
        t = tool("t", weight=4 * Q, remaining_s=0.0)  # about to return: no demand release
        s = snap({"n0": 2 * Q}, [big, small], [t], now=now)
        assert run(s, RULE_SETS[name]) == (released, placed)

    def test_record_names_whom_the_room_was_for(self) -> None:
        now = 1000.0
        big = cand("big", weight=6 * Q, waiting_since=now - 250.0, eligible=("n0",))
        t = tool("t", weight=4 * Q, remaining_s=0.0)
        d = decide(snap({"n0": 2 * Q}, [big], [t], now=now), get_policy("tao-fair"))
        assert d.record is not None
        kinds = [(e.kind, e.session, e.rule, e.for_session) for e in d.record.entries]
        assert kinds == [("release", "t", "tail", "big"), ("admit", "big", "tail", "")]


class TestStay:
    """Among nodes of equal value, a session goes back to the node it last ran on."""

    @pytest.mark.parametrize(("name", "node"), [("tao", "n1"), ("tao-no-stay", "n0")])
    def test_home(self, name: str, node: str) -> None:
        s = snap({"n0": 16 * Q, "n1": 8 * Q}, [cand("a", home="n1")])
        assert run(s, RULE_SETS[name])[1] == [("a", node)]

    def test_credit_beats_home(self) -> None:
        s = snap({"n0": 8 * Q, "n1": 8 * Q}, [cand("a", home="n1", credit={"n0": 2 * Q})])
        assert run(s, DEFAULT_RULES)[1] == [("a", "n0")]


class TestHome:
    """``home``: a session whose last node holds the most of its prefix runs there when that
    node's releasable sessions can make the room, and otherwise
    moves only once it has waited as long as the move costs (``tao-no-home``: it moves as
    soon as another node has room)."""

    NO_HOME = RULE_SETS["tao-no-home"]

    def test_releases_at_home_rather_than_moving(self) -> None:
        a = cand("a", home="n1", credit={"n1": 8 * Q}, waiting_since=99.0)
        far = tool("far", node="n0", remaining_s=6000.0)  # nets the most: the demand order's first
        near = tool("near", node="n1", remaining_s=600.0)
        s = snap({"n0": 0, "n1": 0}, [a], [far, near])
        assert run(s, DEFAULT_RULES) == (["near"], [("a", "n1")])
        assert run(s, self.NO_HOME) == (["far"], [("a", "n0")])
        d = decide(s, get_policy("tao"), rules=DEFAULT_RULES)
        assert d.released_by == (("home", 1),)

    def test_room_released_for_a_session_goes_to_the_search(self) -> None:
        """The record names whom a home release was for; the search then places the pool on
        the room, and a candidate with more credit there takes it (holding the room for the
        session was measured slower: docs/internals.md, "The priced round")."""
        a = cand("a", home="n1", credit={"n1": 8 * Q}, waiting_since=99.9)
        rich = cand("rich", credit={"n1": 16 * Q}, eligible=("n1",))
        near = tool("near", node="n1", remaining_s=600.0)
        d = decide(snap({"n1": 0}, [a, rich], [near]), get_policy("tao"))
        assert [(m.session, m.node) for m in d.admits] == [("rich", "n1")]
        assert d.record is not None
        kinds = [(e.kind, e.session, e.rule, e.for_session) for e in d.record.about("a")]
        assert kinds[0] == ("release", "near", "home", "a")
        assert kinds[1] == ("wait", "a", "search", "")  # the search gave the room to "rich"

    def test_home_releases_only_what_covers_the_shortfall(self) -> None:
        # two quanta at home cannot hold four: nothing released there, the demand step decides
        a = cand("a", home="n1", credit={"n1": 8 * Q}, waiting_since=0.0)
        small = tool("small", node="n1", weight=2 * Q, remaining_s=600.0)
        s = snap({"n0": 0, "n1": 0}, [a], [small, tool("t", node="n0", remaining_s=600.0)])
        d = decide(s, get_policy("tao"), rules=DEFAULT_RULES)
        assert dict(d.released_by) == {"demand": 2}  # the demand step's releases, none "home"
        assert [(m.session, m.node) for m in d.admits] == [("a", "n0")]  # waited 100 s: moves

    @pytest.mark.parametrize(
        ("waited_s", "running", "placed"),
        [
            (0.1, 0, []),  # 0.1 s waited < 0.22 s of recompute: wait for home
            (1.0, 0, [("a", "n0")]),  # waited longer than the move costs: move
            (1.0, 10, []),  # the move would delay 10 running requests too: 2.5 s
            (3.0, 10, [("a", "n0")]),
        ],
    )
    def test_moves_once_the_wait_covers_the_move(
        self, waited_s: float, running: int, placed: list[tuple[str, str]]
    ) -> None:
        now = 100.0
        a = cand("a", home="n1", credit={"n1": 8 * Q}, waiting_since=now - waited_s)
        busy = tool("busy", node="n1", ready=1, remaining_s=600.0)  # ready: protected
        s = snap({"n0": 8 * Q, "n1": 0}, [a], [busy], now=now)
        s = replace(s, running={"n0": running} if running else {})
        assert run(s, DEFAULT_RULES) == ([], placed)
        assert run(s, self.NO_HOME) == ([], [("a", "n0")])
        if not placed:  # the record says why it waits: the move's price against its wait
            d = decide(s, get_policy("tao"))
            assert d.record is not None
            (w,) = d.record.about("a")
            price = DEFAULT_COST.move_s(8 * Q, 0, running)
            assert (w.kind, w.rule, w.node) == ("wait", "home", "n1")
            assert w.gain_s == pytest.approx(price) and w.cost_s == pytest.approx(waited_s)

    @pytest.mark.parametrize(
        "a",
        [
            cand("a", home="n1", waiting_since=99.9),  # nothing at home
            cand("a", home="n1", credit={"n0": 8 * Q, "n1": 8 * Q}, waiting_since=99.9),  # equal
            cand("a", home="n1", credit={"n1": 8 * Q}, waiting_since=99.9, eligible=("n0",)),
        ],
    )
    def test_no_edge_at_home_moves_at_once(self, a: TickCandidate) -> None:
        s = snap({"n0": 8 * Q, "n1": 0}, [a])
        assert run(s, DEFAULT_RULES) == ([], [("a", "n0")])

    def test_move_cost(self) -> None:
        c = NodeCost(prefill_s=50e-6, attn_s=2.3e-9, requeue_s=0.014)
        assert c.move_s(8 * Q, 0, 0) == pytest.approx(c.recompute_s(8 * Q, 0))
        # what the other node holds is kept there; the rest attends to it; 3 requests delayed
        assert c.move_s(8 * Q, 2 * Q, 2) == pytest.approx(
            3 * 6 * Q * (50e-6 + 2.3e-9 * (2 * Q + 3 * Q))
        )
        assert c.move_s(2 * Q, 8 * Q, 5) == 0.0


class TestSignals:
    """The readiness ablation switches r off in the release rules too."""

    def test_ready_protection(self) -> None:
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", ready=1, remaining_s=600.0)])
        blind = RuleSet("paper-no-ready", PAPER.rules - {"ready"})
        assert run(s, PAPER)[0] == []
        assert run(s, blind)[0] == ["t"]

    def test_no_ready_knows_no_remaining_time(self) -> None:
        """``tao-no-ready`` cannot tell a long call: nothing is worth releasing for demand."""
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", remaining_s=600.0)])
        assert run(s, RULE_SETS["tao-no-ready"])[0] == []


class TestGrowth:
    """The reservation for the next turn follows the session's own growth."""

    @pytest.mark.parametrize(
        ("n", "mean", "m2", "rules", "expected"),
        [
            (0, 0.0, 0.0, DEFAULT_RULES, 512),  # no history: the default
            (1, 900.0, 0.0, DEFAULT_RULES, 512),  # one observation is not a spread
            (3, 900.0, 0.0, DEFAULT_RULES, 900),  # z = 0: the mean
            (3, 900.0, 2 * 100.0**2, replace(DEFAULT_RULES, growth_z=2.0), 1100),
            (3, 10.0, 0.0, DEFAULT_RULES, 256),  # the floor
            (3, 1e6, 0.0, DEFAULT_RULES, 16_384),  # the cap
            (3, 900.0, 0.0, PAPER, 512),  # rule off
        ],
    )
    def test_reserve(self, n: int, mean: float, m2: float, rules: RuleSet, expected: int) -> None:
        assert growth_reserve(n, mean, m2, 512, rules) == expected

    def test_session_history_drives_the_weight(self) -> None:
        s = Session("s")
        totals = [1_000, 1_600, 2_400, 3_000]
        for i, total in enumerate(totals):
            s, _ = on_request(s, f"r{i}", float(i))
            s = msgspec.structs.replace(s, node="n0")
            s = on_response(s, float(i) + 0.5, total_tokens=total, reserve=512, rules=DEFAULT_RULES)
        assert s.growth_n == 3 and s.growth_mean == pytest.approx(2_000 / 3)
        sd = (s.growth_m2 / 2) ** 0.5  # growths 600, 800, 600
        assert s.weight == 3_000 + int(2_000 / 3 + DEFAULT_RULES.growth_z * sd + 0.5)

    @pytest.mark.parametrize(
        ("end", "start", "now", "expected"),
        [(10.0, 0.0, 4.0, 6.0), (10.0, 0.0, 15.0, 15.0), (10.0, 5.0, 10.0, 5.0)],
    )
    def test_expected_remaining(
        self, end: float, start: float, now: float, expected: float
    ) -> None:
        assert expected_remaining(end, start, now) == expected
