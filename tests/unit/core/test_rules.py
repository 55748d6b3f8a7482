"""TAO's rules (shared/core/rules.py) as shared/core/tick.decide applies them: one table per
rule, each case run with the rule on and off (its ablation), on hand-built snapshots."""

from __future__ import annotations

import math
from dataclasses import replace

import msgspec
import pytest

from shared.core.interrupt import InterruptCandidate
from shared.core.policies import get_policy
from shared.core.predictor import History
from shared.core.problem import Node
from shared.core.rules import (
    ABLATIONS,
    DEFAULT_RULES,
    PAPER,
    TaoRules,
    expected_remaining,
    growth_reserve,
    move_cost_s,
    recompute_s,
    release_cost_s,
    release_worth,
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
    )


def run(s: TickSnapshot, rules: TaoRules) -> tuple[list[str], list[tuple[str, str]]]:
    d = decide(s, get_policy("tao"), rules=rules)
    return [m.session for m in d.interrupts], [(m.session, m.node) for m in d.admits]


RESERVED = ABLATIONS["tao-payback-reserved"]  # the pay-back triggered by reservations
DEMAND = ABLATIONS["tao-demand"]  # the demand step on: the rules that act within it


class TestPayback:
    """An over-committed node comes back within capacity whatever the readiness."""

    @pytest.mark.parametrize(
        ("rules", "released"),
        [(RESERVED, ["ready"]), (replace(RESERVED, payback=False), [])],
    )
    def test_ready_session_released_for_overflow(
        self, rules: TaoRules, released: list[str]
    ) -> None:
        s = snap({"n0": 0}, [], [tool("ready", ready=1)], overflow={"n0": Q})
        assert run(s, rules)[0] == released

    def test_lowest_value_first(self) -> None:
        s = snap(
            {"n0": 0},
            [],
            [tool("keep", credit=4 * Q, ready=1), tool("cheap", credit=0, ready=1)],
            overflow={"n0": Q},
        )
        assert run(s, RESERVED)[0] == ["cheap"]


CTX = DEFAULT_RULES


class TestPaybackContext:
    """``payback_context``: the pay-back acts where the contexts (each + headroom) exceed the
    usable capacity, not where the reservations (contexts + next turn's growth) do; a release's
    room pays a node's reservation over-commit back before it is free."""

    @pytest.mark.parametrize(
        ("rules", "overflow", "pressure", "released"),
        [
            (CTX, {"n0": Q}, {}, []),  # reservations over, contexts fit: keep everyone
            (RESERVED, {"n0": Q}, {}, ["a"]),  # the reservation trigger releases
            (CTX, {"n0": Q}, {"n0": 1}, ["a"]),  # contexts over by a token: one release
            (CTX, {}, {"n0": 5 * Q}, ["a", "b"]),  # one context (4Q + 100) is not enough
            (RESERVED, {}, {"n0": 5 * Q}, []),  # pressure is read only under the rule
        ],
    )
    def test_trigger(
        self,
        rules: TaoRules,
        overflow: dict[str, int],
        pressure: dict[str, int],
        released: list[str],
    ) -> None:
        tools = [tool("a", ready=1), tool("b", ready=1, credit=Q)]
        s = snap({"n0": 0}, [], tools, overflow=overflow, pressure=pressure)
        assert run(s, rules)[0] == released

    @pytest.mark.parametrize(
        ("rules", "released"),
        [(CTX, ["big"]), (replace(CTX, payback_smallest=True), ["small"])],
    )
    def test_order(self, rules: TaoRules, released: list[str]) -> None:
        """Lowest value first (credit, then readiness); ``payback_smallest``: fewest tokens."""
        tools = [tool("big", weight=8 * Q, credit=0), tool("small", weight=2 * Q, credit=2 * Q)]
        s = snap({"n0": 0}, [], tools, pressure={"n0": 1})
        assert run(s, rules)[0] == released

    @pytest.mark.parametrize("rules", [replace(CTX, demand=True), replace(RESERVED, demand=True)])
    def test_release_pays_the_over_commit_first(self, rules: TaoRules) -> None:
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
        capacity; pooled and ended sessions count nowhere, unhealthy nodes are left out."""

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
        # ``full`` (payback_capacity, tao's default): against the whole cache, not the target
        assert context_pressure(sessions, nodes, 100, full=True) == {"n0": 100}
        # from the nodes' own totals (what the store keeps), the same on every setting
        totals = {"n0": (9_900, 2), "n1": (4_950, 1), "n2": (5_000, 1)}
        counted = [replace(nv, contexts=totals[nv.id][0], held=totals[nv.id][1]) for nv in nodes]
        for headroom, full in ((100, False), (0, False), (100, True), (3_000, True)):
            assert node_pressure(counted, headroom, full=full) == context_pressure(
                sessions, nodes, headroom, full=full
            )

    @pytest.mark.parametrize(
        ("policy", "paid_back"), [("tao", False), ("tao-payback-usable", True)]
    )
    def test_contexts_between_target_and_capacity(self, policy: str, paid_back: bool) -> None:
        """Contexts at 95 % of a node run at target 0.9: inside the cache, so ``tao`` keeps
        every session; only the usable-capacity trigger releases one."""
        nodes = [NodeView(id="n0", capacity_tokens=10_000, target_utilisation=0.9)]
        a = msgspec.structs.replace(
            Session(id="a"), node="n0", tokens=4_650, weight=4_650, activity="tool"
        )
        b = msgspec.structs.replace(
            Session(id="b"), node="n0", tokens=4_650, weight=4_650, activity="tool"
        )
        rules = policy_rules(get_policy(policy))
        snap_ = value_snapshot([a, b], nodes, {}, History(), 0.0, rules=rules)
        assert bool(snap_.pressure) == paid_back
        d = decide(snap_, get_policy(policy))
        assert (len(d.interrupts) == 1) == paid_back


class TestNeed:
    """Only sessions that use the GPU now claim room or cause interrupts."""

    @pytest.mark.parametrize(
        ("rules", "interrupted", "admitted"),
        [
            (DEMAND, [], []),  # a deep-in-a-tool pooled session claims nothing
            (replace(DEMAND, need=False), ["t"], [("pooled", "n0")]),
        ],
    )
    def test_pooled_tool_session(
        self, rules: TaoRules, interrupted: list[str], admitted: list[tuple[str, str]]
    ) -> None:
        s = snap(
            {"n0": 0},
            [cand("pooled", phase="acting", ready=0, eligible=("n0",))],
            [tool("t", remaining_s=600.0)],
        )
        assert run(s, rules) == (interrupted, admitted)

    def test_pending_request_is_needy(self) -> None:
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", remaining_s=600.0)])
        assert run(s, DEMAND) == (["t"], [("w", "n0")])


class TestReleasedBy:
    """The decision says which step released each interrupted session (the planner logs it)."""

    @pytest.mark.parametrize(
        ("overflow", "waiting", "expected"),
        [
            ({"n0": Q}, False, (("payback", 1),)),  # an over-committed node pays back
            ({}, True, (("demand", 1),)),  # a needy request claims the room
            ({"n0": Q}, True, (("demand", 1), ("payback", 1))),  # both, one each
            ({}, False, ()),
        ],
    )
    def test_counts_per_step(
        self, overflow: dict[str, int], waiting: bool, expected: tuple[tuple[str, int], ...]
    ) -> None:
        cands = [cand("w", eligible=("n0",))] if waiting else []
        tools = [tool("a", remaining_s=600.0), tool("b", remaining_s=600.0, credit=4 * Q)]
        s = snap({"n0": 0}, cands, tools, overflow=overflow)
        d = decide(s, get_policy("tao"), rules=ABLATIONS["tao-prev"])
        assert d.released_by == expected
        assert sum(n for _, n in d.released_by) == len(d.interrupts)


class TestHold:
    """A session is released for the pool only when its tool will run long enough."""

    @pytest.mark.parametrize(
        ("remaining_s", "hold", "released"),
        [
            (0.5, True, []),  # a short tool: keep it
            (600.0, True, ["t"]),  # a long one: release
            (0.5, False, ["t"]),  # the ablation releases whatever the tool
        ],
    )
    def test_threshold(self, remaining_s: float, hold: bool, released: list[str]) -> None:
        rules = replace(DEMAND, hold=hold)
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", remaining_s=remaining_s)])
        assert run(s, rules)[0] == released

    def test_threshold_grows_with_context(self) -> None:
        # 3 s left: above hold_s (2 s) but below 2 s + 0.1 s per 1,000 of 20,480 tokens
        big = tool("big", weight=40 * Q, remaining_s=3.0)
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [big])
        assert run(s, DEMAND)[0] == []

    def test_no_demand_step_keeps_every_tool_session(self) -> None:
        """``tao-hold`` (the demand step off): a needy request does not get a long tool's
        room; ``tao`` (the cost model) gives it the room."""
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", remaining_s=600.0)])
        assert run(s, ABLATIONS["tao-hold"]) == ([], [])
        assert run(s, DEMAND) == (["t"], [("w", "n0")])
        assert run(s, DEFAULT_RULES) == (["t"], [("w", "n0")])


EVICT = ABLATIONS["tao-evict"]
K = 20_480  # a 20k-token context (40 quanta)


class TestEvict:
    """``tao-evict``: a session is released only when its room is worth more than the
    recompute of the prefix the node's unclaimed cache cannot keep, times the batch it delays.
    """

    @pytest.mark.parametrize(
        ("tokens", "slack", "running", "expected"),
        [
            (K, K, 8, 0.014),  # the whole prefix fits in unclaimed cache: the round trip only
            (K, 10 * K, 0, 0.014),
            # none fits, nobody else on the node: 20,480·(50 µs + 2.3 ns·10,240) + 0.014
            (K, 0, 0, K * (50e-6 + 2.3e-9 * K / 2) + 0.014),
            (K, -5_000, 0, K * (50e-6 + 2.3e-9 * K / 2) + 0.014),  # over-committed: all of it
            # four running requests are delayed by the same recompute
            (K, 0, 4, 5 * K * (50e-6 + 2.3e-9 * K / 2) + 0.014),
            # half fits: the evicted tail attends to the kept half
            (K, K // 2, 0, K // 2 * (50e-6 + 2.3e-9 * (K // 2 + K // 4)) + 0.014),
            (0, 0, 3, 0.014),
        ],
    )
    def test_cost(self, tokens: int, slack: int, running: int, expected: float) -> None:
        assert release_cost_s(tokens, slack, running, EVICT) == pytest.approx(expected)

    @pytest.mark.parametrize(
        ("remaining_s", "slack", "running", "worth"),
        [
            (0.5, K, 0, True),  # prefix safe: even a short tool frees its room
            (0.5, 0, 0, False),  # prefix lost: 1.5 s of recompute for 0.5 s of room
            (3.0, 0, 0, True),  # 3 s of room beats 1.5 s of recompute
            (3.0, 0, 4, False),  # ...not when it also delays four running requests (7.4 s)
            (600.0, 0, 16, True),
            (math.inf, 0, 16, True),  # no prediction: as the hold rule, release
            (0.0, K, 0, False),  # the tool has ended: never
        ],
    )
    def test_worth(self, remaining_s: float, slack: int, running: int, worth: bool) -> None:
        assert release_worth(remaining_s, K, slack, running, EVICT) is worth

    @pytest.mark.parametrize(
        ("rules", "remaining_s", "load", "running", "released"),
        [
            (EVICT, 0.5, 100_000 - K, 0, ["t"]),  # unclaimed cache keeps the prefix
            (EVICT, 0.5, 100_000, 0, []),  # the node's cache is claimed: keep it
            (EVICT, 3.0, 100_000, 0, ["t"]),
            (EVICT, 3.0, 100_000, 4, []),  # a busy node: the recompute delays the batch
            (EVICT, 600.0, 100_000, 4, ["t"]),
            (DEMAND, 0.5, 100_000 - K, 0, []),  # the hold rule: fixed 2 s + 2 s
            (DEMAND, 3.0, 100_000, 4, []),
            (DEMAND, 600.0, 100_000, 4, ["t"]),
        ],
    )
    def test_decide(
        self, rules: TaoRules, remaining_s: float, load: int, running: int, released: list[str]
    ) -> None:
        s = snap(
            {"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", weight=K, remaining_s=remaining_s)]
        )
        s = replace(
            s,
            nodes=(Node("n0", 0, load),),
            capacity={"n0": 100_000},
            running={"n0": running} if running else {},
        )
        assert run(s, rules)[0] == released

    def test_no_capacity_reads_as_claimed(self) -> None:
        # a snapshot without the node facts: the whole prefix is assumed lost
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", weight=K, remaining_s=1.0)])
        assert run(s, EVICT)[0] == []

    def test_variant_replaces_the_hold(self) -> None:
        assert replace(DEMAND, hold=False, evict=True) == EVICT
        assert not ABLATIONS["tao-hold"].evict and DEFAULT_RULES.evict


class TestAging:
    """A request that has waited ``starve_s`` is placed first (the opt-in ``tao-aging``)."""

    def test_starving_placed_before_higher_credit(self) -> None:
        rules = replace(DEFAULT_RULES, aging=True, starve_s=30.0)
        old = cand("old", waiting_since=0.0, eligible=("n0",))
        rich = cand("rich", credit={"n0": 4 * Q}, waiting_since=99.0, eligible=("n0",))
        s = snap({"n0": 4 * Q}, [rich, old])
        assert run(s, rules)[1] == [("old", "n0")]
        assert run(s, replace(rules, aging=False))[1] == [("rich", "n0")]

    def test_clearing_releases_and_blocks(self) -> None:
        rules = replace(
            DEFAULT_RULES, aging=True, starve_s=30.0, starve_clear=True, starve_block=True
        )
        old = cand("old", weight=8 * Q, waiting_since=0.0, eligible=("n0",))
        other = cand("other", weight=Q, eligible=("n0",))
        s = snap({"n0": 2 * Q}, [old, other], [tool("t", weight=2 * Q, ready=0, remaining_s=1.0)])
        interrupted, admitted = run(s, rules)
        assert interrupted == ["t"]  # the hold rule does not apply when clearing
        assert admitted == []  # 4 of 8 quanta: the node is held for "old", "other" waits

    @pytest.mark.parametrize(
        ("policy", "waited_s", "released", "placed"),
        [
            ("tao", 250.0, [], [("small", "n0")]),  # no aging: the room goes to what fits
            ("tao-aging", 250.0, [], [("small", "n0")]),  # 300 s, never clears
            ("tao-aging", 350.0, [], [("small", "n0")]),  # first, but fits nowhere: skipped
            ("tao-fair", 150.0, [], [("small", "n0")]),  # not yet starving
            ("tao-fair", 250.0, ["t"], [("big", "n0")]),  # cleared for, then placed first
        ],
    )  # fmt: skip
    def test_the_tail_rule_by_policy(
        self, policy: str, waited_s: float, released: list[str], placed: list[tuple[str, str]]
    ) -> None:
        """``tao-fair`` (docs/evaluation.md, "The tail"): a request that has waited 200 s and
        fits nowhere gets a node's tool-running sessions released until it fits, and goes
        first; the default places the room with what fits, and ``tao-aging`` never clears."""
        now = 1000.0
        big = cand("big", weight=6 * Q, waiting_since=now - waited_s, eligible=("n0",))
        small = cand("small", weight=2 * Q, waiting_since=now - 10.0, eligible=("n0",))
        t = tool("t", weight=4 * Q, remaining_s=0.0)  # about to return: no demand release
        s = snap({"n0": 2 * Q}, [big, small], [t], now=now)
        assert run(s, policy_rules(get_policy(policy))) == (released, placed)


class TestStay:
    """Among nodes of equal value, a session goes back to the node it last ran on."""

    @pytest.mark.parametrize(("stay", "node"), [(True, "n1"), (False, "n0")])
    def test_home(self, stay: bool, node: str) -> None:
        rules = replace(DEFAULT_RULES, stay=stay)
        s = snap({"n0": 16 * Q, "n1": 8 * Q}, [cand("a", home="n1")])
        assert run(s, rules)[1] == [("a", node)]

    def test_credit_beats_home(self) -> None:
        s = snap({"n0": 8 * Q, "n1": 8 * Q}, [cand("a", home="n1", credit={"n0": 2 * Q})])
        assert run(s, DEFAULT_RULES)[1] == [("a", "n0")]


class TestHome:
    """``home``: a session whose last node holds the most of its prefix runs there when that
    node's releasable sessions can make the room, and otherwise moves only once it has waited
    as long as the move costs (``tao-no-home``: it moves as soon as another node has room)."""

    NO_HOME = ABLATIONS["tao-no-home"]

    def test_releases_at_home_rather_than_moving(self) -> None:
        a = cand("a", home="n1", credit={"n1": 8 * Q}, waiting_since=99.0)
        far = tool("far", node="n0", remaining_s=6000.0)  # nets the most: the demand order's first
        near = tool("near", node="n1", remaining_s=600.0)
        s = snap({"n0": 0, "n1": 0}, [a], [far, near])
        assert run(s, DEFAULT_RULES) == (["near"], [("a", "n1")])
        assert run(s, self.NO_HOME) == (["far"], [("a", "n0")])
        d = decide(s, get_policy("tao"), rules=DEFAULT_RULES)
        assert d.released_by == (("home", 1),)

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
        assert move_cost_s(8 * Q, 0, 0, DEFAULT_RULES) == pytest.approx(
            recompute_s(8 * Q, 0, DEFAULT_RULES)
        )
        # what the other node holds is kept there; the rest attends to it; 3 requests delayed
        assert move_cost_s(8 * Q, 2 * Q, 2, DEFAULT_RULES) == pytest.approx(
            3 * 6 * Q * (50e-6 + 2.3e-9 * (2 * Q + 3 * Q))
        )
        assert move_cost_s(2 * Q, 8 * Q, 5, DEFAULT_RULES) == 0.0

    def test_older_rule_sets_are_unchanged(self) -> None:
        assert not ABLATIONS["tao-hold"].home and not PAPER.home and DEFAULT_RULES.home


class TestReadmit:
    """``readmit``: a released session in its tool goes back home into the plan's leftovers."""

    def test_leftover_room_at_home_takes_it_back(self) -> None:
        rules = ABLATIONS["tao-readmit"]
        back = cand("back", phase="acting", ready=0, home="n1", credit={"n1": 2 * Q})
        s = snap({"n0": 8 * Q, "n1": 8 * Q}, [cand("w", eligible=("n0",)), back])
        assert run(s, rules)[1] == [("w", "n0"), ("back", "n1")]
        assert run(s, DEFAULT_RULES)[1] == [("w", "n0")]  # need: it waits for its tool

    def test_never_room_a_needy_session_was_given(self) -> None:
        rules = ABLATIONS["tao-readmit"]
        back = cand("back", phase="acting", ready=0, home="n1", credit={"n1": 2 * Q})
        s = snap({"n1": 6 * Q}, [cand("w", eligible=("n1",)), back])
        assert run(s, rules)[1] == [("w", "n1")]  # 2 quanta left: not the 4 it needs

    def test_no_credit_at_home_no_readmission(self) -> None:
        back = cand("back", phase="acting", ready=0, home="n1")
        s = snap({"n1": 16 * Q}, [back])
        assert run(s, ABLATIONS["tao-readmit"])[1] == []


class TestSignals:
    """The readiness ablation switches r off in the interrupt rule too."""

    @pytest.mark.parametrize(("name", "released"), [("tao", []), ("tao-no-ready", ["t"])])
    def test_ready_protection(self, name: str, released: list[str]) -> None:
        s = snap({"n0": 0}, [cand("w", eligible=("n0",))], [tool("t", ready=1, remaining_s=600.0)])
        rules = replace(policy_rules(get_policy(name)), demand=True, evict=False, hold=False)
        d = decide(s, get_policy(name), rules=rules)
        assert [m.session for m in d.interrupts] == released

    def test_every_ablation_is_registered_with_its_rules(self) -> None:
        for name, rules in ABLATIONS.items():
            assert policy_rules(get_policy(name)) == rules
        assert policy_rules(get_policy("tao")) == DEFAULT_RULES
        assert policy_rules(get_policy("cache-aware")) == PAPER


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
    def test_reserve(self, n: int, mean: float, m2: float, rules: TaoRules, expected: int) -> None:
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
