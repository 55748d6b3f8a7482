"""Claude Code sub-agents: their hook payloads (captured from 2.1.197) map to a session of their
own, linked to the parent's, which the parent's finished ``Agent`` call ends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.contracts import SessionEnd, ToolEnd, ToolStart
from shared.harness.base import HookPayloadError
from shared.harness.claude import ClaudeMapper, sub_agent_session

FIXTURES = Path(__file__).parents[2] / "fixtures" / "claude-code"
AT = 1_700_000_000.0


def fixture(name: str) -> dict[str, Any]:
    value = json.loads((FIXTURES / f"{name}.json").read_text())
    assert isinstance(value, dict)
    return value


PRE = fixture("subagent-pre-tool-use-bash")
POST = fixture("subagent-post-tool-use-bash")
AGENT_END = fixture("post-tool-use-agent")
PARENT = PRE["session_id"]
CHILD = sub_agent_session(PARENT, PRE["agent_id"])


def test_the_sub_agent_session_is_named_after_its_parent() -> None:
    assert f"{PARENT}-agent-{PRE['agent_id']}" == CHILD
    assert AGENT_END["session_id"] == PARENT  # captured in the same run
    assert AGENT_END["tool_response"]["agentId"] == PRE["agent_id"]


def test_a_sub_agent_tool_call_starts_and_ends_in_its_session() -> None:
    mapper = ClaudeMapper()
    [start] = mapper.map(PRE, AT)
    [end] = mapper.map(POST, AT + 1.0)
    assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
    assert (start.session_id, start.call_id, start.tool) == (CHILD, PRE["tool_use_id"], "Bash")
    assert (end.session_id, end.call_id) == (CHILD, PRE["tool_use_id"])
    assert end.duration_s == POST["duration_ms"] / 1000.0


@pytest.mark.parametrize(
    ("response", "ends_child"),
    [
        (AGENT_END["tool_response"], True),
        (AGENT_END["tool_response"] | {"status": "async_launched"}, False),  # still running
        ({k: v for k, v in AGENT_END["tool_response"].items() if k != "agentId"}, False),
        (None, False),
    ],
)
def test_the_parents_finished_agent_call_ends_the_sub_agent(
    response: dict[str, Any] | None, ends_child: bool
) -> None:
    out = ClaudeMapper().map(AGENT_END | {"tool_response": response}, AT)
    assert isinstance(out[0], ToolEnd) and out[0].session_id == PARENT
    assert out[0].tool == "Agent"
    ends = [m for m in out if isinstance(m, SessionEnd)]
    assert [e.session_id for e in ends] == ([CHILD] if ends_child else [])


@pytest.mark.parametrize(
    ("change", "field"),
    [({"agent_id": 7}, "agent_id"), ({"tool_response": {"agentId": 7}}, "agentId")],
)
def test_badly_typed_agent_ids_are_named(change: dict[str, Any], field: str) -> None:
    body = (AGENT_END if "tool_response" in change else PRE) | change
    with pytest.raises(HookPayloadError, match=field):
        ClaudeMapper().map(body, AT)


def test_an_empty_agent_id_is_the_parent_session() -> None:
    [start] = ClaudeMapper().map(PRE | {"agent_id": ""}, AT)
    assert isinstance(start, ToolStart) and start.session_id == PARENT
