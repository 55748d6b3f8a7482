"""OpenCodeMapper: plugin payloads → ToolStart / ToolEnd / SessionEnd, event timings first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.session import END_CLIENT_CLOSED, SessionEnd
from shared.contracts.tool import SOURCE_PLUGIN, ToolEnd, ToolStart
from shared.harness.base import HookPayloadError
from shared.harness.claude import USER_TOOL
from shared.harness.opencode import HARNESS, OpenCodeMapper

FIXTURES = Path(__file__).parents[2] / "fixtures" / "opencode"
AT = 1767225700.5  # receive time
SID, CALL = "ses_7f3a", "toolu_01XYZ"


def load(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return body


def events() -> list[dict[str, Any]]:
    lines = (FIXTURES / "events.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def running(start: int = 1767225600000, timeout: int | None = None) -> dict[str, Any]:
    inp: dict[str, Any] = {"command": "npm test"}
    if timeout is not None:
        inp["timeout"] = timeout
    state = {"status": "running", "input": inp, "time": {"start": start}}
    return wrap_part(state)


def completed(output: str = "ok", start: int = 1767225600000, end: int = 1767225608421) -> dict:
    state = {"status": "completed", "output": output, "time": {"start": start, "end": end}}
    return wrap_part(state)


def wrap_part(state: dict[str, Any]) -> dict[str, Any]:
    part = {"id": "prt_1", "sessionID": SID, "messageID": "m", "type": "tool", "callID": CALL}
    event = {
        "type": "message.part.updated",
        "properties": {"part": {**part, "tool": "bash", "state": state}},
    }
    return {"hook": "event", "ts": 1767225609000, "event": event}


MARKED = "...\n<bash_metadata>\nbash tool terminated command after exceeding timeout 1 ms\n"


class TestFixtures:
    def test_before_starts_with_the_bash_timeout(self) -> None:
        """tool.execute.before starts the call at receipt (no ts) with args.timeout in seconds."""
        assert OpenCodeMapper().map(load("tool-execute-before.json"), AT) == [
            ToolStart(
                session_id=SID,
                call_id=CALL,
                tool="bash",
                started_at=AT,
                source=SOURCE_PLUGIN,
                harness=HARNESS,
                timeout_s=300.0,
            )
        ]

    def test_after_with_the_timeout_marker_is_censored(self) -> None:
        """The bash timeout marker in the output marks the end as censored."""
        [end] = OpenCodeMapper().map(load("tool-execute-after-timeout.json"), AT)
        assert end == ToolEnd(
            session_id=SID, call_id=CALL, ended_at=AT, tool="bash", source=SOURCE_PLUGIN,
            censored=True,
        )  # fmt: skip

    def test_after_uses_the_plugin_clock(self) -> None:
        """A payload's ts (epoch ms) is its time; the plain output is not censored."""
        [end] = OpenCodeMapper().map(load("tool-execute-after.json"), AT)
        assert isinstance(end, ToolEnd)
        assert (end.ended_at, end.censored, end.ok) == (1767225608.4, False, True)

    def test_event_log(self) -> None:
        """Tool parts give OpenCode's own times; a failed part ends not-ok; idle opens the user
        turn, which the next chat.message closes."""
        mapper = OpenCodeMapper()
        out = [mapper.map(e, AT) for e in events()]
        assert out[0] == [
            ToolStart(
                session_id=SID,
                call_id=CALL,
                tool="bash",
                started_at=1767225600.0,
                source=SOURCE_PLUGIN,
                harness=HARNESS,
                timeout_s=120.0,  # the bash default: no timeout argument
            )
        ]
        assert out[1] == [
            ToolEnd(
                session_id=SID,
                call_id=CALL,
                ended_at=1767225608.421,
                tool="bash",
                source=SOURCE_PLUGIN,
                duration_s=pytest.approx(8.421),
            )
        ]
        [failed] = out[2]
        assert isinstance(failed, ToolEnd)
        assert (failed.call_id, failed.tool, failed.ok) == ("toolu_01ABC", "read", False)
        assert failed.duration_s == pytest.approx(0.012)
        [user] = out[3]
        assert isinstance(user, ToolStart)
        assert (user.tool, user.call_id, user.started_at) == (
            USER_TOOL,
            f"user-{round(AT * 1000)}",
            AT,
        )
        assert mapper.map(load("chat-message.json"), AT) == [
            ToolEnd(
                session_id=SID,
                call_id=user.call_id,
                ended_at=1767225700.0,
                tool=USER_TOOL,
                source=SOURCE_PLUGIN,
            )
        ]
        assert mapper.map(load("chat-message.json"), AT) == []  # nothing open any more

    def test_session_deleted_ends_the_session(self) -> None:
        """session.deleted → SessionEnd(client_closed) at the plugin's ts."""
        assert OpenCodeMapper().map(load("session-deleted.json"), AT) == [
            SessionEnd(session_id=SID, ended_at=1767225800.0, reason=END_CLIENT_CLOSED)
        ]

    def test_unused_hooks_and_events_map_to_nothing(self) -> None:
        """Other hooks, other events, non-tool parts and pending parts are ignored."""
        mapper = OpenCodeMapper()
        pending = wrap_part({"status": "pending", "input": {}, "raw": ""})
        text = {"type": "message.part.updated", "properties": {"part": {"type": "text"}}}
        for body in (
            {"hook": "chat.params", "input": {}},
            {"hook": "event", "event": {"type": "message.updated", "properties": {}}},
            {"hook": "event", "event": text},
            pending,
        ):
            assert mapper.map(body, AT) == []


class TestPrecedence:
    def test_event_timings_win_over_before_and_after(self) -> None:
        """OpenCode's order (running, before, after, completed) gives one start at time.start
        and one end at time.end, censored by the marker the after hook saw."""
        mapper = OpenCodeMapper()
        before = {"hook": "tool.execute.before", "ts": 1767225600050,
                  "input": {"tool": "bash", "sessionID": SID, "callID": CALL},
                  "output": {"args": {"timeout": 1}}}  # fmt: skip
        after = {"hook": "tool.execute.after", "ts": 1767225608400,
                 "input": {"tool": "bash", "sessionID": SID, "callID": CALL},
                 "output": {"output": MARKED}}  # fmt: skip
        out = [mapper.map(b, AT) for b in (running(timeout=1), before, after, completed())]
        assert [len(o) for o in out] == [1, 0, 0, 1]
        [start], [end] = out[0], out[3]
        assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
        assert (start.started_at, start.timeout_s) == (1767225600.0, 0.001)
        assert (end.ended_at, end.censored) == (1767225608.421, True)
        assert end.duration_s == pytest.approx(8.421)

    def test_before_and_after_serve_calls_the_event_hook_missed(self) -> None:
        """Without an event record the hooks start and end the call, and a late completed
        event for it is not a second end."""
        mapper = OpenCodeMapper()
        [start] = mapper.map(load("tool-execute-before.json"), AT)
        [end] = mapper.map(load("tool-execute-after.json"), AT)
        assert (start.call_id, end.call_id) == (CALL, CALL)
        assert mapper.map(completed(), AT) == []
        assert mapper.map(running(), AT) == []

    def test_a_start_from_before_is_not_repeated_by_a_later_running_event(self) -> None:
        """before first: the running event adds nothing, the completed event still ends it."""
        mapper = OpenCodeMapper()
        assert len(mapper.map(load("tool-execute-before.json"), AT)) == 1
        assert mapper.map(running(), AT) == []
        assert mapper.map(load("tool-execute-after.json"), AT) == []
        [end] = mapper.map(completed(), AT)
        assert isinstance(end, ToolEnd) and end.ended_at == 1767225608.421

    def test_an_aborted_call_is_censored_and_timed_from_its_start(self) -> None:
        """OpenCode re-stamps an aborted part (start = end = now): the running event's start
        is kept and the end is censored."""
        mapper = OpenCodeMapper()
        mapper.map(running(), AT)
        state = {"status": "error", "error": "Tool execution aborted",
                 "time": {"start": 1767225650000, "end": 1767225650000}}  # fmt: skip
        [end] = mapper.map(wrap_part(state), AT)
        assert isinstance(end, ToolEnd)
        assert (end.ok, end.censored, end.duration_s) == (False, True, 50.0)

    def test_repeated_events_map_once(self) -> None:
        """A running part reported again and a completed part reported twice map once."""
        mapper = OpenCodeMapper()
        assert len(mapper.map(running(), AT)) == 1
        assert mapper.map(running(), AT) == []
        assert len(mapper.map(completed(), AT)) == 1
        assert mapper.map(completed(), AT) == []

    def test_idle_drops_the_turns_unfinished_calls_and_opens_one_user_call(self) -> None:
        """An idle session forgets its open calls; a second idle opens no second user call."""
        mapper = OpenCodeMapper()
        mapper.map(load("tool-execute-before.json"), AT)
        idle = {
            "hook": "event",
            "event": {"type": "session.idle", "properties": {"sessionID": SID}},
        }
        assert len(mapper.map(idle, AT)) == 1
        assert mapper.map(idle, AT + 1) == []
        [start] = mapper.map(load("tool-execute-before.json"), AT + 2)  # a new start is allowed
        assert start.started_at == AT + 2

    def test_memory_is_bounded(self) -> None:
        """Past max_calls the oldest remembered calls are forgotten."""
        mapper = OpenCodeMapper(max_calls=2)
        for n in range(5):
            body = load("tool-execute-before.json")
            body["input"]["callID"] = f"c{n}"
            mapper.map(body, AT)
        assert len(mapper._open) == 2


def before_with(**changes: Any) -> dict[str, Any]:
    body = load("tool-execute-before.json")
    for path, value in changes.items():
        *parents, key = path.split("__")
        node = body
        for name in parents:
            node = node[name]
        node[key] = value
    return body


def part_state(state: Any) -> dict[str, Any]:
    body = completed()
    body["event"]["properties"]["part"]["state"] = state
    return body


def event(kind: str, props: Any) -> dict[str, Any]:
    return {"hook": "event", "event": {"type": kind, "properties": props}}


def bad_cases() -> list[tuple[dict[str, Any], str]]:
    after = {"hook": "tool.execute.after", "input": {"tool": "b", "sessionID": "s", "callID": "c"}}
    done = {"status": "completed", "output": ""}
    return [
        ({}, "hook: missing"),
        ({"hook": 7}, "hook: expected a string, got int"),
        ({"hook": "tool.execute.before", "input": {"tool": "bash"}}, "input.sessionID: missing"),
        (before_with(input__callID=5), "input.callID: expected a string, got int"),
        (before_with(input__sessionID="s" * 600), "input.sessionID: unusable as a session id"),
        (before_with(output__args__timeout="9"), "output.args.timeout: expected a number, got str"),
        (before_with(output__args__timeout=-1), "output.args.timeout: must be >= 0"),
        (before_with(output=None), "output: expected an object, got null"),
        (before_with(ts="now"), "ts: expected a number, got str"),
        ({**after, "output": {"output": 1}}, "output.output: expected a string, got int"),
        ({"hook": "event"}, "event: missing"),
        ({"hook": "event", "event": {"type": "session.idle"}}, "event.properties: missing"),
        (event("session.idle", {"sessionID": ""}), "event.properties.sessionID: empty"),
        (event("session.deleted", {"info": []}), "event.properties.info: expected an object"),
        (part_state("done"), "event.properties.part.state: expected an object, got str"),
        (
            part_state({**done, "time": {"start": 1}}),
            "event.properties.part.state.time.end: missing",
        ),
        (
            part_state({**done, "time": {"start": "1", "end": 2}}),
            "event.properties.part.state.time.start: expected a number, got str",
        ),
        (
            {"type": "session.idle", "properties": {"sessionID": None}},
            "properties.sessionID: expected",
        ),
        ({"hook": "chat.message", "input": {}}, "input.sessionID: missing"),
    ]


class TestBadPayloads:
    def test_a_time_out_of_range_is_refused(self) -> None:
        """An idle at a time that cannot make a call id is a payload error, not a crash."""
        idle = {"type": "session.idle", "properties": {"sessionID": SID}}
        with pytest.raises(HookPayloadError, match="time out of range"):
            OpenCodeMapper().map(idle, 1e308)

    @pytest.mark.parametrize(("body", "reason"), bad_cases())
    def test_bad_payload_names_the_field(self, body: dict[str, Any], reason: str) -> None:
        """Truncated, wrong-typed and oversized fields raise HookPayloadError saying which."""
        with pytest.raises(HookPayloadError) as info:
            OpenCodeMapper().map(body, AT)
        assert info.value.harness == HARNESS
        assert info.value.reason.startswith(reason), info.value.reason
