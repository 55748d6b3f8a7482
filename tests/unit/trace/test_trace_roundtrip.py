"""Imported traces read back through the simulator's reader (shared/sim/trace.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from shared.cli.trace import import_files
from shared.sim.dists import WorkloadError
from shared.sim.trace import load_trace
from shared.sim.workloads import Task

FIX = Path(__file__).parents[2] / "fixtures"
SOURCES = {
    "mini-swe-agent": FIX / "mini-swe-agent" / "example.traj.json",
    "claude-code": FIX / "claude-code" / "session.jsonl",
    "opencode": FIX / "opencode" / "session-events.jsonl",
}


def load(tmp_path: Path, records: list[dict[str, object]]) -> list[Task]:
    f = tmp_path / "trace.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in records))
    return load_trace(str(f))


class TestRoundTrip:
    """The reader turns imported records back into the recorded prompts, tools and arrivals."""

    @pytest.mark.parametrize("source", list(SOURCES))
    def test_prompts_and_tools(self, tmp_path: Path, source: str) -> None:
        """Every turn's prompt is the recorded prompt (it grows in all fixtures); every turn but
        the last carries the recorded tool and duration."""
        records = import_files(source, [str(SOURCES[source])])
        tasks = load(tmp_path, records)
        assert [t.id for t in tasks] == [r["session"] for r in records]
        for task, rec in zip(tasks, records, strict=True):
            turns = rec["turns"]
            assert isinstance(turns, list)
            assert task.prompt_tokens == [t["prompt_tokens"] for t in turns]
            assert [t.output for t in task.turns] == [t["output_tokens"] for t in turns]
            for tt, rt in zip(task.turns[:-1], turns[:-1], strict=True):
                assert tt.tool == rt.get("tool")
                assert tt.duration == pytest.approx(rt.get("tool_duration_s", 0.0))

    def test_arrivals(self, tmp_path: Path) -> None:
        """Arrivals are relative to the earliest session (the Claude Code subagent at 16.1 s)."""
        tasks = load(tmp_path, import_files("claude-code", [str(SOURCES["claude-code"])]))
        assert [t.arrival for t in tasks] == pytest.approx([0.0, 16.1])

    def test_timeout_and_background(self, tmp_path: Path) -> None:
        """tool_timeout_s and background reach the simulator's Turn."""
        tasks = load(tmp_path, import_files("claude-code", [str(SOURCES["claude-code"])]))
        assert tasks[0].turns[0].timeout == 60.0 and tasks[0].turns[0].background is False


class TestReaderCompatibility:
    """cached_tokens and tools are checked but change nothing the simulator sees."""

    BASE: ClassVar[dict[str, Any]] = {"session": "a", "start": 0.0, "turns": [
        {"prompt_tokens": 100, "output_tokens": 5, "tool": "t", "tool_duration_s": 1.0},
        {"prompt_tokens": 180, "output_tokens": 7}]}  # fmt: skip

    def test_same_tasks(self, tmp_path: Path) -> None:
        """A trace with cached_tokens / tools loads to exactly the tasks of one without."""
        plain = load(tmp_path, [self.BASE])
        extended = json.loads(json.dumps(self.BASE))
        extended["turns"][0] |= {"cached_tokens": 64, "tools": ["t", "u"]}
        extended["turns"][1]["cached_tokens"] = 100
        assert load(tmp_path, [extended]) == plain

    @pytest.mark.parametrize(
        ("field", "value", "message"),
        [
            ("cached_tokens", -1, r"turns\[0\]\.cached_tokens: must be an integer >= 0"),
            ("cached_tokens", "64", r"turns\[0\]\.cached_tokens"),
            ("tools", "t", r"turns\[0\]\.tools: must be a list of strings"),
            ("tools", [1], r"turns\[0\]\.tools"),
        ],
    )
    def test_bad_values(self, tmp_path: Path, field: str, value: object, message: str) -> None:
        """Wrong types are reported with file, line and field."""
        doc = json.loads(json.dumps(self.BASE))
        doc["turns"][0][field] = value
        with pytest.raises(WorkloadError, match=r"trace\.jsonl:1\." + message):
            load(tmp_path, [doc])
