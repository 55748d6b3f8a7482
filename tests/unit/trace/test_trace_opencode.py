"""OpenCode event-log and export import: steps, tool parts, sessions, bad lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.trace import TraceImportError, from_opencode

DIR = Path(__file__).parents[2] / "fixtures" / "opencode"
FIXTURE = DIR / "session-events.jsonl"


def events() -> list[dict[str, Any]]:
    return [json.loads(x) for x in FIXTURE.read_text().splitlines()]


def write(tmp_path: Path, rows: list[Any], name: str = "events.jsonl") -> str:
    f = tmp_path / name
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(f)


EXPECTED = [
    {"session": "ses_7f3a", "family": "opencode", "start": 0.0, "turns": [
        {"prompt_tokens": 1200 + 8000 + 300, "output_tokens": 85, "cached_tokens": 8000,
         "request_ts": 1767225595.2, "response_ts": 1767225600.0, "tool": "bash",
         "tool_duration_s": 8.421, "tools": ["bash", "read"], "tool_start_ts": 1767225600.0,
         "tool_end_ts": 1767225609.012},
        {"prompt_tokens": 1150 + 9400, "output_tokens": 240, "cached_tokens": 9400,
         "request_ts": 1767225609.15, "response_ts": 1767225613.0}]},
    {"session": "ses_b2", "family": "opencode", "start": 102.8, "turns": [
        {"prompt_tokens": 500 + 4000, "output_tokens": 30, "cached_tokens": 0,
         "request_ts": 1767225698.0, "response_ts": 1767225700.0, "tool": "glob",
         "tool_duration_s": 0.5, "tool_start_ts": 1767225700.0, "tool_end_ts": 1767225700.5},
        {"prompt_tokens": 80 + 4500, "output_tokens": 120, "cached_tokens": 4500,
         "request_ts": 1767225700.5, "response_ts": 1767225705.0}]},
]  # fmt: skip
"""Hand-checked: prompt = input + cache.read + cache.write; bash part 1767225600000 →
1767225608421 ms (the shared fixture's lines), read 1767225609000 → …012; ses_b2 is one message
with two step-finish parts (older OpenCode)."""


class TestFixture:
    """The constructed log: two sessions, one call per step-finish."""

    def test_records(self) -> None:
        """Exactly the hand-checked records."""
        result = from_opencode(str(FIXTURE))
        assert result.records() == EXPECTED
        assert result.summary() == "2 sessions, 4 turns, 3 tools"

    def test_shared_fixture_alone_has_no_usage(self) -> None:
        """Tool parts without message.updated carry no tokens: a clear error, not a trace."""
        why = r"events\.jsonl: no usable turn .*2 parts of messages never logged"
        with pytest.raises(TraceImportError, match=why):
            from_opencode(str(DIR / "events.jsonl"))


class TestShapes:
    """Wrapped events, SSE lines, exports, message-level tokens and removals."""

    def test_wrapped_and_sse_lines(self, tmp_path: Path) -> None:
        """``{"payload": ev}``, ``{"event": ev}`` and ``data: ev`` lines read as the event."""
        rows: list[Any] = []
        for i, ev in enumerate(events()):
            rows.append([{"payload": ev}, {"event": ev}, "data: " + json.dumps(ev)][i % 3])
        assert from_opencode(write(tmp_path, rows)).records() == EXPECTED

    def test_export(self, tmp_path: Path) -> None:
        """``opencode export`` JSON (info + messages with parts) gives the same turns."""
        msgs: dict[str, dict[str, Any]] = {}
        for ev in events():
            p = ev["properties"]
            if ev["type"] == "message.updated":
                msgs.setdefault(p["info"]["id"], {"info": None, "parts": {}})["info"] = p["info"]
            elif ev["type"] == "message.part.updated":
                parts = msgs.setdefault(p["part"]["messageID"], {"info": None, "parts": {}})
                parts["parts"][p["part"]["id"]] = p["part"]
        sessions = {}
        for m in msgs.values():
            sessions.setdefault(m["info"]["sessionID"], []).append(
                {"info": m["info"], "parts": list(m["parts"].values())}
            )
        f = tmp_path / "export.json"
        f.write_text(json.dumps({"info": {"id": "ses_7f3a"}, "messages": sessions["ses_7f3a"]}))
        assert from_opencode(str(f)).records() == EXPECTED[:1]

    def test_message_tokens_without_steps(self, tmp_path: Path) -> None:
        """A message without step parts is one call with the message's tokens."""
        rows = [e for e in events() if e["properties"].get("part", {}).get("type")
                not in ("step-start", "step-finish")]  # fmt: skip
        result = from_opencode(write(tmp_path, rows))
        b2 = result.records()[1]
        assert len(b2["turns"]) == 1 and b2["turns"][0]["prompt_tokens"] == 80 + 4500
        assert b2["turns"][0]["tool"] == "glob"

    def test_removed_message(self, tmp_path: Path) -> None:
        """message.removed drops the message (an undone turn)."""
        rows: list[Any] = [*events(), {"type": "message.removed",
                                       "properties": {"sessionID": "ses_7f3a",
                                                      "messageID": "msg_10"}}]  # fmt: skip
        ses = from_opencode(write(tmp_path, rows)).records()[0]
        assert len(ses["turns"]) == 1

    def test_running_tool_is_counted_out(self, tmp_path: Path) -> None:
        """A tool part that never left ``running`` has no end: counted, not timed."""
        rows = [e for e in events() if not (e["properties"].get("part", {}).get("id") == "prt_b1"
                                            and e["properties"]["part"]["state"]["status"]
                                            == "completed")]  # fmt: skip
        result = from_opencode(write(tmp_path, rows))
        assert result.skipped == {"tool calls without an end": 1}
        assert "tool" not in result.records()[1]["turns"][0]


class TestBadLines:
    """Bad lines are skipped and counted; unusable files and exports fail clearly."""

    def test_truncated_and_wrong_typed(self, tmp_path: Path) -> None:
        """A cut line, a properties string and a string token count: skipped, line numbers."""
        rows: list[Any] = events()
        rows.insert(1, json.dumps(rows[1])[:30])
        rows.insert(2, {"type": "message.updated", "properties": "oops"})
        bad = json.loads(json.dumps(rows[-2]))
        bad["properties"]["info"]["time"]["created"] = "soon"
        result = from_opencode(write(tmp_path, rows))
        assert result.bad_lines == 2
        assert result.notes[0].startswith("line 2: invalid JSON")
        assert result.notes[1] == "line 3: message.updated: properties must be an object"
        assert result.records() == EXPECTED
        rows.append(bad)  # the final message.updated of msg_b1, with a string time
        with pytest.raises(TraceImportError, match=r"session ses_b2: message msg_b1\.time\."
                                                   r"created: must be a number"):  # fmt: skip
            from_opencode(write(tmp_path, rows))

    def test_wrong_format(self, tmp_path: Path) -> None:
        """A Claude Code transcript is not an OpenCode log."""
        cc = DIR.parent / "claude-code" / "session.jsonl"
        with pytest.raises(TraceImportError, match=r"no usable turn .*found only assistant x12"):
            from_opencode(str(cc))

    def test_bad_export(self, tmp_path: Path) -> None:
        """An export whose messages are not objects with info names the message."""
        f = tmp_path / "export.json"
        f.write_text(json.dumps({"info": {}, "messages": [{"parts": []}]}))
        with pytest.raises(TraceImportError, match=r"export\.json: messages\[0\]: must be an "
                                                   r"object with info"):  # fmt: skip
            from_opencode(str(f))


class TestSse:
    """A recorded ``GET /event`` stream: ``data:`` lines, blank lines and other SSE fields."""

    def test_sse_stream(self, tmp_path: Path) -> None:
        """Only data lines count; ``event:``/``id:``/comment lines are not bad lines."""
        rows: list[Any] = ["data: {}", ": heartbeat", "id: 1", "event: message"]
        rows += [f"data: {json.dumps(e)}\n" for e in events()]
        result = from_opencode(write(tmp_path, rows))
        assert result.records() == EXPECTED and result.bad_lines == 0
