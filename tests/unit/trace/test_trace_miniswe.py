"""mini-swe-agent ``.traj.json`` import: turns, tool windows, and clear errors for bad files."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from shared.trace import TraceImportError, from_miniswe

FIXTURE = Path(__file__).parents[2] / "fixtures" / "mini-swe-agent" / "example.traj.json"


def write(tmp_path: Path, doc: Any, name: str = "run.traj.json") -> str:
    f = tmp_path / name
    f.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(f)


def assistant(prompt: int, out: int, ts: float | None, n_actions: int = 1, **usage: Any) -> dict:
    extra: dict[str, Any] = {
        "actions": [{"command": f"cmd{i}"} for i in range(n_actions)],
        "response": {"usage": {"prompt_tokens": prompt, "completion_tokens": out, **usage}},
    }
    if ts is not None:
        extra["timestamp"] = ts
    return {"role": "assistant", "content": "```mswea_bash_command\nls\n```", "extra": extra}


def observation(ts: float | None, role: str = "user") -> dict:
    extra: dict[str, Any] = {"raw_output": "ok", "returncode": 0}
    if ts is not None:
        extra["timestamp"] = ts
    return {"role": role, "content": "<returncode>0</returncode>", "extra": extra}


def traj(*messages: dict, fmt: str = "mini-swe-agent-1.1") -> dict:
    head = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    return {"info": {}, "messages": head + list(messages), "trajectory_format": fmt}


class TestFixture:
    """The shared example trajectory gives its two calls and tool windows, checked by hand."""

    def test_records(self) -> None:
        """5120/96 then 5410/120 tokens; tools 1767225604.62−1767225600.1 and …11.31−…07.9 s."""
        result = from_miniswe(str(FIXTURE))
        assert result.summary() == "1 session, 2 turns, 2 tools"
        (rec,) = result.records()
        assert rec["session"] == "example" and rec["family"] == "mini-swe-agent"
        assert rec["start"] == 0.0
        t0, t1 = rec["turns"]
        assert (t0["prompt_tokens"], t0["output_tokens"]) == (5120, 96)
        assert "cached_tokens" not in t0  # the fixture's usage has no cache figure
        assert t0["tool"] == "bash" and math.isclose(t0["tool_duration_s"], 4.52)
        assert t0["response_ts"] == t0["tool_start_ts"] == 1767225600.1
        assert t0["tool_end_ts"] == 1767225604.62 and "request_ts" not in t0
        assert (t1["prompt_tokens"], t1["output_tokens"]) == (5410, 120)
        assert t1["request_ts"] == 1767225604.62  # sent right after the observation
        assert math.isclose(t1["tool_duration_s"], 3.41)


class TestTurns:
    """Usage shapes, several actions, text-based observations and missing timestamps."""

    def test_cached_tokens(self, tmp_path: Path) -> None:
        """prompt_tokens_details.cached_tokens (OpenAI / LiteLLM) becomes cached_tokens."""
        doc = traj(assistant(900, 10, 1.0, prompt_tokens_details={"cached_tokens": 640}))
        (turn,) = from_miniswe(write(tmp_path, doc)).records()[0]["turns"]
        assert turn["cached_tokens"] == 640 and turn["prompt_tokens"] == 900

    def test_several_actions_share_the_window(self, tmp_path: Path) -> None:
        """Two actions run one after another: each spans the whole window, names listed."""
        doc = traj(assistant(100, 5, 10.0, n_actions=2), observation(13.0), observation(13.0))
        (turn,) = from_miniswe(write(tmp_path, doc)).records()[0]["turns"]
        assert turn["tool_duration_s"] == 3.0 and turn["tools"] == ["bash", "bash"]

    def test_tool_role_and_tool_call_names(self, tmp_path: Path) -> None:
        """Tool-calling models: role "tool" observations and function names from tool_calls."""
        a = assistant(100, 5, 10.0)
        a["tool_calls"] = [{"id": "c1", "type": "function",
                            "function": {"name": "bash", "arguments": "{}"}}]  # fmt: skip
        doc = traj(a, observation(12.5, role="tool"), assistant(200, 7, 14.0))
        t0, t1 = from_miniswe(write(tmp_path, doc)).records()[0]["turns"]
        assert t0["tool_duration_s"] == 2.5 and t1["request_ts"] == 12.5
        assert "tool" not in t1  # the last call asked for nothing that ran

    def test_format_error_is_not_an_observation(self, tmp_path: Path) -> None:
        """A user message with extra.interrupt_type ends no tool; it stamps the next request."""
        notice = {"role": "user", "content": "one action please",
                  "extra": {"interrupt_type": "FormatError", "timestamp": 11.0}}  # fmt: skip
        doc = traj(assistant(100, 5, 10.0), notice, assistant(150, 5, 12.0))
        t0, t1 = from_miniswe(write(tmp_path, doc)).records()[0]["turns"]
        assert "tool" not in t0 and t1["request_ts"] == 11.0

    def test_v1_without_timestamps(self, tmp_path: Path) -> None:
        """Format mini-swe-agent-1 (no timestamps): tokens import, tool calls are counted out."""
        doc = traj(assistant(100, 5, None), observation(None), assistant(180, 6, None),
                   fmt="mini-swe-agent-1")  # fmt: skip
        result = from_miniswe(write(tmp_path, doc))
        assert [t["prompt_tokens"] for t in result.records()[0]["turns"]] == [100, 180]
        assert result.tools == 0
        assert result.skipped == {"tool calls without timestamps": 1}
        assert "1 tool calls without timestamps skipped" in result.summary()

    def test_message_without_usage_is_skipped(self, tmp_path: Path) -> None:
        """An assistant message without usage is counted out; the others import."""
        bare = {"role": "assistant", "content": "x", "extra": {"timestamp": 5.0}}
        doc = traj(bare, observation(6.0), assistant(120, 4, 8.0))
        result = from_miniswe(write(tmp_path, doc))
        assert result.turns == 1 and result.skipped == {"assistant messages without usage": 1}

    def test_instance_id_names_the_session(self, tmp_path: Path) -> None:
        """``instance_id`` (swebench runs) wins over the file name."""
        doc = traj(assistant(100, 5, 1.0)) | {"instance_id": "django__django-11099"}
        assert from_miniswe(write(tmp_path, doc)).sessions[0].id == "django__django-11099"


class TestBadInput:
    """A file that is not a trajectory, or has a wrong type, fails naming the file and place."""

    def test_truncated_json(self, tmp_path: Path) -> None:
        """Cut-off JSON: FILE:LINE and the parser's message."""
        text = FIXTURE.read_text()
        path = write(tmp_path, text[: len(text) // 2])
        with pytest.raises(TraceImportError, match=r"run\.traj\.json:\d+: invalid JSON"):
            from_miniswe(path)

    def test_not_a_trajectory(self, tmp_path: Path) -> None:
        """A JSON object without trajectory_format is refused as the wrong format."""
        with pytest.raises(TraceImportError, match="not a mini-swe-agent trajectory"):
            from_miniswe(write(tmp_path, {"messages": []}))
        with pytest.raises(TraceImportError, match="top level is not an object"):
            from_miniswe(write(tmp_path, [1, 2]))

    def test_wrong_types_name_the_field(self, tmp_path: Path) -> None:
        """A string token count or timestamp names its message and field."""
        bad = assistant(100, 5, 1.0)
        bad["extra"]["response"]["usage"]["prompt_tokens"] = "100"
        usage = r"messages\[2\]\.extra\.response\.usage\.prompt_tokens: must be a non-negative"
        with pytest.raises(TraceImportError, match=usage):
            from_miniswe(write(tmp_path, traj(bad)))
        late = assistant(100, 5, 1.0)
        late["extra"]["timestamp"] = "noon"
        with pytest.raises(TraceImportError, match=r"messages\[2\]\.extra\.timestamp"):
            from_miniswe(write(tmp_path, traj(late)))
        with pytest.raises(TraceImportError, match="messages: must be a list"):
            from_miniswe(write(tmp_path, {"trajectory_format": "mini-swe-agent-1.1",
                                          "messages": {}}))  # fmt: skip

    def test_no_usable_turn(self, tmp_path: Path) -> None:
        """A trajectory without one usable call is an error, not an empty trace."""
        with pytest.raises(TraceImportError, match="no usable turn"):
            from_miniswe(write(tmp_path, traj()))

    def test_unreadable(self, tmp_path: Path) -> None:
        """A missing file or non-UTF-8 bytes say so."""
        with pytest.raises(TraceImportError, match="cannot read"):
            from_miniswe(str(tmp_path / "nope.traj.json"))
        f = tmp_path / "bin.traj.json"
        f.write_bytes(b"\xff\xfe\x00")
        with pytest.raises(TraceImportError, match="not UTF-8"):
            from_miniswe(str(f))
