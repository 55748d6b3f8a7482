"""``tao sim --describe-workload``: a family's fit beside the published figures it cites."""

from __future__ import annotations

import math

import pytest

from shared.sim.describe import SOURCES, describe, measure
from shared.sim.workloads import Task, Turn, generate_tasks, load_workload


def _task(durations: list[float]) -> Task:
    turns = [Turn(100, 10, "t", d) for d in durations] + [Turn(100, 10)]
    return Task("x", "f", 50, tuple(turns))


class TestMeasure:
    """Each figure is computed on the generated tool calls and turns."""

    def test_bands_and_time_share(self) -> None:
        """Four calls: one in each duration band; the minute-long one holds most time."""
        got = measure([_task([0.5, 5.0, 30.0, 120.0])])
        assert got["calls < 1 s"] == got["calls 1-10 s"] == 0.25
        assert got["calls 10-60 s"] == got["calls > 60 s"] == 0.25
        assert got["time in calls > 60 s"] == pytest.approx(120.0 / 155.5)
        assert got["longest call per task p50 s"] == 120.0
        assert got["turns p50"] == 5.0
        assert got["context per call mean tok"] == pytest.approx(
            sum(_task([0.5, 5.0, 30.0, 120.0]).prompt_tokens) / 5
        )

    def test_no_tools(self) -> None:
        """A family without tools has no tool figures, and says so."""
        got = measure([Task("x", "f", 0, (Turn(10, 10),))])
        assert "tool p50 s" not in got and got["longest call per task p50 s"] == 0.0
        assert "–" in describe("chat", [Task("x", "f", 0, (Turn(10, 10),))])


class TestFits:
    """The built-in families fitted to measurements stay inside what their sources report
    (swe-agent's are ranges over two models; claude-code's single figures within a margin)."""

    def test_swe_agent_inside_the_ranges(self) -> None:
        got = measure(generate_tasks(load_workload("swe-agent"), 400, 0))
        assert 0.38 <= got["tool p50 s"] <= 0.46
        assert 0.024 <= got["calls > 10 s"] <= 0.037
        assert 0.006 <= got["calls > 60 s"] <= 0.0105
        assert 16 <= got["longest call per task p50 s"] <= 39
        assert 35_000 <= got["context per call mean tok"] <= 45_000

    def test_claude_code_near_tracelab(self) -> None:
        got = measure(generate_tasks(load_workload("claude-code"), 400, 0))
        src = SOURCES["claude-code"]
        assert abs(got["tool p50 s"] - src["tool p50 s"]) < 0.15
        assert abs(got["calls > 60 s"] - src["calls > 60 s"]) < 0.015
        assert abs(got["calls < 1 s"] - src["calls < 1 s"]) < 0.06
        assert got["time in calls > 60 s"] > 0.7
        assert not math.isnan(got["tool p99 s"])

    def test_cli_prints_both_columns(self, capsys: pytest.CaptureFixture[str]) -> None:
        from shared.cli.main import main

        assert (
            main(["sim", "--workload", "claude-code", "--tasks", "50", "--describe-workload"]) == 0
        )
        out = capsys.readouterr().out
        assert "this fit" in out and "source" in out and "0.3" in out
