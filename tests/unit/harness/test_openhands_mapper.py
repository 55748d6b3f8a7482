"""OpenHandsMapper: hook payloads → tool and session messages, starts and ends paired in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.session import END_COMPLETED, SessionEnd
from shared.contracts.tool import SOURCE_HOOK, ToolEnd, ToolStart
from shared.harness.base import HookPayloadError
from shared.harness.claude import USER_TOOL
from shared.harness.openhands import HARNESS, OpenHandsMapper

FIXTURES = Path(__file__).parents[2] / "fixtures" / "openhands"
T0 = 1767225600.0
SID = "c0ffee"


def load(name: str, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    body.update(changes)
    return body


def pre(tool: str = "terminal") -> dict[str, Any]:
    return load("pre-tool-use.json", tool_name=tool)


def post(tool: str = "terminal") -> dict[str, Any]:
    return load("post-tool-use.json", tool_name=tool)


def ends(out: list[Any]) -> list[tuple[str, float | None]]:
    return [(m.call_id, m.duration_s) for m in out if isinstance(m, ToolEnd)]


class TestFixtures:
    def test_pre_then_post_is_one_call(self) -> None:
        """PreToolUse starts a synthesised call at receipt; PostToolUse ends it with the
        elapsed time as its duration."""
        mapper = OpenHandsMapper()
        [start] = mapper.map(pre(), T0)
        assert start == ToolStart(
            session_id=SID,
            call_id=f"oh-{round(T0 * 1000)}-0",
            tool="terminal",
            started_at=T0,
            source=SOURCE_HOOK,
            harness=HARNESS,
        )
        assert mapper.map(post(), T0 + 2.5) == [
            ToolEnd(
                session_id=SID,
                call_id=start.call_id,
                ended_at=T0 + 2.5,
                tool="terminal",
                source=SOURCE_HOOK,
                duration_s=2.5,
            )
        ]

    def test_terminal_timeout_and_censoring(self) -> None:
        """tool_input.timeout (seconds) → timeout_s; a timed-out observation is censored."""
        mapper = OpenHandsMapper()
        [start] = mapper.map(load("pre-tool-use-timeout.json"), T0)
        assert isinstance(start, ToolStart) and start.timeout_s == 600.0
        [end] = mapper.map(load("post-tool-use-timeout.json"), T0 + 600)
        assert isinstance(end, ToolEnd) and (end.censored, end.ok) == (True, True)

    def test_error_observation_is_not_ok(self) -> None:
        """is_error in the observation ends the call not-ok."""
        mapper = OpenHandsMapper()
        mapper.map(pre(), T0)
        body = post()
        body["tool_response"] = {**body["tool_response"], "is_error": True}
        [end] = mapper.map(body, T0 + 1)
        assert isinstance(end, ToolEnd) and not end.ok

    def test_legacy_tool_output_string(self) -> None:
        """Older SDKs send tool_output (a string) instead of tool_response."""
        mapper = OpenHandsMapper()
        mapper.map(pre("execute_bash"), T0)
        [end] = mapper.map(load("post-tool-use-legacy.json"), T0 + 1)
        assert isinstance(end, ToolEnd) and (end.tool, end.ok, end.censored) == (
            "execute_bash",
            True,
            False,
        )

    def test_stop_and_prompt_bracket_the_user_turn(self) -> None:
        """Stop opens the pseudo-tool user call; UserPromptSubmit closes it, once."""
        mapper = OpenHandsMapper()
        [start] = mapper.map(load("stop.json"), T0)
        assert isinstance(start, ToolStart) and start.tool == USER_TOOL
        assert mapper.map(load("stop.json"), T0 + 1) == []  # already waiting
        assert mapper.map(load("user-prompt-submit.json"), T0 + 30) == [
            ToolEnd(
                session_id=SID, call_id=start.call_id, ended_at=T0 + 30, tool=USER_TOOL,
                source=SOURCE_HOOK,
            )
        ]  # fmt: skip
        assert mapper.map(load("user-prompt-submit.json"), T0 + 31) == []

    def test_session_start_and_end(self) -> None:
        """SessionStart maps to nothing; SessionEnd ends the session."""
        mapper = OpenHandsMapper()
        assert mapper.map(load("session-start.json"), T0) == []
        assert mapper.map(load("session-end.json"), T0 + 9) == [
            SessionEnd(session_id=SID, ended_at=T0 + 9, reason=END_COMPLETED)
        ]

    def test_unknown_event_type_maps_to_nothing(self) -> None:
        """An event type TAO does not know (Notification, future ones) is ignored."""
        assert OpenHandsMapper().map({"event_type": "Notification", "session_id": SID}, T0) == []


class TestPairing:
    def test_fifo_per_session_and_tool(self) -> None:
        """Two terminal calls and a file_editor call interleaved: each end closes the oldest
        start of its own (session, tool)."""
        mapper = OpenHandsMapper()
        t1 = mapper.map(pre(), T0)[0].call_id
        t2 = mapper.map(pre(), T0 + 1)[0].call_id
        f1 = mapper.map(pre("file_editor"), T0 + 2)[0].call_id
        assert ends(mapper.map(post("file_editor"), T0 + 3)) == [(f1, 1.0)]
        assert ends(mapper.map(post(), T0 + 4)) == [(t1, 4.0)]
        assert ends(mapper.map(post(), T0 + 5)) == [(t2, 4.0)]
        assert len({t1, t2, f1}) == 3

    def test_sessions_do_not_share_queues(self) -> None:
        """The same tool in two sessions pairs within each session."""
        mapper = OpenHandsMapper()
        a = mapper.map(pre(), T0)[0].call_id
        b = mapper.map({**pre(), "session_id": "other"}, T0 + 1)[0].call_id
        [end_b] = mapper.map({**post(), "session_id": "other"}, T0 + 2)
        [end_a] = mapper.map(post(), T0 + 3)
        assert (end_a.call_id, end_b.call_id) == (a, b)

    def test_an_end_before_its_start_is_held_until_the_start(self) -> None:
        """Async hooks can deliver the end first: it is held and pairs with the start received
        before it, which then maps to both messages."""
        mapper = OpenHandsMapper()
        assert mapper.map(post(), T0 + 2) == []
        start, end = mapper.map(pre(), T0)
        assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
        assert (end.call_id, end.ended_at, end.duration_s) == (start.call_id, T0 + 2, 2.0)

    def test_a_held_end_older_than_the_start_is_dropped(self) -> None:
        """An end received before a start cannot be that start's end (a start lost earlier)."""
        mapper = OpenHandsMapper()
        assert mapper.map(post(), T0) == []
        assert len(mapper.map(pre(), T0 + 5)) == 1
        assert len(ends(mapper.map(post(), T0 + 6))) == 1

    def test_the_turn_boundary_clears_unanswered_starts(self) -> None:
        """A start that never got its end (blocked by another hook) does not outlive the turn."""
        mapper = OpenHandsMapper()
        mapper.map(pre(), T0)  # blocked: no PostToolUse will come
        mapper.map(load("stop.json"), T0 + 1)
        mapper.map(load("user-prompt-submit.json"), T0 + 2)
        new = mapper.map(pre(), T0 + 3)[0].call_id
        assert ends(mapper.map(post(), T0 + 4)) == [(new, 1.0)]

    def test_call_ids_differ_across_mapper_restarts(self) -> None:
        """A restarted mapper does not reuse the call ids of the one before."""
        first = OpenHandsMapper().map(pre(), T0)[0].call_id
        again = OpenHandsMapper().map(pre(), T0 + 60)[0].call_id
        assert first != again

    def test_queues_are_bounded(self) -> None:
        """Per-key queues keep at most max_held entries and the table at most max_keys keys."""
        mapper = OpenHandsMapper(max_keys=2, max_held=3)
        for n in range(5):
            mapper.map(pre(), T0 + n)
            mapper.map(pre(f"tool{n}"), T0 + n)
        assert len(mapper._starts) == 2
        assert all(len(q) <= 3 for q in mapper._starts.values())


def bad_cases() -> list[tuple[dict[str, Any], str]]:
    return [
        ({}, "event_type: missing"),
        ({"event_type": None}, "event_type: expected a string, got null"),
        ({"event_type": "PreToolUse"}, "session_id: missing"),
        ({**pre(), "session_id": None}, "session_id: expected a string, got null"),
        ({**pre(), "session_id": 42}, "session_id: expected a string, got int"),
        ({**pre(), "tool_name": None}, "tool_name: expected a string, got null"),
        ({**pre(), "tool_input": "pytest"}, "tool_input: expected an object, got str"),
        ({**post(), "tool_response": [1]}, "tool_response: expected an object, got list"),
        ({**post(), "tool_output": 3}, "tool_output: expected a string, got int"),
        ({**pre(), "session_id": "x" * 600}, "session_id: unusable as a session id"),
        ({"event_type": "Stop", "session_id": ""}, "session_id: empty"),
    ]


class TestBadPayloads:
    @pytest.mark.parametrize(("body", "reason"), bad_cases())
    def test_bad_payload_names_the_field(self, body: dict[str, Any], reason: str) -> None:
        """Truncated, wrong-typed and oversized fields raise HookPayloadError saying which."""
        with pytest.raises(HookPayloadError) as info:
            OpenHandsMapper().map(body, T0)
        assert info.value.harness == HARNESS
        assert info.value.reason.startswith(reason), info.value.reason

    def test_a_receive_time_out_of_range_is_refused(self) -> None:
        """A time that cannot make a call id is a payload error, not a crash."""
        with pytest.raises(HookPayloadError, match="time out of range"):
            OpenHandsMapper().map(pre(), 1e308)

    def test_tool_specific_fields_of_other_types_are_ignored(self) -> None:
        """A timeout that is not a number, or an exit code that is not an int, is not refused."""
        mapper = OpenHandsMapper()
        body = pre()
        body["tool_input"] = {"timeout": "soon"}
        [start] = mapper.map(body, T0)
        assert isinstance(start, ToolStart) and start.timeout_s is None
        [end] = mapper.map({**post(), "tool_response": {"exit_code": "-1", "timeout": 1}}, T0 + 1)
        assert isinstance(end, ToolEnd) and not end.censored
