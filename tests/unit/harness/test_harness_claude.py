"""Claude Code hook payloads → TAO messages (fixtures in tests/fixtures/claude-code/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.session import END_COMPLETED, SessionEnd
from shared.contracts.tool import SOURCE_HOOK, ToolEnd, ToolStart
from shared.harness.base import HookPayloadError
from shared.harness.claude import USER_TOOL, ClaudeMapper
from shared.harness.registry import (
    HARNESS_NAMES,
    UnknownHarnessError,
    find,
    mapper_for,
)

FIXTURES = Path(__file__).parents[2] / "fixtures" / "claude-code"
AT = 1_700_000_000.0


def fixture(name: str) -> dict[str, Any]:
    value = json.loads((FIXTURES / f"{name}.json").read_text())
    assert isinstance(value, dict)
    return value


def one(body: dict[str, Any], mapper: ClaudeMapper | None = None, at: float = AT) -> object:
    out = (mapper or ClaudeMapper()).map(body, at)
    assert len(out) == 1, out
    return out[0]


class TestToolEvents:
    """PreToolUse / PostToolUse / PostToolUseFailure become ToolStart / ToolEnd."""

    def test_pre_tool_use_bash(self) -> None:
        """Bash timeout (ms) gives timeout_s and a deadline from the receive time; the command
        (``pytest -x tests/``) runs tests, so the call is reported as ``Bash:test``."""
        ev = one(fixture("pre-tool-use-bash"))
        assert ev == ToolStart(
            session_id="8c35adc1-0000-4000-8000-000000000001",
            call_id="toolu_01ABCDEF",
            tool="Bash:test",
            started_at=AT,
            source=SOURCE_HOOK,
            harness="claude-code",
            deadline=AT + 300.0,
            timeout_s=300.0,
        )

    def test_bash_default_timeout(self) -> None:
        """A Bash call without ``timeout`` is cut at Claude Code's default 120 s."""
        body = fixture("pre-tool-use-bash")
        del body["tool_input"]["timeout"]
        ev = one(body)
        assert isinstance(ev, ToolStart)
        assert (ev.timeout_s, ev.deadline) == (120.0, AT + 120.0)

    def test_bash_run_in_background(self) -> None:
        """``run_in_background`` starts a background call, which no timeout bounds."""
        body = fixture("pre-tool-use-bash")
        body["tool_input"]["run_in_background"] = True
        ev = one(body)
        assert isinstance(ev, ToolStart)
        assert (ev.background, ev.timeout_s, ev.deadline) == (True, None, None)

    def test_other_tool_has_no_timeout(self) -> None:
        """Tools without a timeout parameter start with no deadline."""
        body = fixture("pre-tool-use-bash") | {"tool_name": "Read", "tool_input": {"x": 1}}
        ev = one(body)
        assert isinstance(ev, ToolStart)
        assert (ev.tool, ev.timeout_s, ev.deadline, ev.background) == ("Read", None, None, False)

    @pytest.mark.parametrize(
        ("tool_input", "timeout_s"),
        [({"timeout_ms": 60_000}, 60.0), ({}, 300.0), ({"timeout_ms": 3_600_000}, 1800.0)],
    )
    def test_monitor_timeout(self, tool_input: dict[str, Any], timeout_s: float) -> None:
        """Monitor's ``timeout_ms`` (default 300 s, capped at 30 min) is its deadline."""
        body = fixture("pre-tool-use-bash") | {"tool_name": "Monitor", "tool_input": tool_input}
        ev = one(body)
        assert isinstance(ev, ToolStart)
        assert (ev.timeout_s, ev.deadline) == (timeout_s, AT + timeout_s)

    def test_post_tool_use(self) -> None:
        """``duration_ms`` becomes duration_s; a plain success is neither background nor
        censored."""
        ev = one(fixture("post-tool-use-bash"))
        assert ev == ToolEnd(
            session_id="8c35adc1-0000-4000-8000-000000000001",
            call_id="toolu_01ABCDEF",
            ended_at=AT,
            tool="Bash:test",
            source=SOURCE_HOOK,
            duration_s=8.421,
            ok=True,
        )

    def test_post_tool_use_without_duration(self) -> None:
        """Before Claude Code 2.1.119 there is no duration_ms: the service measures it."""
        body = fixture("post-tool-use-bash")
        del body["duration_ms"]
        ev = one(body)
        assert isinstance(ev, ToolEnd) and ev.duration_s is None

    def test_run_in_background_response(self) -> None:
        """A ``backgroundTaskId`` means the session is runnable again."""
        ev = one(fixture("post-tool-use-run-in-background"))
        assert isinstance(ev, ToolEnd)
        assert (ev.call_id, ev.background, ev.censored, ev.ok) == ("toolu_03", True, False, True)
        assert ev.duration_s == pytest.approx(0.414)

    def test_auto_backgrounded_at_timeout(self) -> None:
        """A command moved to the background at its timeout: background and censored."""
        ev = one(fixture("post-tool-use-auto-backgrounded"))
        assert isinstance(ev, ToolEnd)
        assert (ev.background, ev.censored, ev.duration_s) == (True, True, 120.004)

    def test_monitor_response_is_background(self) -> None:
        """Monitor returns once its watcher is armed; the watcher runs on in the background."""
        body = fixture("post-tool-use-bash") | {
            "tool_name": "Monitor",
            "tool_input": {"command": "tail -F x.log", "timeout_ms": 60000},
            "tool_response": {"taskId": "m1", "timeoutMs": 60000},
        }
        ev = one(body)
        assert isinstance(ev, ToolEnd) and ev.background

    def test_failure(self) -> None:
        """PostToolUseFailure ends the call as failed, with its duration."""
        ev = one(fixture("post-tool-use-failure"))
        assert isinstance(ev, ToolEnd)
        assert (ev.call_id, ev.ok, ev.censored, ev.background) == ("toolu_04", False, False, False)
        assert ev.duration_s == pytest.approx(0.037)

    @pytest.mark.parametrize(
        "change",
        [{"is_interrupt": True}, {"error": "Exit code 143\nCommand timed out after 2m 0s"}],
    )
    def test_failure_cut_short_is_censored(self, change: dict[str, Any]) -> None:
        """An interrupt or a timeout kill makes the duration a lower bound (censored)."""
        ev = one(fixture("post-tool-use-failure") | change)
        assert isinstance(ev, ToolEnd) and ev.censored and not ev.ok


class TestHumanTurn:
    """Stop → UserPromptSubmit is a call of the pseudo-tool ``user``."""

    def test_stop_then_prompt(self) -> None:
        """The prompt ends the call the Stop started, with the same call id."""
        mapper = ClaudeMapper()
        start = one(fixture("stop"), mapper, at=AT)
        end = one(fixture("user-prompt-submit"), mapper, at=AT + 42.0)
        assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
        assert (start.session_id, start.tool, start.started_at) == ("s1", USER_TOOL, AT)
        assert (start.deadline, start.background) == (None, False)
        assert (end.session_id, end.call_id, end.tool, end.ended_at) == (
            "s1",
            start.call_id,
            USER_TOOL,
            AT + 42.0,
        )

    def test_redelivered_stop_keeps_its_call_id(self) -> None:
        """The call id comes from the receive time, so mapping again gives the same event."""
        mapper = ClaudeMapper()
        assert one(fixture("stop"), mapper) == one(fixture("stop"), mapper)

    def test_prompt_without_stop(self) -> None:
        """The first prompt of a session has no human wait to end."""
        assert ClaudeMapper().map(fixture("user-prompt-submit"), AT) == []

    def test_turns_get_distinct_calls(self) -> None:
        """Each Stop opens a new call."""
        mapper = ClaudeMapper()
        first = one(fixture("stop"), mapper, at=AT)
        second = one(fixture("stop"), mapper, at=AT + 100)
        assert isinstance(first, ToolStart) and isinstance(second, ToolStart)
        assert first.call_id != second.call_id
        end = one(fixture("user-prompt-submit"), mapper, at=AT + 101)
        assert isinstance(end, ToolEnd) and end.call_id == second.call_id

    def test_memory_is_bounded(self) -> None:
        """Beyond ``max_sessions`` the oldest session's open call is forgotten."""
        mapper = ClaudeMapper(max_sessions=2)
        for sid in ("a", "b", "c"):
            mapper.map(fixture("stop") | {"session_id": sid}, AT)
        assert mapper.map(fixture("user-prompt-submit") | {"session_id": "a"}, AT) == []
        assert len(mapper.map(fixture("user-prompt-submit") | {"session_id": "c"}, AT)) == 1


class TestSessionEvents:
    """SessionEnd ends the session; SessionStart and unknown events map to nothing."""

    def test_session_end(self) -> None:
        """SessionEnd at the receive time, and the open human call is forgotten."""
        mapper = ClaudeMapper()
        mapper.map(fixture("stop"), AT)
        ev = one(fixture("session-end"), mapper, at=AT + 5)
        assert ev == SessionEnd(session_id="s1", ended_at=AT + 5, reason=END_COMPLETED)
        assert mapper.map(fixture("user-prompt-submit"), AT + 6) == []

    def test_session_start(self) -> None:
        """Nothing in SessionStart that TAO needs."""
        assert ClaudeMapper().map(fixture("session-start"), AT) == []

    @pytest.mark.parametrize("event", ["Notification", "PreCompact", "SubagentStop", "Future"])
    def test_unknown_events(self, event: str) -> None:
        """Events TAO does not use are ignored, even without a session id."""
        assert ClaudeMapper().map({"hook_event_name": event}, AT) == []


class TestBadPayloads:
    """A payload with a missing or wrongly typed field raises HookPayloadError naming it."""

    @pytest.mark.parametrize(
        ("name", "change", "reason"),
        [
            ("pre-tool-use-bash", {"hook_event_name": None}, "hook_event_name: expected a string"),
            ("pre-tool-use-bash", {"session_id": 7}, "session_id: expected a string, got int"),
            ("pre-tool-use-bash", {"session_id": ""}, "session_id: empty"),
            ("pre-tool-use-bash", {"tool_use_id": ["x"]}, "tool_use_id: expected a string"),
            ("pre-tool-use-bash", {"tool_input": "ls"}, "tool_input: expected an object, got str"),
            (
                "pre-tool-use-bash",
                {"tool_input": {"command": "ls", "timeout": "300000"}},
                "tool_input.timeout: expected a number of milliseconds, got str",
            ),
            (
                "pre-tool-use-bash",
                {"tool_input": {"command": "ls", "timeout": -1}},
                "tool_input.timeout: must be >= 0",
            ),
            (
                "pre-tool-use-bash",
                {"tool_input": {"command": "ls", "run_in_background": "yes"}},
                "tool_input.run_in_background: expected a boolean, got str",
            ),
            ("post-tool-use-bash", {"duration_ms": True}, "duration_ms: expected a number"),
            (
                "post-tool-use-bash",
                {"tool_response": {"backgroundTaskId": 5}},
                "tool_response.backgroundTaskId: expected a string, got int",
            ),
            (
                "post-tool-use-auto-backgrounded",
                {"tool_response": {"timedOutAfterMs": "2m"}},
                "tool_response.timedOutAfterMs: expected a number of milliseconds",
            ),
            ("post-tool-use-failure", {"is_interrupt": "no"}, "is_interrupt: expected a boolean"),
            ("post-tool-use-failure", {"error": {"code": 1}}, "error: expected a string, got dict"),
            ("stop", {"session_id": None}, "session_id: expected a string, got null"),
            ("session-end", {"session_id": 1.5}, "session_id: expected a string, got float"),
        ],
    )
    def test_wrong_field(self, name: str, change: dict[str, Any], reason: str) -> None:
        body = fixture(name) | change
        with pytest.raises(HookPayloadError) as info:
            ClaudeMapper().map(body, AT)
        assert info.value.harness == "claude-code"
        assert info.value.reason.startswith(reason), info.value.reason

    @pytest.mark.parametrize(
        ("name", "field"),
        [
            ("pre-tool-use-bash", "tool_use_id"),
            ("pre-tool-use-bash", "tool_name"),
            ("post-tool-use-bash", "tool_use_id"),
            ("post-tool-use-failure", "session_id"),
            ("user-prompt-submit", "session_id"),
            ("pre-tool-use-bash", "hook_event_name"),
        ],
    )
    def test_missing_field(self, name: str, field: str) -> None:
        body = fixture(name)
        del body[field]
        with pytest.raises(HookPayloadError, match=f"{field}: missing"):
            ClaudeMapper().map(body, AT)


class TestRegistry:
    """Harnesses are found by name or subject token; mappers are fresh per call."""

    def test_names_and_tokens(self) -> None:
        assert HARNESS_NAMES == ("claude-code", "opencode", "openhands", "mini-swe-agent")
        assert find("claude") is find("claude-code")
        assert find("claude").token == "claude"
        assert find("mini-swe-agent").token == "miniswe"
        assert [find(n).command_hooks for n in HARNESS_NAMES] == [True, False, True, False]

    def test_unknown(self) -> None:
        with pytest.raises(UnknownHarnessError, match="unknown; known: claude-code"):
            find("cursor")

    def test_fresh_claude_mapper(self) -> None:
        """Each call gives a new instance with its own state."""
        a, b = mapper_for("claude"), mapper_for("claude-code")
        assert isinstance(a, ClaudeMapper) and isinstance(b, ClaudeMapper) and a is not b
        assert a.harness == "claude-code"


def test_pre_tool_use_after_its_own_end_maps_to_nothing() -> None:
    """Async hooks: PostToolUse can arrive first; the late PreToolUse must not reopen it."""
    mapper = ClaudeMapper()
    pre = fixture("pre-tool-use-bash")
    post = fixture("post-tool-use-bash")
    assert [type(m) for m in mapper.map(post, AT)] == [ToolEnd]
    assert mapper.map(pre, AT + 0.01) == []
    # another session's call with the same id still starts; the order of one call is per session
    assert [type(m) for m in mapper.map({**pre, "session_id": "other"}, AT)] == [ToolStart]
    # bounded memory: the oldest ended ids are forgotten
    small = ClaudeMapper(max_ended=1)
    small.map(post, AT)
    small.map({**post, "tool_use_id": "toolu_other"}, AT)
    assert [type(m) for m in small.map(pre, AT)] == [ToolStart]
