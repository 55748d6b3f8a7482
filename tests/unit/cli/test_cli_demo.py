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
