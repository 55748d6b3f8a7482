"""``tao demo``: default policies, the serving node read from a completion id, the metrics."""

from __future__ import annotations

import argparse

import pytest

from shared.cli.demo import DemoResult, add_demo_parser, demo_table, served_by


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
