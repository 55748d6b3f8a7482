"""Claude Code transcript import: merged responses, tool times, subagents, bad lines."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from shared.trace import TraceImportError, from_claude_code

FIXTURE = Path(__file__).parents[2] / "fixtures" / "claude-code" / "session.jsonl"
SID = "7c1e2f0a-5b6d-4e8f-9a0b-1c2d3e4f5a6b"
T0 = datetime(2026, 1, 5, 10, 0, tzinfo=UTC).timestamp()  # the fixture's first prompt


def lines() -> list[dict[str, Any]]:
    return [json.loads(x) for x in FIXTURE.read_text().splitlines()]


def write(tmp_path: Path, rows: list[Any], name: str = "s.jsonl") -> str:
    f = tmp_path / name
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(f)


class TestFixture:
    """The constructed transcript's numbers, checked by hand from its records."""

    def test_main_session(self) -> None:
        """Four responses; prompt = input + cache read + cache creation; tools end at results."""
        result = from_claude_code(str(FIXTURE))
        main, _ = result.records()
        assert main["session"] == SID and main["family"] == "claude-code"
        turns = main["turns"]
        assert [t["prompt_tokens"] for t in turns] == [
            4 + 2200 + 14000, 6 + 900 + 16200, 8 + 600 + 17100, 10 + 1500 + 18000,
        ]  # fmt: skip
        assert [t["output_tokens"] for t in turns] == [87, 140, 95, 310]
        assert [t["cached_tokens"] for t in turns] == [14000, 16200, 17100, 18000]
        assert [t["request_ts"] - T0 for t in turns] == pytest.approx([0.0, 9.5, 13.8, 22.3])
        assert [t["response_ts"] - T0 for t in turns] == pytest.approx([4.0, 12.6, 16.0, 30.0])
        bash, parallel, task, last = turns
        assert (bash["tool"], bash["tool_duration_s"], bash["tool_timeout_s"]) == ("Bash", 5.5, 60)
        assert (parallel["tool"], parallel["tool_duration_s"]) == ("Grep", 1.2)  # the longest
        assert parallel["tools"] == ["Read", "Grep"]
        assert parallel["tool_start_ts"] - T0 == pytest.approx(12.3)
        assert parallel["tool_end_ts"] - T0 == pytest.approx(13.8)
        assert (task["tool"], task["tool_duration_s"]) == ("Task", 6.3)
        assert "tool" not in last

    def test_subagent_is_its_own_session(self) -> None:
        """The inline sidechain (agentId a1b2c3d4) is a second session arriving 16.1 s later."""
        _, side = from_claude_code(str(FIXTURE)).records()
        assert side["session"] == f"{SID}:agent-a1b2c3d4" and side["start"] == 16.1
        t0, t1 = side["turns"]
        assert (t0["prompt_tokens"], t0["output_tokens"], t0["cached_tokens"]) == (5003, 60, 0)
        assert (t0["tool"], t0["tool_duration_s"]) == ("Glob", 0.25)
        assert (t1["prompt_tokens"], t1["cached_tokens"]) == (5405, 5000)
        assert t1["request_ts"] - T0 == pytest.approx(18.25)

    def test_summary(self) -> None:
        """Sessions, turns, tools, and the synthetic placeholder counted out."""
        result = from_claude_code(str(FIXTURE))
        assert result.summary() == (
            "2 sessions, 6 turns, 5 tools; 1 synthetic/API-error messages skipped"
        )


class TestDedupe:
    """One API response written as several records counts once, with its largest output."""

    def test_repeated_records_are_one_turn(self) -> None:
        """msg_01A has three records (output 12, 12, 87): one turn, output 87; the main thread's
        10 assistant records (one a synthetic placeholder) make 4 turns."""
        rows = [r for r in lines() if r.get("type") == "assistant" and not r["isSidechain"]]
        assert len(rows) == 10
        turns = from_claude_code(str(FIXTURE)).records()[0]["turns"]
        assert len(turns) == 4 and turns[0]["output_tokens"] == 87

    def test_exact_duplicate_lines(self, tmp_path: Path) -> None:
        """A transcript with every line twice (a copied session) imports the same turns."""
        rows = lines()
        doubled = [r for r in rows for _ in (0, 1)]
        once = from_claude_code(write(tmp_path, rows, "a.jsonl")).records()
        twice = from_claude_code(write(tmp_path, doubled, "b.jsonl")).records()
        assert once == twice

    def test_distinct_request_ids_are_distinct_calls(self, tmp_path: Path) -> None:
        """Same message id but another requestId (a retried request) is another call."""
        rows = lines()
        first = next(r for r in rows if r.get("requestId") == "req_04D")
        retry = json.loads(json.dumps(first)) | {"requestId": "req_04E"}
        turns = from_claude_code(write(tmp_path, [*rows, retry])).records()[0]["turns"]
        assert len(turns) == 5


class TestBadLines:
    """Bad lines are skipped and counted with FILE line numbers; no usable turn is an error."""

    def test_truncated_and_wrong_typed_lines(self, tmp_path: Path) -> None:
        """A cut-off last line, a non-object line and a string token count: 3 lines skipped."""
        rows: list[Any] = lines()
        bad_usage = json.loads(json.dumps(rows[2]))
        bad_usage["message"]["usage"]["input_tokens"] = "4"
        rows[2] = bad_usage
        rows.insert(5, "[1, 2, 3]")
        rows.append(json.dumps(rows[-2])[:40])
        result = from_claude_code(write(tmp_path, rows))
        assert result.bad_lines == 3
        assert result.notes[0] == (
            "line 3: message.usage.input_tokens: must be a non-negative integer, got '4'"
        )
        assert result.notes[1].startswith("line 6: not a JSON object")
        assert result.notes[2].startswith("line 25: invalid JSON")
        assert "3 bad lines skipped (line 3:" in result.summary()
        assert result.turns == 6  # msg_01A still has two good records

    def test_bad_timestamp(self, tmp_path: Path) -> None:
        """A timestamp without a zone or not ISO 8601 is a bad line."""
        rows = lines()
        rows[1]["timestamp"] = "2026-01-05 10:00:00"
        rows[3]["timestamp"] = 1767607203
        result = from_claude_code(write(tmp_path, rows))
        assert [n.split(":", 1)[0] for n in result.notes] == ["line 2", "line 4"]
        assert "without a time zone" in result.notes[0]

    def test_tool_without_result(self, tmp_path: Path) -> None:
        """A tool_use whose result never came (interrupted, file cut) is counted, not timed."""
        rows = [r for r in lines() if r.get("uuid") != _uuid_of_result("toolu_01")]
        result = from_claude_code(write(tmp_path, rows))
        assert "tool" not in result.records()[0]["turns"][0]
        assert result.skipped["tool calls without a result"] == 1

    def test_wrong_format(self, tmp_path: Path) -> None:
        """An OpenCode log or a JSON document is not a transcript: clear error, exit-2 type."""
        opencode = FIXTURE.parents[1] / "opencode" / "events.jsonl"
        with pytest.raises(TraceImportError, match=r"no usable turn .*found only "
                                                   r"message\.part\.updated x3"):  # fmt: skip
            from_claude_code(str(opencode))
        traj = FIXTURE.parents[1] / "mini-swe-agent" / "example.traj.json"
        with pytest.raises(TraceImportError, match=r"bad lines, first: line 1: invalid JSON"):
            from_claude_code(str(traj))

    def test_empty_file(self, tmp_path: Path) -> None:
        """An empty file has no usable turn."""
        with pytest.raises(TraceImportError, match=r"s\.jsonl: no usable turn"):
            from_claude_code(write(tmp_path, []))


def _uuid_of_result(tool_use_id: str) -> str:
    for r in lines():
        content = r.get("message", {}).get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("tool_use_id") == tool_use_id for b in content
        ):
            return str(r["uuid"])
    raise AssertionError(tool_use_id)


class TestSidechains:
    """Subagent records split by agentId, or by parentUuid chains when there is none."""

    def test_subagent_file(self, tmp_path: Path) -> None:
        """A subagents/agent-<id>.jsonl file holds only sidechain records: one session."""
        rows = [r for r in lines() if r.get("isSidechain") is True]
        result = from_claude_code(write(tmp_path, rows, "agent-a1b2c3d4.jsonl"))
        assert [s.id for s in result.sessions] == [f"{SID}:agent-a1b2c3d4"]

    def test_inline_sidechains_without_agent_id(self, tmp_path: Path) -> None:
        """Two interleaved subagents without agentId are told apart by their parentUuid chains."""
        side = [r for r in lines() if r.get("isSidechain") is True]
        for r in side:
            del r["agentId"]
        other = json.loads(json.dumps(side))
        for r in other:
            r["uuid"] = "x" + r["uuid"]
            r["parentUuid"] = None if r["parentUuid"] is None else "x" + r["parentUuid"]
        interleaved = [r for pair in zip(side, other, strict=True) for r in pair]
        result = from_claude_code(write(tmp_path, interleaved))
        assert [s.id for s in result.sessions] == [f"{SID}:side-1", f"{SID}:side-2"]
        assert [len(s.calls) for s in result.sessions] == [2, 2]

    def test_chain_through_other_record_types(self, tmp_path: Path) -> None:
        """A progress record inside a subagent's parentUuid chain does not split the chain."""
        side = [r for r in lines() if r.get("isSidechain") is True]
        for r in side:
            del r["agentId"]
        hop = {"type": "progress", "isSidechain": True, "uuid": "hop",
               "parentUuid": side[0]["uuid"], "timestamp": side[0]["timestamp"]}  # fmt: skip
        side[1]["parentUuid"] = "hop"
        result = from_claude_code(write(tmp_path, [side[0], hop, *side[1:]]))
        assert [(s.id, len(s.calls)) for s in result.sessions] == [(f"{SID}:side-1", 2)]
