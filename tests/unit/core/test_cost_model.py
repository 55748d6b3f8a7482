"""The time cost model: expected remaining time, liveness, the readmission horizon, the
release order and gate (shared/core/predictor.py, readiness.py, nodecost.py, round.py)."""

from __future__ import annotations

import math

import pytest

from shared.core.interrupt import InterruptCandidate
from shared.core.nodecost import NodeCost
from shared.core.policies import get_policy
from shared.core.predictor import (
    History,
    ToolCallView,
    expected_remaining_s,
    fold,
    predict_end,
    record,
)
from shared.core.problem import Node
from shared.core.readiness import ReadinessState, readiness
from shared.core.rules import DEFAULT_RULES, PAPER, RULE_SETS
from shared.core.tick import TickSnapshot, decide


def _history(tool: str, durations: list[float]) -> History:
    h = History()
    for d in durations:
        h = record(h, tool, d)
    return h


HEAVY = [0.2, 0.3, 0.4, 0.5, 1.0, 2.0, 30.0, 300.0]
"""A heavy-tailed tool: mostly short calls and a few very long ones."""


class TestExpectedRemaining:
    """``E[D − e | D > e]`` under the moment-fitted log-normal, with its fallbacks."""

    @pytest.mark.parametrize(
        ("call", "history", "now", "expected"),
        [
            # no history: as long again as it has run (never the 5 s default)
            (ToolCallView("x", 0.0), History(), 0.0, 0.0),
            (ToolCallView("x", 0.0), History(), 1.0, 1.0),
            (ToolCallView("x", 0.0), History(), 8.0, 8.0),
            # observed: nothing remains
            (ToolCallView("x", 0.0, completed_at=2.0), History(), 3.0, 0.0),
            # interface evidence: its end while ahead, then as long again
            (ToolCallView("x", 0.0, expected_end=10.0), History(), 4.0, 6.0),
            (ToolCallView("x", 0.0, expected_end=10.0), History(), 12.0, 12.0),
            # a deadline caps it
            (ToolCallView("t", 0.0, deadline=3.0), _history("t", [10.0, 10.0]), 1.0, 2.0),
            # every sample equal: a point mass
            (ToolCallView("t", 0.0), _history("t", [4.0, 4.0, 4.0]), 1.0, 3.0),
        ],
    )  # fmt: skip
    def test_table(self, call: ToolCallView, history: History, now: float, expected: float) -> None:
        """Each row's evidence gives its documented remaining time."""
        assert expected_remaining_s(call, history, now) == pytest.approx(expected)

    def test_at_start_is_the_mean(self) -> None:
        """Before a call has run, its expected remaining time is its history's mean."""
        h = _history("t", HEAVY)
        assert expected_remaining_s(ToolCallView("t", 5.0), h, 5.0) == pytest.approx(
            fold(HEAVY).mean
        )

    def test_heavy_tail_grows_with_elapsed(self) -> None:
        """A heavy-tailed tool that has run long is expected to run longer still."""
        h = _history("t", HEAVY)
        got = [expected_remaining_s(ToolCallView("t", 0.0), h, e) for e in (0.1, 1.0, 10.0, 60.0)]
        assert got[1] > got[0] or got[0] == pytest.approx(got[1], rel=0.05)
        assert got[2] > got[1]
        assert got[3] > got[2]

    def test_matches_numeric_integral(self) -> None:
        """The closed form equals the residual mean integrated numerically."""
        h = _history("t", HEAVY)
        st = h.of("t")
        s2 = math.log1p(st.variance / st.mean**2)
        mu, sigma = math.log(st.mean) - s2 / 2, math.sqrt(s2)
        e = 5.0
        xs = [e * math.exp(i * 0.001) for i in range(1, 20000)]

        def pdf(x: float) -> float:
            return math.exp(-((math.log(x) - mu) ** 2) / (2 * s2)) / (
                x * sigma * math.sqrt(2 * math.pi)
            )

        num = sum((x - e) * pdf(x) * x * 0.001 for x in xs)
        den = sum(pdf(x) * x * 0.001 for x in xs)
        assert expected_remaining_s(ToolCallView("t", 0.0), h, e) == pytest.approx(
            num / den, rel=0.01
        )

    def test_global_history_when_the_tool_has_none(self) -> None:
        """A tool without two samples of its own uses the global history."""
        h = _history("a", [1.0, 3.0])
        assert expected_remaining_s(ToolCallView("new", 0.0), h, 0.0) == pytest.approx(2.0)


class TestLiveness:
    """An open call's prediction is fresh while it runs; a long call can become ready."""

    def test_long_call_reaches_the_horizon(self) -> None:
        """A 100 s history call is ready 1 s before its predicted end, 99 s after it started
        (its evidence, the start, is long past the 30 s freshness window)."""
        h = _history("t", [100.0, 100.0])
        pred = predict_end(ToolCallView("t", 0.0), h, 99.5)
        assert pred.alive == 99.5 and pred.evidence_ts == 0.0
        got = readiness(ReadinessState(pred), 99.5)
        assert (got.r, got.rule) == (1, "horizon")

    def test_old_liveness_is_stale(self) -> None:
        """Liveness older than the freshness window still makes a prediction stale."""
        from shared.core.predictor import Prediction

        pred = Prediction(100.0, "history:tool", 0.0, alive_ts=50.0)
        assert readiness(ReadinessState(pred), 99.5).rule == "stale"


COST = NodeCost(prefill_s=50e-6, attn_s=2.3e-9, requeue_s=0.014)
"""A hand-made node: qwen3-32b-tp2's prefill terms and a 14 ms control loop."""


class TestHorizonAndNet:
    """The readmission horizon and the seconds a release nets, from the node's own terms."""

    @pytest.mark.parametrize(
        ("tokens", "expected"),
        [(0, 0.014), (10_000, 0.014 + 10_000 * (50e-6 + 2.3e-9 * 5_000)),
         (30_000, 0.014 + 30_000 * (50e-6 + 2.3e-9 * 15_000))],
    )  # fmt: skip
    def test_horizon(self, tokens: int, expected: float) -> None:
        """Control loop plus the whole context's prefill."""
        assert COST.readmit_s(tokens) == pytest.approx(expected)

    def test_recompute_counts_kept_context(self) -> None:
        """Recomputing after kept tokens attends to them too."""
        assert COST.recompute_s(100, 1000) > COST.recompute_s(100, 0)

    @pytest.mark.parametrize(
        ("remaining", "tokens", "running", "sign"),
        [(300.0, 30_000, 0, 1), (0.2, 30_000, 0, -1), (5.0, 30_000, 8, -1),
         (math.inf, 1, 0, 1)],
    )  # fmt: skip
    def test_net_sign(self, remaining: float, tokens: int, running: int, sign: int) -> None:
        """A long call nets time, a short one costs it, a busy node makes it dearer."""
        net = COST.release_net_s(remaining, tokens, running)
        assert (net > 0) == (sign > 0)
        if not math.isinf(remaining):
            assert net == pytest.approx(remaining - COST.release_s(tokens, running))

    def test_a_slower_node_prices_the_same_release_higher(self) -> None:
        """Per-node prices: the same call is worth releasing on a fast node, not on a CPU
        engine that spends 3.5x as long per token."""
        slow = COST.with_prefill(COST.prefill_s * 3.5, COST.attn_s * 3.5, "measured")
        assert COST.release_net_s(10.0, 20_000, 2) > 0 > slow.release_net_s(10.0, 20_000, 2)


def _ic(sid: str, remaining: float, tokens: int = 10_000, credit: int = 0) -> InterruptCandidate:
    return InterruptCandidate(
        id=sid, node="n0", weight=tokens + 512, credit=credit, ready=0, tokens=tokens,
        remaining_s=remaining,
    )  # fmt: skip


def _full(*ics: InterruptCandidate, over: int) -> TickSnapshot:
    return TickSnapshot(
        tick=1, now=0.0, quantum=512, nodes=(Node(id="n0", free=0, load=0),),
        candidates=(), interrupts=ics, versions={c.id: 1 for c in ics},
        capacity={"n0": 100_000}, pressure={"n0": over},
    )  # fmt: skip


class TestReleaseOrder:
    """The pay-back of a full node releases the session whose release nets most first."""

    def test_longest_remaining_first(self) -> None:
        """Cost model: the 300 s call goes, though it has the most credit."""
        snap = _full(_ic("short", 0.3, credit=0), _ic("long", 300.0, credit=9_000), over=100)
        got = decide(snap, get_policy("tao"), rules=DEFAULT_RULES)
        assert [m.session for m in got.interrupts] == ["long"]

    def test_readiness_off_forgets_remaining(self) -> None:
        """``tao-no-ready`` does not know the remaining times: a full node releases the
        cheapest release (the smallest context) whatever its call, and nothing is released
        for the pool's demand (no call is known to leave its room idle)."""
        snap = _full(_ic("short", 0.3, tokens=20_000), _ic("long", 300.0, tokens=30_000), over=100)
        got = decide(snap, get_policy("tao-no-ready"), rules=RULE_SETS["tao-no-ready"])
        assert [m.session for m in got.interrupts] == ["short"]
        assert [m.session for m in decide(snap, get_policy("tao")).interrupts] == ["long"]


class TestRuleSets:
    """``tao`` prices its round; the paper's round prices nothing."""

    def test_defaults(self) -> None:
        """The named rule sets differ where documented."""
        assert {"cost", "demand", "home", "payback"} <= DEFAULT_RULES.rules
        assert "cost" not in PAPER and "payback-reserved" in PAPER and "demand" in PAPER
        assert RULE_SETS["tao-fair"].rules == DEFAULT_RULES.rules | {"tail"}


class TestReleaseForDemand:
    """A release for the pool's demand costs the whole context's recompute: the pool that takes
    the room prefills into the cache and evicts the idle released prefix."""

    def _snap(self, remaining: float) -> TickSnapshot:
        from shared.core.tick import TickCandidate

        cand = TickCandidate(
            id="w", version=1, weight=600, tokens=100, ready=1, credit={},
            eligible=frozenset({"n0"}), digest="", phase="reasoning", waiting_since=9.0,
        )  # fmt: skip
        return TickSnapshot(
            tick=1, now=10.0, quantum=512, nodes=(Node(id="n0", free=0, load=20_000),),
            candidates=(cand,), interrupts=(_ic("t", remaining, tokens=20_000),),
            versions={"w": 1, "t": 1}, capacity={"n0": 100_000}, running={"n0": 4},
        )  # fmt: skip

    @pytest.mark.parametrize(("remaining", "released"), [(0.5, []), (60.0, ["t"])])
    def test_kept_slack_does_not_make_a_short_call_cheap(
        self, remaining: float, released: list[str]
    ) -> None:
        """A 0.5 s call is kept though 80k tokens of the node's cache are unclaimed; a 60 s
        call goes. The record says so, with the prices."""
        got = decide(self._snap(remaining), get_policy("tao"), rules=DEFAULT_RULES)
        assert [m.session for m in got.interrupts] == released
        assert got.record is not None
        (entry,) = [e for e in got.record.entries if e.session == "t"]
        assert entry.kind == ("release" if released else "hold")
        assert entry.rule == "demand" and entry.gain_s == remaining
        assert (entry.net_s > 0) == bool(released)


class TestReleasedSessionsWait:
    """``tao-slo`` (the ``wait`` signal): a release also costs the released session the wait
    its next request will have in the pool, the pool's mean wait so far."""

    def _snap(self, remaining: float, waited: tuple[float, ...]) -> TickSnapshot:
        from shared.core.tick import TickCandidate

        now = 100.0
        cands = tuple(
            TickCandidate(
                id=f"w{i}", version=1, weight=600, tokens=100, ready=1, credit={},
                eligible=frozenset({"n0"}), digest="", phase="reasoning",
                waiting_since=now - age,
            )
            for i, age in enumerate(waited)
        )  # fmt: skip
        return TickSnapshot(
            tick=1, now=now, quantum=512, nodes=(Node(id="n0", free=0, load=20_000),),
            candidates=cands, interrupts=(_ic("t", remaining, tokens=20_000),),
            versions={"t": 1, **{c.id: 1 for c in cands}}, capacity={"n0": 100_000},
            running={"n0": 4},
        )  # fmt: skip

    def test_pool_wait_is_the_mean_wait_so_far(self) -> None:
        """Pending requests that waited 10 s and 30 s: a newcomer expects 20 s; none: 0."""
        from shared.core.round import pool_wait

        assert pool_wait(self._snap(60.0, (10.0, 30.0))) == pytest.approx(20.0)
        assert pool_wait(self._snap(60.0, ())) == 0.0

    @pytest.mark.parametrize(
        ("waited", "released"),
        [((1.0, 3.0), ["t"]), ((90.0, 110.0), [])],
    )
    def test_a_long_pool_wait_keeps_the_session(
        self, waited: tuple[float, float], released: list[str]
    ) -> None:
        """A 60 s call is released for a pool that waits 2 s, kept for one that waits 100 s
        (its request would come back to wait longer than the room is idle). ``tao`` releases
        it in both; the record prices the wait into the release's cost."""
        snap = self._snap(60.0, waited)
        slo = RULE_SETS["tao-slo"]
        got = decide(snap, get_policy("tao-slo"), rules=slo)
        assert [m.session for m in got.interrupts] == released
        assert [m.session for m in decide(snap, get_policy("tao")).interrupts] == ["t"]
        plain = decide(snap, get_policy("tao"), rules=DEFAULT_RULES).record
        assert got.record is not None and plain is not None
        (entry,) = [e for e in got.record.entries if e.session == "t"]
        (base,) = [e for e in plain.entries if e.session == "t"]
        assert entry.cost_s == pytest.approx(base.cost_s + sum(waited) / 2)
        assert entry.kind == ("release" if released else "hold")
        assert f"the pool's wait {sum(waited) / 2:.1f} s" in entry.note
        assert "pool's wait" not in base.note

    def test_wait_needs_cost(self) -> None:
        """The wait is a term of the release price: a rule set without ``cost`` is refused."""
        from shared.core.rules import RuleSetError

        with pytest.raises(RuleSetError, match="wait needs cost"):
            PAPER.plus("paper-wait", "wait")
