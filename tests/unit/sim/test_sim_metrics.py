"""Each metric against a tiny hand-computed scenario, and the comparison table's arithmetic."""

from __future__ import annotations

import math

import pytest

from shared.sim.metrics import (
    METRICS,
    compute_metrics,
    improvement,
    node_moves,
    paired_relative,
    recompute_by_cause,
    recomputed_tokens,
    t_quantile,
)
from shared.sim.records import RequestRecord, Sample, SimResult, TaskRecord, TickRecord
from shared.sim.report import aggregate, comparison_table, paired_comparisons
from shared.sim.runner import Run


def hand_result() -> SimResult:
    """Two tasks, three requests, two samples, two scheduling rounds (values chosen by hand)."""
    res = SimResult(policy="tao", seed=0, workers=2, nodes=1, profile="qwen3-32b-tp2")
    res.tasks = [
        TaskRecord("A", "f", start=0.0, end=10.0, turns=2, tool_time=1.0),
        TaskRecord("B", "f", start=1.0, end=5.0, turns=1, tool_time=0.0),
    ]
    res.requests = [
        RequestRecord("A", 0, "n0", 0.0, 0.0, 0.5, 2.0, 100, 0, 10, None),
        RequestRecord("A", 1, "n0", 3.0, 4.0, 4.5, 10.0, 200, 96, 20, 3.0),
        RequestRecord("B", 0, "n0", 1.0, 1.0, 1.2, 5.0, 50, 0, 30, None),
    ]
    res.samples = [Sample(0.0, 1, 0, 0, 1), Sample(1.0, 2, 1, 1, 2)]
    res.ticks = [
        TickRecord(0.0, 2, 100, 900, 1000, True, "dp", 0.001, 0, 2, False),
        TickRecord(1.0, 1, 300, 500, 1000, False, "bfd", 0.003, 1, 0, False),
    ]
    res.counters["interrupts"] = 1
    return res


class TestMetrics:
    """compute_metrics gives the hand-computed values."""

    def test_latency(self) -> None:
        """Task latency: end − start; p99 interpolates linearly."""
        m = compute_metrics(hand_result(), True)
        assert m["latency_mean"] == pytest.approx(7.0)
        assert m["latency_p50"] == pytest.approx(7.0)
        assert m["latency_p99"] == pytest.approx(4.0 + 0.99 * 6.0)

    def test_ttft_and_tool_to_first(self) -> None:
        """TTFT counts from the agent's request (pool hold included); tool→1st from tool end."""
        m = compute_metrics(hand_result(), True)
        assert m["ttft_mean"] == pytest.approx((0.5 + 1.5 + 0.2) / 3)
        assert m["tool_to_first_mean"] == pytest.approx(1.5)
        assert m["tool_to_first_p99"] == pytest.approx(1.5)

    def test_pause_wait(self) -> None:
        """Pause wait: submitted − issued per request."""
        m = compute_metrics(hand_result(), True)
        assert m["pause_wait_mean"] == pytest.approx(1.0 / 3)
        assert m["pause_wait_total"] == pytest.approx(1.0)

    def test_throughput_hits_makespan(self) -> None:
        """Decode throughput = Σ output / makespan; hit rate = Σ cached / Σ prompt."""
        m = compute_metrics(hand_result(), True)
        assert m["makespan"] == pytest.approx(10.0)
        assert m["decode_tps"] == pytest.approx(60 / 10.0)
        assert m["prefix_hit_rate"] == pytest.approx(96 / 350)
        assert m["completion_tokens"] == 60

    def test_running_and_planner(self) -> None:
        """Running mean/max from samples; fallback, solve time and demand/capacity from
        rounds."""
        m = compute_metrics(hand_result(), True)
        assert m["running_mean"] == pytest.approx(1.5)
        assert m["running_max"] == 2
        assert m["fallback_rate"] == pytest.approx(0.5)
        assert m["solve_ms_mean"] == pytest.approx(2.0)
        assert m["demand_capacity_mean"] == pytest.approx((0.1 + 0.3) / 2)
        assert m["interrupts"] == 1

    def test_fallback_null_for_non_dp(self) -> None:
        """Policies that do not solve the DP report no fallback rate."""
        assert compute_metrics(hand_result(), False)["fallback_rate"] is None


class TestImprovement:
    """Relative improvement: positive means better, whichever direction the metric runs."""

    def test_signs(self) -> None:
        """Lower latency and higher throughput are improvements; the reverse are losses."""
        assert improvement("latency_mean", 80.0, 100.0) == pytest.approx(20.0)
        assert improvement("latency_mean", 120.0, 100.0) == pytest.approx(-20.0)
        assert improvement("decode_tps", 110.0, 100.0) == pytest.approx(10.0)
        assert improvement("running_mean", 1.0, 2.0) is None

    def test_table_picks_best_baseline(self) -> None:
        """The improvement row compares with the best baseline per metric."""

        def run(policy: str, lat: float, seed: int) -> Run:
            return Run(policy, seed, 8, 2, {"latency_mean": lat, "decode_tps": 100.0})

        runs = [
            run("tao", 90.0, 0),
            run("tao", 110.0, 1),
            run("rr", 120.0, 0),
            run("rr", 120.0, 1),
            run("cache-aware", 105.0, 0),
            run("cache-aware", 95.0, 1),
        ]
        agg = aggregate(runs)
        assert agg[(8, "tao")]["latency_mean"][0] == pytest.approx(100.0)
        assert agg[(8, "tao")]["latency_mean"][1] == pytest.approx(14.142135, rel=1e-5)
        table = comparison_table(runs)
        assert "tao vs best baseline" in table
        assert "+0.0% (cache-aware)" in table  # 100 vs cache-aware's 100

    def test_plain_table_fits_100_columns_without_minus_zero(self) -> None:
        """Every metric column, yet no line over 100 characters (the table was ~200 wide),
        and an improvement that rounds to zero prints +0.0, not -0.0."""
        metrics = {m: 100.0 for m in METRICS}
        runs = [
            Run("tao", s, 64, 2, {**metrics, "latency_mean": 99.99 - s * 1e-3}) for s in (0, 1)
        ] + [Run("thunderagent-ideal", s, 64, 2, dict(metrics)) for s in (0, 1)]
        table = comparison_table(runs)
        assert max(len(line) for line in table.splitlines()) <= 100
        assert "-0.0" not in table and "+0.0% (thunderagent-ideal)" in table


# -- paired statistic ----------------------------------------------------------------------

# Three seeds, hand-computed: d = (90−100)/100, (105−100)/100, (88−80)/80 → −10, +5, +10 %;
# mean 5/3; sd² = ((−35/3)² + (10/3)² + (25/3)²) / 2 = 1950/18 → sd 10.408330;
# half-width = t_{0.975,2} · sd / √3 = 4.302652729749462 · 10.408330 / 1.7320508 = 25.8559...
_SD3 = math.sqrt(1950 / 18)
_HALF3 = 4.302652729749462 * _SD3 / math.sqrt(3)


@pytest.mark.parametrize(
    ("pairs", "n", "mean", "half", "excludes"),
    [
        pytest.param([(90.0, 100.0), (105.0, 100.0), (88.0, 80.0)], 3, 5 / 3, _HALF3, False,
                     id="three-seeds"),
        pytest.param([(80.0, 100.0)], 1, -20.0, None, False, id="one-seed-no-interval"),
        pytest.param([(110.0, 100.0), (55.0, 50.0), (22.0, 20.0)], 3, 10.0, 0.0, True,
                     id="zero-variance"),
        pytest.param([(0.0, 0.0), (0.0, 0.0)], 2, 0.0, 0.0, False, id="both-zero-is-0pct"),
        pytest.param([(5.0, 0.0), (90.0, 100.0)], 1, -10.0, None, False,
                     id="zero-baseline-dropped"),
        pytest.param([(None, 100.0), (90.0, None), (float("nan"), 1.0), (95.0, 100.0)], 1,
                     -5.0, None, False, id="missing-skipped"),
        pytest.param([(90.0, 100.0), (92.0, 100.0), (91.0, 100.0)], 3, -9.0,
                     4.302652729749462 * 1.0 / math.sqrt(3), True, id="excludes-zero-below"),
    ],
)  # fmt: skip
def test_paired_relative(
    pairs: list[tuple[float | None, float | None]],
    n: int,
    mean: float,
    half: float | None,
    excludes: bool,
) -> None:
    """Mean of per-seed (policy − baseline)/baseline in %, Student-t 95 % interval."""
    st = paired_relative(pairs)
    assert st is not None
    assert st.n == n
    assert st.mean == pytest.approx(mean)
    if half is None:
        assert st.low is None and st.high is None
    else:
        assert st.low == pytest.approx(mean - half, abs=1e-9)
        assert st.high == pytest.approx(mean + half, abs=1e-9)
    assert st.excludes_zero is excludes


def test_paired_relative_none_without_pairs() -> None:
    """No usable pair: no statistic."""
    assert paired_relative([]) is None
    assert paired_relative([(1.0, 0.0)]) is None


# scipy.stats.t.ppf(0.975, df), as scipy 1.17 prints them
@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 12.706204736174694), (2, 4.302652729749462), (3, 3.1824463052837078),
     (4, 2.7764451051977934), (9, 2.262157162798205), (10, 2.228138851986274),
     (29, 2.045229642132703), (101, 1.983731002955606)],
)  # fmt: skip
def test_t_quantile(df: int, expected: float) -> None:
    """The closed-form t CDF inverted by bisection equals scipy's t.ppf."""
    assert t_quantile(0.975, df) == pytest.approx(expected, rel=1e-12)


def test_t_quantile_against_scipy() -> None:
    """Other levels and df, where scipy is installed."""
    stats = pytest.importorskip("scipy.stats")
    for q in (0.5, 0.8, 0.95, 0.995):
        for df in (1, 2, 5, 17, 60):
            assert t_quantile(q, df) == pytest.approx(float(stats.t.ppf(q, df)), rel=1e-10)


def test_t_quantile_rejects() -> None:
    with pytest.raises(ValueError):
        t_quantile(0.975, 0)
    with pytest.raises(ValueError):
        t_quantile(1.0, 3)


# -- recomputed tokens ---------------------------------------------------------------------


def _req(session: str, turn: int, prompt: int, cached: int, completion: int) -> RequestRecord:
    return RequestRecord(session, turn, "n0", 0.0, 0.0, 0.0, 0.0, prompt, cached, completion,
                         None)  # fmt: skip


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        # first request: nothing computed before, whatever the cache held
        pytest.param([_req("A", 0, 100, 0, 10)], 0, id="first-request"),
        # prev ctx 110; prompt 150 → 110 already computed, 100 cached → 10 recomputed
        pytest.param([_req("A", 0, 100, 0, 10), _req("A", 1, 150, 100, 5)], 10, id="partial"),
        # full hit of the previous context: nothing recomputed
        pytest.param([_req("A", 0, 100, 0, 10), _req("A", 1, 150, 110, 5)], 0, id="full-hit"),
        # evicted: prev ctx 110 all recomputed
        pytest.param([_req("A", 0, 100, 0, 10), _req("A", 1, 150, 0, 5)], 110, id="evicted"),
        # prompt shorter than the previous context (truncated): min(prompt, ctx) = 80
        pytest.param([_req("A", 0, 100, 0, 10), _req("A", 1, 80, 30, 5)], 50, id="truncated"),
        # cached beyond the previous context (shared prefix) never counts negative
        pytest.param([_req("A", 0, 100, 0, 10), _req("A", 1, 150, 140, 5)], 0, id="over-hit"),
        # two sessions, records out of order (as completions append them): per session by turn
        pytest.param(
            [_req("B", 1, 300, 0, 1), _req("A", 2, 200, 150, 1), _req("A", 0, 100, 0, 20),
             _req("B", 0, 250, 0, 10), _req("A", 1, 150, 120, 10)],
            # A1: min(150,120)−120=0; A2: min(200,160)−150=10; B1: min(300,260)−0=260
            270, id="two-sessions-unordered",
        ),
    ],
)  # fmt: skip
def test_recomputed_tokens(requests: list[RequestRecord], expected: int) -> None:
    """Σ max(0, min(prompt, previous prompt + completion) − cached) per session."""
    res = SimResult(policy="tao", seed=0, workers=1, nodes=1, profile="qwen3-32b-tp2")
    res.requests = requests
    assert recomputed_tokens(res) == expected
    m = compute_metrics(res, True)
    assert m["recomputed_tokens"] == expected
    assert m["recompute_share"] == pytest.approx(expected / sum(r.prompt for r in requests))


def test_preemptions_from_result() -> None:
    """The preemptions metric is the SimResult's count (Σ over the engines)."""
    res = hand_result()
    assert compute_metrics(res, True)["preemptions"] == 0
    res.preemptions = 7
    assert compute_metrics(res, True)["preemptions"] == 7
    assert compute_metrics(hand_result(), True)["recomputed_tokens"] == 110 - 96


class TestPairedReport:
    """paired_comparisons pairs runs by (workers, seed); the table shows mean ± half-width."""

    @staticmethod
    def runs() -> list[Run]:
        lat = {"tao": (90.0, 105.0, 88.0), "rr": (100.0, 100.0, 80.0),
               "thunderagent-ideal": (100.0, 100.0, 100.0), "oracle": (90.0, 90.0, 90.0),
               "lower-bound": (1.0, 1.0, 1.0)}  # fmt: skip
        return [Run(p, s, 8, 2, {"latency_mean": v[s], "decode_tps": 10.0, "preemptions": 0})
                for p, v in lat.items() for s in range(3)]  # fmt: skip

    def test_rows(self) -> None:
        """tao family and oracle against every baseline (thunderagent* included), not the
        bound; hand-computed three-seed example."""
        rows = paired_comparisons(self.runs())
        pairs = {(r.policy, r.baseline) for r in rows}
        assert pairs == {("tao", "rr"), ("tao", "thunderagent-ideal"), ("oracle", "rr"),
                         ("oracle", "thunderagent-ideal")}  # fmt: skip
        row = next(
            r for r in rows if (r.policy, r.baseline, r.metric) == ("tao", "rr", "latency_mean")
        )
        assert (row.workers, row.n) == (8, 3)
        assert row.mean_pct == pytest.approx(5 / 3)
        assert row.ci_high_pct == pytest.approx(5 / 3 + _HALF3)
        assert set(row.doc()) == {"policy", "baseline", "workers", "metric", "n", "mean_pct",
                                  "ci_low_pct", "ci_high_pct"}  # fmt: skip
        # metrics absent from the runs have no row; both-zero preemptions are 0 %
        assert {r.metric for r in rows} == {"latency_mean", "decode_tps", "preemptions"}

    def test_table(self) -> None:
        """One compact row per (policy vs baseline); * marks an interval excluding 0."""
        table = comparison_table(self.runs())
        assert "tao vs rr" in table and "oracle vs thunderagent-ideal" in table
        assert f"+1.7 ± {_HALF3:.1f}" in table  # tao vs rr latency: not significant
        assert "-10.0 ± 0.0*" in table  # oracle vs thunderagent-ideal latency: zero variance
        assert "tao vs best baseline" in table

    def test_one_seed(self) -> None:
        """One seed: the difference, no interval."""
        runs = [r for r in self.runs() if r.seed == 0]
        row = next(r for r in paired_comparisons(runs) if r.policy == "tao" and r.baseline == "rr"
                   and r.metric == "latency_mean")  # fmt: skip
        assert (row.n, row.mean_pct, row.ci_low_pct, row.ci_high_pct) == (1, -10.0, None, None)
        line = next(ln for ln in comparison_table(runs).splitlines() if ln.startswith("tao vs rr"))
        assert line.split()[3:6] == ["1", "-10.0", "–"]  # seeds, latency (no ±), TTFT


def _on(session: str, turn: int, node: str) -> RequestRecord:
    return RequestRecord(session, turn, node, 0.0, 0.0, 0.0, 0.0, 10, 0, 1, None)


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        pytest.param([_on("A", 0, "n0"), _on("A", 1, "n0")], 0, id="stays"),
        pytest.param([_on("A", 0, "n0"), _on("A", 1, "n1"), _on("A", 2, "n0")], 2, id="back"),
        # per session in turn order, whatever order the records came in
        pytest.param(
            [_on("B", 1, "n1"), _on("A", 1, "n1"), _on("B", 0, "n1"), _on("A", 0, "n0")],
            1,
            id="two-sessions",
        ),
    ],
)
def test_node_moves(requests: list[RequestRecord], expected: int) -> None:
    """A request served on another node than the session's previous one is a move."""
    res = SimResult(policy="tao", seed=0, workers=1, nodes=2, profile="qwen3-32b-tp2")
    res.requests = requests
    assert node_moves(res) == expected
    m = compute_metrics(res, True)
    assert m["node_moves"] == expected
    # every request but each session's last ends in a tool: interrupts / tool calls
    res.counters["interrupts"] = 3
    assert compute_metrics(res, True)["interrupts_per_tool"] == pytest.approx(3 / len(requests))


def _at(session: str, turn: int, node: str, cached: int, release: str | None = None
        ) -> RequestRecord:  # fmt: skip
    return RequestRecord(session, turn, node, 0.0, 0.0, 0.0, 0.0, 100 * (turn + 1), cached, 10,
                         None, release)  # fmt: skip


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        # turn 1: prev ctx 110, 50 cached, same node, admitted throughout → 60 kept
        pytest.param([_at("A", 0, "n0", 0), _at("A", 1, "n0", 50)],
                     {"move": 0, "release": 0, "kept": 60, "payback": 0}, id="kept"),
        # released during the tool, back on the same node: 110 − 10 = 100 by release
        pytest.param([_at("A", 0, "n0", 0), _at("A", 1, "n0", 10, "demand")],
                     {"move": 0, "release": 100, "kept": 0, "payback": 0}, id="release"),
        # released and re-admitted elsewhere: a move, whatever the release
        pytest.param([_at("A", 0, "n0", 0), _at("A", 1, "n1", 0, "pause")],
                     {"move": 110, "release": 0, "kept": 0, "payback": 0}, id="move"),
        # two sessions, records out of order (as completions append them)
        pytest.param(
            [_at("A", 2, "n0", 200, "payback"), _at("B", 1, "n1", 100), _at("A", 0, "n1", 0),
             _at("B", 0, "n1", 0), _at("A", 1, "n0", 0, "demand")],
            # A1: moved n1 → n0, 110 lost; A2: 10 by release; B1: 10 kept
            {"move": 110, "release": 10, "kept": 10, "payback": 10}, id="two-sessions-unordered",
        ),
    ],
)  # fmt: skip
def test_recompute_by_cause(requests: list[RequestRecord], expected: dict[str, int]) -> None:
    """The split by cause sums to recomputed_tokens and is what the metrics report."""
    res = SimResult(policy="tao", seed=0, workers=1, nodes=2, profile="qwen3-32b-tp2")
    res.requests = requests
    assert recompute_by_cause(res) == expected
    assert expected["move"] + expected["release"] + expected["kept"] == recomputed_tokens(res)
    m = compute_metrics(res, True)
    assert (m["recomputed_move"], m["recomputed_release"], m["recomputed_kept"],
            m["recomputed_payback"]) == (expected["move"], expected["release"],
                                         expected["kept"], expected["payback"])  # fmt: skip
    res.counters["releases_payback"] = 2
    assert compute_metrics(res, True)["releases_payback"] == 2
