"""Tool-call end prediction: statistics, the finite-sample bound and the evidence precedence."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.predictor import (
    DEFAULT_DURATION_S,
    History,
    Prediction,
    ToolCallView,
    ToolStats,
    censor,
    duration_bound,
    estimate_duration,
    fold,
    margin_factor,
    predict_end,
    record,
    record_censored,
    t_quantile,
    update,
)


def _history(**tools: list[float]) -> History:
    h = History()
    for name, durations in tools.items():
        for d in durations:
            h = record(h, name, d)
    return h


class TestTQuantile:
    """t_{ν, 0.90} matches the standard table and tends to the normal quantile."""

    @pytest.mark.parametrize(
        ("df", "expected"),
        [(1, 3.0777), (2, 1.8856), (5, 1.4759), (10, 1.3722), (30, 1.3104), (31, 1.3095),
         (60, 1.2958), (120, 1.2886), (10**6, 1.2816)],
    )  # fmt: skip
    def test_table(self, df: int, expected: float) -> None:
        """Each row is the textbook quantile to 4 decimals."""
        assert t_quantile(df) == pytest.approx(expected, abs=1e-4)

    def test_exact_small_df(self) -> None:
        """ν=1 is tan(0.4π) and ν=2 is 0.8/sqrt(0.18), both closed forms."""
        assert t_quantile(1) == pytest.approx(math.tan(0.4 * math.pi), abs=1e-4)
        assert t_quantile(2) == pytest.approx(0.8 / math.sqrt(0.18), abs=1e-4)

    def test_decreasing(self) -> None:
        """More degrees of freedom never widen the quantile."""
        values = [t_quantile(df) for df in range(1, 500)]
        assert all(a > b for a, b in itertools.pairwise(values))
        assert values[-1] > 1.2815516

    def test_df_zero_rejected(self) -> None:
        """ν must be at least 1."""
        with pytest.raises(ValueError, match="df"):
            t_quantile(0)

    @pytest.mark.parametrize(
        ("n", "expected"),
        [(2, 3.0777 * math.sqrt(1.5)), (3, 1.8856 * math.sqrt(4 / 3)),
         (11, 1.3722 * math.sqrt(12 / 11))],
    )  # fmt: skip
    def test_margin_factor(self, n: int, expected: float) -> None:
        """The margin factor is t_{n-1} * sqrt(1 + 1/n)."""
        assert margin_factor(n) == pytest.approx(expected)


class TestToolStats:
    """Welford's update agrees with the textbook statistics; censored calls are not durations."""

    @given(st.lists(st.floats(0, 1e4, allow_nan=False), min_size=2, max_size=50))
    def test_welford_matches_statistics(self, xs: list[float]) -> None:
        """count, mean, sample variance, min and max equal those of the list."""
        s = fold(xs)
        assert s.count == len(xs)
        assert s.mean == pytest.approx(statistics.fmean(xs), rel=1e-9, abs=1e-9)
        assert s.variance == pytest.approx(statistics.variance(xs), rel=1e-6, abs=1e-6)
        assert (s.min_s, s.max_s) == (min(xs), max(xs))

    def test_update_is_pure(self) -> None:
        """update returns a new value and leaves its input alone."""
        s0 = ToolStats()
        s1 = update(s0, 3.0)
        assert s0 == ToolStats()
        assert (s1.count, s1.mean, s1.variance) == (1, 3.0, 0.0)

    @pytest.mark.parametrize("bad", [-0.1, math.inf, math.nan])
    def test_bad_duration_rejected(self, bad: float) -> None:
        """Negative and non-finite durations are errors."""
        with pytest.raises(ValueError, match="duration"):
            update(ToolStats(), bad)

    def test_censor_does_not_count(self) -> None:
        """A cut call leaves count, mean, variance and range unchanged."""
        s = fold([1.0, 2.0, 3.0])
        c = censor(censor(s, 30.0), 10.0)
        assert (c.count, c.mean, c.m2, c.min_s, c.max_s) == (s.count, s.mean, s.m2, 1.0, 3.0)
        assert (c.censored, c.censored_max_s) == (2, 30.0)


class TestDurationBound:
    """The bound is mean + t * s * sqrt(1 + 1/n), clipped to [min, max(max, censored max)]."""

    @pytest.mark.parametrize(
        ("durations", "censored", "expected"),
        [
            ([], [], None),
            ([4.0], [], None),  # one sample is not enough
            ([2.0, 2.0], [], 2.0),  # no spread
            ([1.0, 2.0, 3.0], [], 3.0),  # 2 + 1.8856*1*1.1547 = 4.18 clipped to max
            ([1.0, 2.0, 3.0], [10.0], 2.0 + 1.8856 * math.sqrt(4 / 3)),  # censored widens hi
            ([1.0, 2.0, 3.0], [2.5], 3.0),  # a short cut does not lower hi
            (
                [float(x) for x in range(1, 11)],
                [],
                5.5 + 1.3830 * statistics.stdev(range(1, 11)) * math.sqrt(1.1),
            ),
        ],
    )
    def test_table(
        self, durations: list[float], censored: list[float], expected: float | None
    ) -> None:
        """Each row gives the documented bound."""
        s = fold(durations)
        for c in censored:
            s = censor(s, c)
        got = duration_bound(s)
        if expected is None:
            assert got is None
        else:
            assert got == pytest.approx(expected, abs=1e-9)


class TestHistoryFallback:
    """Estimates come from the tool's history, else the global one, else 5 s."""

    @pytest.mark.parametrize(
        ("history", "tool", "evidence", "value"),
        [
            (_history(bash=[2.0, 2.0]), "bash", "history:tool", 2.0),
            (_history(bash=[2.0], grep=[1.0, 1.0]), "bash", "history:global", 2.0),  # clip max
            (_history(grep=[3.0, 3.0]), "bash", "history:global", 3.0),
            (_history(bash=[2.0]), "bash", "default", DEFAULT_DURATION_S),
            (History(), "bash", "default", DEFAULT_DURATION_S),
        ],
    )
    def test_chain(self, history: History, tool: str, evidence: str, value: float) -> None:
        """Each row falls back to the expected source."""
        got, source = estimate_duration(history, tool)
        assert got == pytest.approx(value)
        assert source == evidence

    def test_censored_recorded_in_both(self) -> None:
        """A cut call is counted as censored for the tool and globally, not as a duration."""
        h = record_censored(_history(bash=[1.0, 1.0]), "bash", 120.0)
        assert (h.of("bash").count, h.of("bash").censored) == (2, 1)
        assert (h.overall.count, h.overall.censored_max_s) == (2, 120.0)
        assert estimate_duration(h, "bash") == (1.0, "history:tool")


class TestEstimateMemo:
    """A history keeps its estimates (it never changes); a recorded sample makes a new one."""

    def test_kept_answers_are_the_fresh_ones_and_a_record_starts_anew(self) -> None:
        h = _history(bash=[2.0, 2.0], grep=[1.0, 1.0, 1.5])
        first = {tool: estimate_duration(h, tool) for tool in ("bash", "grep", "ls")}
        assert set(h.estimates) == {"bash", "grep", "ls"}
        again = {tool: estimate_duration(h, tool) for tool in ("bash", "grep", "ls")}
        fresh = _history(bash=[2.0, 2.0], grep=[1.0, 1.0, 1.5])
        assert again == first == {t: estimate_duration(fresh, t) for t in first}
        assert h == _history(bash=[2.0, 2.0], grep=[1.0, 1.0, 1.5])  # the memo is not compared
        later = record(h, "bash", 30.0)
        assert later.estimates == {}
        assert estimate_duration(later, "bash")[0] > first["bash"][0]
        assert estimate_duration(h, "bash") == first["bash"]


class TestPredictEnd:
    """Observed completion beats interface evidence, which beats history; deadlines cap."""

    H = _history(bash=[10.0, 10.0])  # bound: exactly 10 s

    @pytest.mark.parametrize(
        ("call", "now", "expected"),
        [
            (ToolCallView("bash", 100.0), 101.0, Prediction(110.0, "history:tool", 100.0)),
            (ToolCallView("x", 100.0), 101.0, Prediction(110.0, "history:global", 100.0)),
            (
                ToolCallView("bash", 100.0, completed_at=103.0, expected_end=200.0),
                104.0,
                Prediction(103.0, "completed", 103.0),
            ),
            (
                ToolCallView("bash", 100.0, background=True, expected_end=200.0),
                104.0,
                Prediction(100.0, "background", 100.0),
            ),
            (
                ToolCallView("bash", 100.0, expected_end=150.0, expected_end_ts=102.0),
                104.0,
                Prediction(150.0, "expected_end", 102.0),
            ),
            (  # progress 25 % after 10 s → 40 s total
                ToolCallView("bash", 100.0, progress=0.25, progress_ts=110.0),
                111.0,
                Prediction(140.0, "progress", 110.0),
            ),
            (  # newer progress beats older expected_end
                ToolCallView("bash", 100.0, expected_end=150.0, expected_end_ts=101.0,
                             progress=0.5, progress_ts=110.0),
                111.0,
                Prediction(120.0, "progress", 110.0),
            ),
            (  # equal timestamps: expected_end wins
                ToolCallView("bash", 100.0, expected_end=150.0, expected_end_ts=110.0,
                             progress=0.5, progress_ts=110.0),
                111.0,
                Prediction(150.0, "expected_end", 110.0),
            ),
            (  # progress complete but no end seen: end at the report
                ToolCallView("bash", 100.0, progress=1.0, progress_ts=105.0),
                106.0,
                Prediction(105.0, "progress", 105.0),
            ),
            (  # zero progress carries no information: history
                ToolCallView("bash", 100.0, progress=0.0, progress_ts=105.0),
                106.0,
                Prediction(110.0, "history:tool", 100.0),
            ),
            (  # deadline caps history; its evidence is current until it passes
                ToolCallView("bash", 100.0, deadline=105.0),
                103.0,
                Prediction(105.0, "deadline", 103.0),
            ),
            (
                ToolCallView("bash", 100.0, deadline=105.0),
                107.0,
                Prediction(105.0, "deadline", 105.0),
            ),
            (  # a later deadline does not move the prediction
                ToolCallView("bash", 100.0, deadline=220.0),
                103.0,
                Prediction(110.0, "history:tool", 100.0),
            ),
            (  # deadline caps an explicit expected_end too
                ToolCallView("bash", 100.0, expected_end=300.0, expected_end_ts=101.0,
                             deadline=160.0),
                102.0,
                Prediction(160.0, "deadline", 102.0),
            ),
            (  # evidence stamped in the future (skew) reads as now
                ToolCallView("bash", 100.0, expected_end=150.0, expected_end_ts=130.0),
                120.0,
                Prediction(150.0, "expected_end", 120.0),
            ),
        ],
    )  # fmt: skip
    def test_precedence(self, call: ToolCallView, now: float, expected: Prediction) -> None:
        """Each row picks the documented evidence and end."""
        assert predict_end(call, self.H, now) == expected

    def test_remaining_floors_at_zero(self) -> None:
        """Remaining time is the end minus now, never negative."""
        p = Prediction(110.0, "history:tool", 100.0)
        assert (p.remaining(104.0), p.remaining(120.0)) == (6.0, 0.0)

    def test_default_without_history(self) -> None:
        """No history anywhere: the call is assumed to take 5 s."""
        got = predict_end(ToolCallView("bash", 10.0), History(), 11.0)
        assert got == Prediction(15.0, "default", 10.0)
