"""Readiness r: completion, a one-tick probe past the predicted end, horizon with freshness."""

from __future__ import annotations

import pytest

from shared.core.predictor import (
    Evidence,
    History,
    Prediction,
    ToolCallView,
    predict_end,
    record,
)
from shared.core.readiness import ReadinessResult, ReadinessState, readiness


def _p(end: float, ts: float, evidence: Evidence = "history:tool") -> Prediction:
    return Prediction(end, evidence, ts)


SPENT = ReadinessResult(0, "probe-spent", probe_mark=0.0)


class TestReadinessRules:
    """Each rule fires in its documented order and reports its name."""

    @pytest.mark.parametrize(
        ("state", "now", "expected"),
        [
            (ReadinessState(None), 5.0, ReadinessResult(1, "not-in-tool")),
            (ReadinessState(None, 3.0), 5.0, ReadinessResult(1, "not-in-tool", probe_mark=3.0)),
            (ReadinessState(_p(4.0, 4.0, "completed")), 5.0, ReadinessResult(1, "completed")),
            (ReadinessState(_p(0.0, 0.0, "background")), 99.0, ReadinessResult(1, "completed")),
            # predicted end passed, no completion: probe once
            (ReadinessState(_p(10.0, 0.0)), 10.5, ReadinessResult(1, "probe", True, 0.0)),
            (ReadinessState(_p(10.0, 0.0)), 10.0, ReadinessResult(1, "probe", True, 0.0)),
            (ReadinessState(_p(10.0, 0.0), 0.0), 11.5, SPENT),
            # the probe ignores freshness: long past and stale still probes once
            (ReadinessState(_p(10.0, 0.0)), 500.0, ReadinessResult(1, "probe", True, 0.0)),
            # new evidence (newer ts) re-arms the probe
            (ReadinessState(_p(10.0, 8.0), 0.0), 11.0, ReadinessResult(1, "probe", True, 8.0)),
            # horizon boundary (H = 1 s, inclusive)
            (ReadinessState(_p(10.0, 0.0)), 9.0, ReadinessResult(1, "horizon")),
            (ReadinessState(_p(10.0, 0.0)), 8.999, ReadinessResult(0, "beyond-horizon")),
            (ReadinessState(_p(10.0, 0.0)), 9.5, ReadinessResult(1, "horizon")),
            # freshness boundary (30 s, inclusive)
            (ReadinessState(_p(40.5, 10.0)), 40.0, ReadinessResult(1, "horizon")),
            (ReadinessState(_p(40.5, 9.0)), 40.0, ReadinessResult(0, "stale")),
            (ReadinessState(_p(100.0, 9.0)), 40.0, ReadinessResult(0, "stale")),
            # evidence stamped after now (skew) is fresh
            (ReadinessState(_p(10.0, 12.0)), 9.5, ReadinessResult(1, "horizon")),
        ],
    )  # fmt: skip
    def test_table(self, state: ReadinessState, now: float, expected: ReadinessResult) -> None:
        """Each row yields the expected r, rule and probe bookkeeping."""
        assert readiness(state, now) == expected

    @pytest.mark.parametrize(
        ("horizon", "freshness", "now", "r"),
        [(5.0, 30.0, 5.0, 1), (0.5, 30.0, 9.0, 0), (1.0, 2.0, 9.0, 0), (1.0, 9.0, 9.0, 1)],
    )
    def test_knobs(self, horizon: float, freshness: float, now: float, r: int) -> None:
        """Horizon and freshness are parameters."""
        got = readiness(
            ReadinessState(_p(10.0, 0.0)), now, horizon_s=horizon, freshness_s=freshness
        )
        assert got.r == r


class TestProbeLifecycle:
    """Past its predicted end a session is ready for one tick, then not until new evidence."""

    def test_ticks(self) -> None:
        """Ticks at 1 s: horizon, probe, spent, spent; a progress report re-arms one probe."""
        h = record(record(History(), "bash", 10.0), "bash", 10.0)
        call = ToolCallView("bash", 100.0)
        mark: float | None = None
        seen: list[tuple[int, str]] = []
        for now in (109.5, 110.5, 111.5, 112.5):
            res = readiness(ReadinessState(predict_end(call, h, now), mark), now)
            mark = res.probe_mark
            seen.append((res.r, res.rule))
        assert seen == [(1, "horizon"), (1, "probe"), (0, "probe-spent"), (0, "probe-spent")]
        # a progress report says 50 % done after 13 s: the end moves to 126 s
        late = ToolCallView("bash", 100.0, progress=0.5, progress_ts=113.0)
        res = readiness(ReadinessState(predict_end(late, h, 113.5), mark), 113.5)
        assert (res.r, res.rule) == (0, "beyond-horizon")
        # a report that the end has passed re-arms exactly one probe
        done = ToolCallView("bash", 100.0, progress=1.0, progress_ts=114.0)
        res = readiness(ReadinessState(predict_end(done, h, 114.5), mark), 114.5)
        assert (res.r, res.rule, res.probe_mark) == (1, "probe", 114.0)
        mark = res.probe_mark
        res = readiness(ReadinessState(predict_end(done, h, 115.5), mark), 115.5)
        assert (res.r, res.rule) == (0, "probe-spent")

    def test_deadline_probe_fires_once(self) -> None:
        """A passed deadline probes once; its evidence time stays at the deadline afterwards."""
        call = ToolCallView("bash", 0.0, deadline=60.0)
        h = record(record(History(), "bash", 100.0), "bash", 100.0)
        first = readiness(ReadinessState(predict_end(call, h, 59.5)), 59.5)
        assert (first.r, first.rule) == (1, "horizon")
        second = readiness(ReadinessState(predict_end(call, h, 61.0), first.probe_mark), 61.0)
        third = readiness(ReadinessState(predict_end(call, h, 62.0), second.probe_mark), 62.0)
        assert [(x.r, x.rule) for x in (second, third)] == [(1, "probe"), (0, "probe-spent")]

    def test_completion_overrides_spent_probe(self) -> None:
        """An observed completion is ready even after the probe was spent."""
        call = ToolCallView("bash", 0.0, completed_at=30.0)
        res = readiness(ReadinessState(predict_end(call, History(), 31.0), 0.0), 31.0)
        assert (res.r, res.rule) == (1, "completed")
