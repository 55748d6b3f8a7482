"""Claude Code (npm ``@anthropic-ai/claude-code``), headless, through TAO's gateway, hooks on.

``claude -p`` runs in a fresh project whose ``.claude/settings.json`` got TAO's hooks from
``tao hooks install claude-code --scope project``, with ``ANTHROPIC_BASE_URL`` on the recorder
in front of the gateway; the node answers the first request with a ``Bash`` ``tool_use`` block
(``sleep 1``) and the next with text. Claude Code runs the command itself; its hooks reach TAO
through ``tao hook claude`` and NATS; the gateway, the hook payloads and the tools service's
events all name the one session id Claude Code made, and ``tao inspect session`` finds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from shared.contracts import SessionEnd, ToolEnd, ToolStart
from shared.harness.claude import ClaudeMapper, sub_agent_session
from tests.harness.conftest import (
    HarnessStack,
    Seen,
    install_hooks,
    npm_client,
    pinned,
    request_rows,
    write_capture,
)
from tests.harness.recorder import TEXT, Recorder, tool_results, tool_script

pytestmark = pytest.mark.harness

VERSION = "2.1.197"
"""The version the captures in docs/harnesses.md come from."""
RUN_TIMEOUT_S = 120
TAO = Path(sys.executable).with_name("tao")


def _claude_env(home: Path, base_url: str, hs: HarnessStack) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "dummy",  # the gateway forwards it; the sim node ignores it
        # Every model Claude Code picks (main, the small fast one) must be one TAO serves.
        "ANTHROPIC_MODEL": "tao-sim",
        "ANTHROPIC_SMALL_FAST_MODEL": "tao-sim",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "tao-sim",
        "ANTHROPIC_DEFAULT_SONNET_MODEL": "tao-sim",
        "ANTHROPIC_DEFAULT_OPUS_MODEL": "tao-sim",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **hs.tao_env(),
    }


def _install_hooks(project: Path) -> None:
    install_hooks("claude-code", project)
    settings = json.loads((project / ".claude" / "settings.json").read_text())
    assert "PreToolUse" in settings["hooks"] and "PostToolUse" in settings["hooks"]


def _tao_json(hs: HarnessStack, *args: str) -> dict[str, Any]:
    """``tao <args> --json`` against the stack's store."""
    done = subprocess.run(
        [str(TAO), *args, "--json", "--redis", hs.redis_url, "--domain", hs.domain],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def _await_tool_history(hs: HarnessStack, tool: str, timeout_s: float = 20.0) -> dict[str, Any]:
    """``tao inspect tools``' row of ``tool`` once it has a sample (the write may lag)."""
    deadline = time.monotonic() + timeout_s
    while True:
        row = _tao_json(hs, "inspect", "tools")["tools"].get(tool)
        if row and row["count"] >= 1:
            return dict(row)
        assert time.monotonic() < deadline, f"no {tool} sample in the store in {timeout_s:g} s"
        time.sleep(0.2)  # polling an external system with a deadline


def _hook_facts(hooks: list[dict[str, Any]], sid: str) -> dict[str, list[str]]:
    facts: dict[str, list[str]] = {}
    for payload in hooks:
        if payload.get("session_id") == sid:
            name = str(payload.get("hook_event_name"))
            facts[name] = sorted(set(facts.get(name, [])) | set(payload))
    return facts


def _claude_project(tmp_path: Path, version: str, *, hooks: bool) -> tuple[Path, Path, Path]:
    """The installed client, and a project (with TAO's hooks when ``hooks``) and a home."""
    claude = npm_client("claude-code", "@anthropic-ai/claude-code", version, "claude")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    if hooks:
        _install_hooks(project)
    return claude, project, home


def _run_claude(
    claude: Path,
    prompt: str,
    tools: str,
    project: Path,
    home: Path,
    base_url: str,
    stack: HarnessStack,
) -> dict[str, Any]:
    """``claude -p PROMPT`` against ``base_url``, bounded in time; its JSON result, checked to
    be a success."""
    run = subprocess.run(
        [
            str(claude),
            "-p",
            prompt,
            "--model",
            "tao-sim",
            "--allowedTools",
            tools,
            "--output-format",
            "json",
        ],
        cwd=project,
        env=_claude_env(home, base_url, stack),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, f"claude exited {run.returncode}: {run.stdout} {run.stderr}"
    result: dict[str, Any] = json.loads(run.stdout)
    assert result["is_error"] is False, result
    return result


def test_claude_code_runs_a_scripted_bash_call_and_tao_sees_it(
    harness_stack: HarnessStack, tmp_path: Path
) -> None:
    version = pinned("claude-code", VERSION)
    claude, project, home = _claude_project(tmp_path, version, hooks=True)
    with Recorder(harness_stack.gateway, commands=("sleep 1",)) as rec:
        result = _run_claude(
            claude,
            "Wait one second using the Bash tool.",
            "Bash",
            project,
            home,
            rec.url,
            harness_stack,
        )
        recorded = rec.all()
    sid = result["session_id"]
    assert result["num_turns"] == 2, result

    # What Claude Code sent: every model request names its session twice.
    model = [r for r in recorded if r.path == "/v1/messages" and r.method == "POST"]
    assert len(model) >= 2, [(r.method, r.path) for r in recorded]
    for r in model:
        assert r.header("X-Claude-Code-Session-Id") == sid, r.headers
        user_id = json.loads(r.body["metadata"]["user_id"])
        assert user_id["session_id"] == sid, user_id
    first, last = model[0], model[-1]
    assert first.scripted is not None and first.scripted["tool_call"]["name"] == "Bash"
    results = [
        b
        for m in last.body["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert len(results) == 1 and results[0]["is_error"] is False, results
    call_id = results[0]["tool_use_id"]

    # What TAO saw: the gateway's requests, the hook payloads and the tool call's start and end,
    # all under Claude Code's session id.
    def complete(seen: Seen) -> bool:
        reqs = [m for m in seen.requests() if m.session_id == sid]
        events = {h.get("hook_event_name") for h in seen.hooks if h.get("tool_use_id") == call_id}
        return len(reqs) >= len(model) and {"PreToolUse", "PostToolUse"} <= events

    seen = harness_stack.seen().until(complete, f"session {sid}'s requests and Bash hooks")
    requests = [m for m in seen.requests() if m.session_id == sid]
    assert {m.harness for m in requests} == {"claude-code"}
    assert {m.model for m in requests} == {"tao-sim"}
    hooks = _hook_facts(seen.hooks, sid)
    # The payloads as the tools service maps them: the call's start and its measured end.
    mapper, mapped = ClaudeMapper(), []
    for payload in seen.hooks:
        if payload.get("session_id") == sid:
            mapped += mapper.map(payload, time.time())
    start = next(m for m in mapped if isinstance(m, ToolStart) and m.call_id == call_id)
    end = next(m for m in mapped if isinstance(m, ToolEnd) and m.call_id == call_id)
    assert (start.session_id, start.tool, start.harness) == (sid, "Bash", "claude-code")
    assert end.session_id == sid and end.ok and not end.censored
    assert end.duration_s is not None and end.duration_s >= 1.0, end  # the real sleep 1

    # The tools service applied them: only a hook's ToolEnd records a duration (an end the
    # gateway infers from the next request does not), so Bash's history holds the call.
    bash = _await_tool_history(harness_stack, "Bash")
    assert bash["count"] >= 1 and bash["max_s"] >= 1.0, bash
    view = _tao_json(harness_stack, "inspect", "session", sid)
    assert view["session"] == sid and view["turns"] >= 2, view

    late = _hook_facts(harness_stack.seen().settle(3.0).hooks, sid)  # Stop, SessionEnd, if sent
    write_capture(
        "claude-code",
        {
            "version": version,
            "reported_version": subprocess.run(
                [str(claude), "--version"], capture_output=True, text=True, timeout=30
            ).stdout.strip(),
            "requests": request_rows(recorded, "x-api-key"),
            "hook_payload_keys": late or hooks,
            "session_requests": [
                {"harness": m.harness, "stream": m.stream, "max_tokens": m.max_tokens}
                for m in requests
            ],
            "tool_start": {"tool": start.tool, "timeout_s": start.timeout_s},
            "tool_end": {"duration_s": end.duration_s},
        },
    )


SUBAGENT_PROMPT = "SUBAGENT: wait one second using the Bash tool."


def _agent_then_bash(body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """The main agent starts a sub-agent (``Agent``), the sub-agent runs ``sleep 1``; then the
    main agent runs ``sleep 1`` too, then text. The sub-agent's conversation is the one whose
    first message holds :data:`SUBAGENT_PROMPT`.

    The main agent's last ``sleep 1`` keeps ``claude -p`` from exiting right after the Agent
    call's ``PostToolUse`` hook (the one that ends the sub-agent's session): Claude Code kills
    the async hooks still running when it exits (2.1.x, its hook registry's clean-up marks them
    "cancelled"), the limit docs/harnesses.md states; under CI load that hook was lost so."""
    names = {str(t.get("name")) for t in body.get("tools") or () if isinstance(t, dict)}
    messages = body.get("messages") or []
    done = tool_results(messages)
    sleep = {"command": "sleep 1", "description": "Wait one second"}
    if messages and SUBAGENT_PROMPT in json.dumps(messages[0]):
        return TEXT if done else tool_script("Bash", sleep)
    if done == 1:
        return tool_script("Bash", sleep)
    if done:
        return TEXT
    if "Agent" in names:
        task = {"description": "Wait", "prompt": SUBAGENT_PROMPT, "subagent_type": "claude"}
        return tool_script("Agent", task)
    return TEXT


@pytest.mark.parametrize("hooks", [False, True], ids=["no-hooks", "hooks"])
def test_claude_code_sub_agent(harness_stack: HarnessStack, tmp_path: Path, hooks: bool) -> None:
    version = pinned("claude-code", VERSION)
    claude, project, home = _claude_project(tmp_path, version, hooks=hooks)
    with Recorder(harness_stack.gateway, scripter=_agent_then_bash) as rec:
        result = _run_claude(
            claude,
            "Ask a sub-agent to wait one second.",
            "Bash,Agent",
            project,
            home,
            rec.url,
            harness_stack,
        )
        recorded = rec.all()
    sid = result["session_id"]
    model = [r for r in recorded if r.path == "/v1/messages" and r.method == "POST"]
    sub = [
        r
        for r in model
        if SUBAGENT_PROMPT in json.dumps(r.body.get("messages"))
        and r.scripted is not None
        and r.body["messages"][0].get("role") == "user"
        and SUBAGENT_PROMPT in json.dumps(r.body["messages"][0])
    ]
    assert sub, "the sub-agent made no request"
    ran = [
        b
        for r in sub
        for m in r.body["messages"]
        if isinstance(m.get("content"), list)
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]
    assert ran, "the sub-agent's Bash call never ran"

    agents = {r.header("x-claude-code-agent-id") for r in sub}
    assert len(agents) == 1 and None not in agents, [r.headers for r in sub]
    assert all(r.header("X-Claude-Code-Session-Id") == sid for r in model)
    child = sub_agent_session(sid, str(agents.pop()))
    assert not [r for r in model if r not in sub and r.header("x-claude-code-agent-id")]

    def complete(seen: Seen) -> bool:
        by = [m.session_id for m in seen.requests()]
        return by.count(sid) >= len(model) - len(sub) and by.count(child) >= len(sub)

    def mapped(seen: Seen) -> list[Any]:
        mapper, out = ClaudeMapper(), []
        for payload in seen.hooks:
            if payload.get("session_id") == sid:
                out += mapper.map(payload, time.time())
        return out

    def child_ended(seen: Seen) -> bool:
        return complete(seen) and child in [
            m.session_id for m in mapped(seen) if isinstance(m, SessionEnd)
        ]

    # With hooks, wait for the Agent call's end (the hook that ends the sub-agent): under load a
    # hook spools what it could not send in time and a drainer delivers it seconds later (and
    # the main agent's last call keeps Claude from exiting before it is sent: _agent_then_bash).
    if hooks:
        seen = harness_stack.seen().until(child_ended, f"the end of sub-agent session {child}")
    else:
        seen = harness_stack.seen().until(complete, f"sessions {sid} and {child}")
        seen.settle(3.0)  # a hook that would come last, were any sent
    parent_reqs = [m for m in seen.requests() if m.session_id == sid]
    child_reqs = [m for m in seen.requests() if m.session_id == child]
    assert {m.harness for m in parent_reqs + child_reqs} == {"claude-code"}
    assert {m.parent_session_id for m in parent_reqs} == {None}
    assert {m.parent_session_id for m in child_reqs} == {sid}
    if not hooks:
        assert not [h for h in seen.hooks if h.get("session_id") == sid]
    else:
        # The sub-agent's Bash call maps to the sub-agent's session, the parent's Agent call to
        # the parent's, and the Agent call's end ends the sub-agent's session.
        starts = {(m.session_id, m.tool) for m in mapped(seen) if isinstance(m, ToolStart)}
        assert {(child, "Bash"), (sid, "Agent")} <= starts, starts
    write_capture(
        f"claude-code-subagent-{'hooks' if hooks else 'no-hooks'}",
        {
            "version": version,
            "hooks": [h for h in seen.hooks if h.get("session_id") == sid],
            "session_requests": [
                {"session_id": m.session_id, "parent_session_id": m.parent_session_id}
                for m in parent_reqs + child_reqs
            ],
            "requests": [
                {**row, "sub_agent": r in sub}
                for r, row in zip(model, request_rows(model, "x-api-key"), strict=True)
            ],
        },
    )
