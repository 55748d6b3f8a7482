"""Session identity without hooks: the ids harnesses send, their precedence, parents, harnesses.

The first table is the requests real clients sent (tests/fixtures/*/gateway-request-*.json,
captured by tests/harness): each must land in the session the harness's own hooks report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.gateway.apis import CHAT, COMPLETIONS, MESSAGES, Api
from services.gateway.requests import (
    harness_from_agent,
    header,
    parent_session,
    session_identity,
)
from shared.contracts import ToolStart
from shared.harness.claude import ClaudeMapper, sub_agent_session

FIXTURES = Path(__file__).parents[2] / "fixtures"


def new_id() -> str:
    return "generated"


def captured(path: str) -> dict[str, Any]:
    value = json.loads((FIXTURES / path).read_text())
    assert isinstance(value, dict)
    return value


CLAUDE = captured("claude-code/gateway-request-2.1.197.json")
CLAUDE_SUB = captured("claude-code/gateway-request-subagent-2.1.197.json")
CLAUDE_SUB_HOOK = captured("claude-code/subagent-pre-tool-use-bash.json")
OPENCODE = captured("opencode/gateway-request-1.18.33.json")
MINI = captured("mini-swe-agent/gateway-request-2.4.6.json")
CLAUDE_SID = CLAUDE["headers"]["X-Claude-Code-Session-Id"]
OC_PARENT = OPENCODE["parent"]["headers"]["x-session-affinity"]
OC_CHILD = OPENCODE["sub_agent"]["headers"]["x-session-affinity"]


def _without(headers: dict[str, str], *names: str) -> dict[str, str]:
    low = {n.lower() for n in names}
    return {k: v for k, v in headers.items() if k.lower() not in low}


class TestCapturedClients:
    @pytest.mark.parametrize(
        ("api", "headers", "body", "session", "source", "harness", "parent"),
        [
            # Claude Code 2.1.197: metadata.user_id (JSON form) and the header, equal.
            (
                MESSAGES,
                CLAUDE["headers"],
                CLAUDE["body"],
                CLAUDE_SID,
                "metadata",
                "claude-code",
                None,
            ),
            # ... the header alone still names the session (older metadata, a proxy that
            # drops it).
            (MESSAGES, CLAUDE["headers"], {}, CLAUDE_SID, "claude_header", "claude-code", None),
            # ... a sub-agent: its own session (the one its hooks map to), linked to the parent.
            (
                MESSAGES,
                CLAUDE_SUB["headers"],
                CLAUDE_SUB["body"],
                sub_agent_session(
                    CLAUDE_SUB["headers"]["X-Claude-Code-Session-Id"],
                    CLAUDE_SUB["headers"]["x-claude-code-agent-id"],
                ),
                "metadata",
                "claude-code",
                CLAUDE_SUB["headers"]["X-Claude-Code-Session-Id"],
            ),
            # OpenCode 1.18.33 without TAO's plugin: its own X-Session-Id.
            (
                CHAT,
                OPENCODE["parent"]["headers"],
                OPENCODE["parent"]["body"],
                OC_PARENT,
                "header",
                "opencode",
                None,
            ),
            # ... a sub-agent: its own session, linked to the parent.
            (
                CHAT,
                OPENCODE["sub_agent"]["headers"],
                OPENCODE["sub_agent"]["body"],
                OC_CHILD,
                "header",
                "opencode",
                OC_PARENT,
            ),
            # ... a version or provider path without X-Session-Id: x-session-affinity.
            (
                CHAT,
                _without(OPENCODE["sub_agent"]["headers"], "x-session-id"),
                {},
                OC_CHILD,
                "affinity",
                "opencode",
                OC_PARENT,
            ),
            # mini-swe-agent 2.4.6: only the X-Session-ID its config adds (no harness named).
            (
                CHAT,
                MINI["headers"],
                MINI["body"],
                MINI["headers"]["x-session-id"],
                "header",
                None,
                None,
            ),
            # ... without it, nothing names a session: one turn under a generated id.
            (
                CHAT,
                _without(MINI["headers"], "x-session-id"),
                MINI["body"],
                "generated",
                "generated",
                None,
                None,
            ),
        ],
    )
    def test_each_lands_in_its_session(
        self,
        api: Api,
        headers: dict[str, str],
        body: dict[str, Any],
        session: str,
        source: str,
        harness: str | None,
        parent: str | None,
    ) -> None:
        sid, got_source = api.identity(headers, body, new_id)
        assert (sid, got_source) == (session, source)
        assert api.harness(None, got_source, headers) == harness
        assert parent_session(headers, sid) == parent


META = {"metadata": {"user_id": json.dumps({"session_id": "meta"})}}


def test_a_claude_sub_agents_requests_and_hooks_meet_in_one_session() -> None:
    """The request and the hook payload were captured in one run of Claude Code 2.1.197."""
    sid, _ = MESSAGES.identity(CLAUDE_SUB["headers"], CLAUDE_SUB["body"], new_id)
    [start] = ClaudeMapper().map(CLAUDE_SUB_HOOK, 0.0)
    assert isinstance(start, ToolStart) and start.session_id == sid


class TestPrecedence:
    @pytest.mark.parametrize(
        ("api", "headers", "body", "expected"),
        [
            # every source present: Claude Code's metadata (messages only) wins
            (
                MESSAGES,
                {
                    "X-Claude-Code-Session-Id": "cc",
                    "X-Session-ID": "tao",
                    "x-session-affinity": "aff",
                },
                {**META, "user": "u"},
                ("meta", "metadata"),
            ),
            (
                CHAT,
                {
                    "X-Claude-Code-Session-Id": "cc",
                    "X-Session-ID": "tao",
                    "x-session-affinity": "aff",
                },
                {**META, "user": "u"},
                ("cc", "claude_header"),
            ),
            (
                CHAT,
                {"X-Session-ID": "tao", "x-session-affinity": "aff"},
                {"user": "u"},
                ("tao", "header"),
            ),
            (
                COMPLETIONS,
                {"x-session-affinity": "aff"},
                {"user": "u", "program_id": "p"},
                ("aff", "affinity"),
            ),
            (CHAT, {}, {"user": "u", "program_id": "p"}, ("u", "user")),
            (CHAT, {}, {"program_id": "p"}, ("p", "program_id")),
            (CHAT, {}, {}, ("generated", "generated")),
            # header names in any case; blank values are skipped
            (CHAT, {"x-claude-code-session-id": "cc"}, {}, ("cc", "claude_header")),
            (CHAT, {"X-SESSION-AFFINITY": "aff"}, {}, ("aff", "affinity")),
            (
                CHAT,
                {
                    "X-Claude-Code-Session-Id": " ",
                    "X-Session-ID": "\t",
                    "x-session-affinity": "aff",
                },
                {},
                ("aff", "affinity"),
            ),
            # Claude Code's metadata is an Anthropic body field: chat ignores it
            (CHAT, {}, META, ("generated", "generated")),
            # a Claude Code sub-agent, only when Claude Code's own id named the session
            (MESSAGES, {"x-claude-code-agent-id": "a1"}, META, ("meta-agent-a1", "metadata")),
            (
                CHAT,
                {"X-Claude-Code-Session-Id": "cc", "x-claude-code-agent-id": "a1"},
                {},
                ("cc-agent-a1", "claude_header"),
            ),
            (CHAT, {"X-Session-ID": "tao", "x-claude-code-agent-id": "a1"}, {}, ("tao", "header")),
            # previous_response_id (Responses API, not served) names nothing
            (CHAT, {}, {"previous_response_id": "resp_1"}, ("generated", "generated")),
            # the body's session_id (OpenRouter's field; Cline 3.0.65 sends its session id there
            # through its OpenRouter provider): below every header, above user and program_id
            (
                CHAT,
                {},
                {"session_id": "cline-task", "user": "u", "program_id": "p"},
                ("cline-task", "session_field"),
            ),
            (COMPLETIONS, {}, {"session_id": "s", "user": "u"}, ("s", "session_field")),
            (MESSAGES, {}, {"session_id": "s"}, ("s", "session_field")),
            (MESSAGES, {}, {**META, "session_id": "s"}, ("meta", "metadata")),
            (CHAT, {"session-id": "codex"}, {"session_id": "s"}, ("codex", "codex")),
            (CHAT, {"X-SMG-Routing-Key": "smg"}, {"session_id": "s"}, ("smg", "smg")),
            (CHAT, {"X-Session-ID": "tao"}, {"session_id": "s"}, ("tao", "header")),
            (CHAT, {}, {"session_id": "\t", "user": "u"}, ("u", "user")),
            # prompt_cache_key is a caching key clients may share across sessions: not read
            (CHAT, {}, {"prompt_cache_key": "k"}, ("generated", "generated")),
            # AIPerf: X-Correlation-ID (one per conversation), or X-Dynamo-Session-ID for Dynamo;
            # a session_header of X-Session-Affinity reads as OpenCode's affinity header
            (CHAT, {"X-Correlation-ID": "conv-1"}, {}, ("conv-1", "correlation")),
            (CHAT, {"X-Dynamo-Session-ID": "dyn"}, {}, ("dyn", "dynamo")),
            (CHAT, {"X-Session-Affinity": "aff"}, {}, ("aff", "affinity")),
            (
                CHAT,
                {"X-Dynamo-Session-ID": "dyn", "X-Correlation-ID": "conv-1"},
                {},
                ("dyn", "dynamo"),
            ),
            (CHAT, {"X-SMG-Routing-Key": "smg", "X-Dynamo-Session-ID": "dyn"}, {}, ("smg", "smg")),
            (CHAT, {"session-id": "codex", "X-Correlation-ID": "c"}, {}, ("codex", "codex")),
            # ... the correlation header is the last header: a body id comes after it
            (CHAT, {"X-Correlation-ID": "c"}, {"session_id": "s"}, ("c", "correlation")),
            # vLLM's multi-turn benchmark (--send-conversation-id): body conversation_id,
            # after session_id, before user
            (CHAT, {}, {"conversation_id": "conv", "user": "u"}, ("conv", "conversation_field")),
            (CHAT, {}, {"conversation_id": "c", "session_id": "s"}, ("s", "session_field")),
        ],
    )
    def test_first_present_wins(
        self, api: Api, headers: dict[str, str], body: dict[str, Any], expected: tuple[str, str]
    ) -> None:
        assert api.identity(headers, body, new_id) == expected

    def test_body_session_id_beats_previous_response_id(self) -> None:
        """Both name the session on /v1/responses; the client's own id is read first."""

        def previous(rid: str) -> str | None:
            return "chained" if rid == "resp_1" else None

        body = {"previous_response_id": "resp_1", "user": "u"}
        assert session_identity({}, body, new_id, previous=previous) == (
            "chained",
            "previous_response",
        )
        assert session_identity({}, {**body, "session_id": "s"}, new_id, previous=previous) == (
            "s",
            "session_field",
        )

    def test_session_identity_takes_the_metadata_id_first(self) -> None:
        headers = {"X-Claude-Code-Session-Id": "cc"}
        assert session_identity(headers, {}, new_id, claude_metadata="m") == ("m", "metadata")
        assert session_identity(headers, {}, new_id, claude_metadata=None) == (
            "cc",
            "claude_header",
        )


class TestParent:
    @pytest.mark.parametrize(
        ("headers", "session", "expected"),
        [
            ({"x-parent-session-id": "ses_p"}, "ses_c", "ses_p"),
            ({"X-Parent-Session-Id": " ses_p "}, "ses_c", "ses_p"),
            ({"x-parent-session-id": ""}, "ses_c", None),
            ({"x-parent-session-id": "ses_c"}, "ses_c", None),  # itself: no parent
            ({"x-parent-session-id": "p" * 513}, "ses_c", None),  # over MAX_ID_CHARS
            ({}, "ses_c", None),
            # Claude Code: the parent is the session the sub-agent session was made from
            ({"x-claude-code-agent-id": "a1"}, "cc-agent-a1", "cc"),
            ({"x-claude-code-agent-id": "a1"}, "other", None),
            ({"x-parent-session-id": "p", "x-claude-code-agent-id": "a1"}, "cc-agent-a1", "p"),
        ],
    )
    def test_parent_session(
        self, headers: dict[str, str], session: str, expected: str | None
    ) -> None:
        assert parent_session(headers, session) == expected


class TestHarness:
    @pytest.mark.parametrize(
        ("named", "source", "agent", "expected"),
        [
            ("mine", "metadata", "opencode/1.18.33", "mine"),  # X-TAO-Harness wins
            (None, "claude_header", None, "claude-code"),
            (None, "header", "claude-cli/2.1.197 (external, sdk-cli)", "claude-code"),
            (None, "affinity", "opencode/1.18.33 ai-sdk/provider-utils/4.0.23", "opencode"),
            (None, "header", "OpenAI/Python 3.57.0", None),
            (None, "header", "my-opencode/1.0", None),  # a prefix, not a substring
            (None, "generated", None, None),
        ],
    )
    def test_harness(
        self, named: str | None, source: Any, agent: str | None, expected: str | None
    ) -> None:
        headers = {} if agent is None else {"User-Agent": agent}
        assert CHAT.harness(named, source, headers) == expected

    def test_agent_alone(self) -> None:
        assert harness_from_agent({"user-agent": "opencode/1.2"}) == "opencode"
        assert harness_from_agent({}) is None

    def test_header_lookup_is_case_insensitive_on_plain_dicts(self) -> None:
        assert header({"x-session-id": " s "}, "X-Session-ID") == "s"
        assert header({}, "X-Session-ID") == ""
