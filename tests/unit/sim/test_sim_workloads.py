"""Workload families, the TOML workload format, the trace JSONL format and distributions."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from shared.sim.dists import WorkloadError, parse_dist
from shared.sim.trace import load_trace
from shared.sim.workloads import (
    BUILTIN,
    folded_name,
    generate_tasks,
    load_workload,
    summarize,
)


class TestDists:
    """Distribution tables parse to samplers with the stated shape."""

    def test_lognormal_median_and_p90(self) -> None:
        """A log-normal given by median 0.4 and p90 0.7 samples with those quantiles."""
        d = parse_dist({"dist": "lognormal", "median": 0.4, "p90": 0.7}, "x")
        rng = np.random.default_rng(1)
        xs = np.array([d.sample(rng) for _ in range(20000)])
        assert abs(np.median(xs) - 0.4) < 0.01
        assert abs(np.percentile(xs, 90) - 0.7) < 0.02

    def test_clip(self) -> None:
        """``min``/``max`` clip every draw."""
        d = parse_dist({"dist": "uniform", "lo": 0, "hi": 100, "max": 10}, "x")
        rng = np.random.default_rng(0)
        assert max(d.sample(rng) for _ in range(200)) == 10

    def test_bad_kind_names_field(self) -> None:
        """An unknown kind is an error naming the field."""
        with pytest.raises(WorkloadError, match=r"^x\.dist:"):
            parse_dist({"dist": "pareto"}, "x")


class TestFamilies:
    """Built-in families generate deterministic tasks with their documented shape."""

    def test_deterministic_per_seed(self) -> None:
        """The same seed gives the same tasks; task i does not depend on the task count."""
        spec = load_workload("swe-lite")
        a = generate_tasks(spec, 5, 3)
        b = generate_tasks(spec, 8, 3)
        assert a == b[:5]
        assert generate_tasks(spec, 5, 4) != a

    def test_swe_lite_shape(self) -> None:
        """swe-lite: ~30 turns, context from ~5k growing to 20–40k, short tools (issue 5)."""
        tasks = generate_tasks(load_workload("swe-lite"), 200, 0)
        s = summarize(tasks)
        assert 20 <= s["turns_mean"] <= 35
        assert 20_000 <= s["final_context_p50"] <= 40_000
        assert 0.35 <= s["tool_time_median"] <= 0.45
        first = [t.prompt_tokens[0] for t in tasks]
        assert 4_500 <= float(np.mean(first)) <= 5_500

    def test_every_builtin_generates(self) -> None:
        """Each built-in family yields tasks whose last turn calls no tool."""
        for name in BUILTIN:
            for task in generate_tasks(load_workload(name), 10, 0):
                assert task.turns[-1].tool is None
                assert all(t.output >= 1 for t in task.turns)

    def test_extra_tool_delay(self) -> None:
        """--extra-tool-delay adds one per-session constant to every foreground tool call."""
        spec = load_workload("swe-lite")
        base = generate_tasks(spec, 3, 0)
        slow = generate_tasks(spec, 3, 0, extra_tool_delay=(2.0, 10.0))
        for a, b in zip(base, slow, strict=True):
            deltas = {
                round(y.duration - x.duration, 9)
                for x, y in zip(a.turns, b.turns, strict=True)
                if x.tool is not None
            }
            assert len(deltas) == 1
            assert 2.0 <= deltas.pop() <= 10.0

    def test_open_loop_arrivals(self) -> None:
        """An arrival rate gives increasing arrival times starting at 0."""
        tasks = generate_tasks(load_workload("chat"), 50, 0, arrival_rate=2.0)
        times = [t.arrival for t in tasks]
        assert times[0] == 0.0
        assert all(b is not None and a is not None and b >= a for a, b in itertools.pairwise(times))


class TestTomlWorkload:
    """A user TOML workload file is read with tomllib and validated."""

    def test_round_trip(self, tmp_path: Path) -> None:
        """A file with the documented keys generates tasks with its tools."""
        f = tmp_path / "w.toml"
        f.write_text(
            'name = "tiny"\nshared_prefix_tokens = 64\nturns = 3\n'
            "output_tokens = 10\nobservation_tokens = 32\n"
            'initial_tokens = {dist = "constant", value = 100}\n'
            '[[tools]]\nname = "x"\nduration = 0.5\n'
        )
        tasks = generate_tasks(load_workload(str(f)), 2, 0)
        assert [len(t.turns) for t in tasks] == [3, 3]
        assert tasks[0].prompt_tokens == [164, 164 + 10 + 32, 164 + 2 * 42]
        assert [t.tool for t in tasks[0].turns] == ["x", "x", None]

    def test_unknown_key(self, tmp_path: Path) -> None:
        """An unknown key is rejected by name."""
        f = tmp_path / "w.toml"
        f.write_text("turnz = 3\n")
        with pytest.raises(WorkloadError, match="turnz"):
            load_workload(str(f))

    def test_missing_file(self) -> None:
        """A name that is neither built-in nor a file says so."""
        with pytest.raises(WorkloadError, match="neither a built-in"):
            load_workload("/nonexistent/w.toml")


class TestTrace:
    """Session-trace JSONL replay."""

    def test_parse(self, tmp_path: Path) -> None:
        """prompt_tokens_added and prompt_tokens both give the growth; arrivals are relative."""
        lines = [
            {"session": "a", "start": 10.0, "shared_prefix_tokens": 16, "turns": [
                {"prompt_tokens_added": 100, "output_tokens": 5, "tool": "t",
                 "tool_start_ts": 1.0, "tool_end_ts": 1.5},
                {"prompt_tokens": 200, "output_tokens": 7}]},
            {"session": "b", "start": 12.5, "turns": [{"prompt_tokens_added": 3,
                                                       "output_tokens": 1}]},
        ]  # fmt: skip
        f = tmp_path / "t.jsonl"
        f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
        a, b = load_trace(str(f))
        assert a.arrival == 0.0 and b.arrival == 2.5
        assert a.turns[0].tool == "t" and math.isclose(a.turns[0].duration, 0.5)
        assert a.prompt_tokens == [116, 200]
        assert b.turns[0].tool is None

    def test_bad_line(self, tmp_path: Path) -> None:
        """A bad field is reported with the file, line and field."""
        f = tmp_path / "t.jsonl"
        f.write_text('{"session": "a", "turns": [{"prompt_tokens_added": 5}]}\n')
        with pytest.raises(WorkloadError, match=r"t\.jsonl:1\.turns\[0\]\.output_tokens"):
            load_trace(str(f))


class TestFoldedToolNames:
    """``fold_tools``: the same calls under the names an unlabelled harness reports."""

    @pytest.mark.parametrize(
        ("family", "labelled", "folded"),
        [("claude-code", "Bash:test", "Bash"), ("claude-code", "Read", "Read"),
         ("swe-agent", "pytest", "bash"), ("swe-agent", "make", "bash"),
         ("swe-agent", "grep", "bash"), ("swe-agent", "view", "view"),
         ("swe-lite", "python", "bash"), ("automation", "http", "http")],
    )  # fmt: skip
    def test_names(self, family: str, labelled: str, folded: str) -> None:
        assert folded_name(family, labelled) == folded

    @pytest.mark.parametrize("family", ["claude-code", "swe-agent"])
    def test_same_calls_other_names(self, family: str) -> None:
        spec = load_workload(family)
        plain = generate_tasks(spec, 20, 3)
        folded = generate_tasks(spec, 20, 3, fold_tools=True)
        names = set()
        for a, b in zip(plain, folded, strict=True):
            assert len(a.turns) == len(b.turns)
            for x, y in zip(a.turns, b.turns, strict=True):
                assert (x.added, x.output, x.duration, x.timeout) == (
                    y.added, y.output, y.duration, y.timeout
                )  # fmt: skip
                assert y.tool == (None if x.tool is None else folded_name(family, x.tool))
                names.add(y.tool)
        assert not names & {"Bash:test", "pytest", "make"}  # test runs share the shell's name


class TestWriteTrace:
    """A generated workload written as a trace reads back as the same tasks, so the live demo
    and the simulator run one workload (`tao sim --write-trace`)."""

    def test_round_trip(self, tmp_path: Path) -> None:
        from shared.cli.main import main

        root = Path(__file__).resolve().parents[3]
        workload = str(root / "benchmarks" / "workloads" / "live-cpu.toml")
        path = tmp_path / "live.jsonl"
        assert main(["sim", "--workload", workload, "--tasks", "24",
                     "--write-trace", str(path)]) == 0  # fmt: skip
        assert load_trace(str(path)) == generate_tasks(load_workload(workload), 24, 0)
