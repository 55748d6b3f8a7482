"""Each metric against a tiny hand-computed scenario, and the comparison table's arithmetic."""

from __future__ import annotations

import pytest

from shared.sim.metrics import compute_metrics, improvement
from shared.sim.records import RequestRecord, Sample, SimResult, TaskRecord, TickRecord
from shared.sim.report import aggregate, comparison_table
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
