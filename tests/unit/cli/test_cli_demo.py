"""``tao demo``: default policies, the serving node read from a completion id, the metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from shared.cli.demo import (
    DemoError,
    DemoResult,
    add_demo_parser,
    counted_since,
    demo_table,
    gateway_key,
    served_by,
)


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_demo_parser(p.add_subparsers())
    return p.parse_args(["demo", *argv])


class TestDemo:
    def test_default_policies_compare_tao_with_both_thunderagents(self) -> None:
        assert parse().policies == "tao,thunderagent,thunderagent-ideal"

    @pytest.mark.parametrize(
        ("cid", "node"),
        [
            ("chatcmpl-sim0-17", "sim0"),
            ("chatcmpl-node-a-3", "node-a"),
            ("chatcmpl-3f2a9c0d1e", None),  # vLLM: a random id, no node
            ("chatcmpl-sim0-x", None),
            ("cmpl-sim0-1", None),
            (None, None),
        ],
    )
    def test_served_by(self, cid: str | None, node: str | None) -> None:
        """A simnode's completion id names its node; other ids name none."""
        assert served_by(cid) == node

    def test_rates(self) -> None:
        """Interrupts per tool call from the planner counter; node moves per session only when
        some completion named its node."""
        r = DemoResult("thunderagent", sessions=4, tool_calls=20, node_moves=6, served_known=True)
        r.planner = {"sessions_interrupted": 5}
        row = r.row()
        assert row["interrupts_per_tool_call"] == 0.25
        assert row["node_moves_per_session"] == 1.5
        blind = DemoResult("tao", sessions=4, tool_calls=0, node_moves=0).row()
        assert blind["interrupts_per_tool_call"] is None
        assert blind["node_moves_per_session"] is None
        table = demo_table([r])
        assert "interrupts / tool call" in table and "node moves / session" in table


class TestProgress:
    async def test_progress_lines_on_stderr(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A run reports tasks done, turns and tool calls every PROGRESS_S on stderr (it was
        silent for ~35 s per policy); with --json it says nothing."""
        import argparse
        import asyncio
        import time

        from shared.cli import demo

        monkeypatch.setattr(demo, "PROGRESS_S", 0.01)
        result = demo.DemoResult(policy="tao", sessions=4, tasks_done=1, tool_calls=3)
        result.ttfts = [0.1, 0.2]
        for as_json, expect in ((False, True), (True, False)):
            task = asyncio.create_task(
                demo._progress(result, time.monotonic(), argparse.Namespace(json=as_json))
            )
            await asyncio.sleep(0.05)
            task.cancel()
            out, err = capsys.readouterr()
            assert out == ""
            line = "tao demo: tao: 1/4 tasks done, 2 turns, 3 tool calls"
            assert (line in err) is expect


class TestRepeat:
    @staticmethod
    def result(policy: str, rep: int, latencies: list[float]) -> DemoResult:
        r = DemoResult(policy, sessions=len(latencies), tasks_done=len(latencies), repeat=rep)
        r.latencies = latencies
        r.ttfts = [1.0]
        r.prompt_tokens, r.cached_tokens = 100, 50
        return r

    def test_cells_and_paired_difference(self) -> None:
        """Three repeats each: cells are mean ± sd; tao's paired latency difference to the
        first policy is the mean of −10, −20, −30 % ± t(0.975, 2)·10/√3 = 24.8 %."""
        runs = [self.result("thunderagent", k, [10.0]) for k in range(3)]
        runs += [self.result("tao", k, [9.0 - k]) for k in range(3)]  # −10, −20, −30 %
        text = demo_table(runs)
        head = text.splitlines()[0].split()
        assert head == ["metric", "thunderagent", "tao"]
        latency = next(ln for ln in text.splitlines() if ln.startswith("task latency mean"))
        assert "10.00 ± 0.00 s" in latency and "8.00 ± 1.00 s" in latency
        assert "tao vs thunderagent: makespan -, task latency mean -20.0 ± 24.8%," in text
        assert "TTFT mean +0.0 ± 0.0%" in text  # identical: no -0.0, no star

    def test_one_run_prints_no_paired_lines(self) -> None:
        text = demo_table([self.result("a", 0, [1.0]), self.result("b", 0, [2.0])])
        assert "paired" not in text and "1.00 s" in text

    def test_bad_repeat_is_one_line(self) -> None:
        from shared.cli.main import main

        assert main(["demo", "--repeat", "0"]) == 2


class TestMeasuredLoad:
    """The built-in sessions draw their tools from a measured family, scaled to the machine."""

    def test_default_is_claude_code_scaled_by_ten(self) -> None:
        """Default ``--workload claude-code --tool-scale 10``."""
        args = parse()
        assert (args.workload, args.tool_scale) == ("claude-code", 10.0)

    def test_family_tool_keeps_the_shape(self) -> None:
        """Names come from the family; durations are its draws divided by the scale (the
        median of many draws near the family's, a tenth of it scaled)."""
        import random
        import statistics

        from shared.cli.demo import family_tool
        from shared.sim.workloads import load_workload

        tools = load_workload("claude-code").tools
        one = [family_tool(tools, 1.0, random.Random(7)) for _ in range(1)]
        ten = [family_tool(tools, 10.0, random.Random(7)) for _ in range(1)]
        assert one[0][0] == ten[0][0] and ten[0][1] == pytest.approx(one[0][1] / 10)
        rng = random.Random(0)
        draws = [family_tool(tools, 1.0, rng) for _ in range(4000)]
        assert {n for n, _ in draws} == {t.name for t in tools}
        median = statistics.median(d for _, d in draws)
        assert 0.2 < median < 0.6  # TraceLab's p50 is 0.3 s

    @pytest.mark.parametrize(
        "argv",
        [["--workload", "nope"], ["--workload", "chat"], ["--tool-scale", "0"]],
    )
    def test_bad_workload_is_one_line(self, argv: list[str]) -> None:
        """An unknown family, one without tools, or a non-positive scale: exit 2."""
        from shared.cli.main import main

        assert main(["demo", *argv]) == 2


class TestWarmUpCounters:
    def test_the_warm_ups_plans_are_not_the_runs(self) -> None:
        """Planner counters are reported less the warm-up's; other values as read."""
        before = {"plans_applied": 3, "ticks": 10, "solve_ms": {"n": 3}}
        after = {"plans_applied": 20, "ticks": 50, "solve_ms": {"n": 40}, "fallbacks": 0}
        assert counted_since(after, before) == {
            "plans_applied": 17,
            "ticks": 40,
            "solve_ms": {"n": 40},
            "fallbacks": 0,
        }


class TestGatewayKey:
    def test_the_demo_sends_the_gateways_key(self, tmp_path: Path) -> None:
        """TAO_GATEWAY_KEY, else TAO_GATEWAY_KEY_FILE's content, else a placeholder (a
        loopback gateway asks for none)."""
        key_file = tmp_path / "key"
        key_file.write_text("from-file\n")
        assert gateway_key({"TAO_GATEWAY_KEY": "k1", "TAO_GATEWAY_KEY_FILE": str(key_file)}) == "k1"
        assert gateway_key({"TAO_GATEWAY_KEY_FILE": str(key_file)}) == "from-file"
        assert gateway_key({}) == "tao-demo"

    def test_an_unreadable_key_file_is_named(self, tmp_path: Path) -> None:
        with pytest.raises(DemoError, match="TAO_GATEWAY_KEY_FILE: cannot read"):
            gateway_key({"TAO_GATEWAY_KEY_FILE": str(tmp_path / "missing")})
