"""OpenCode (npm ``opencode-ai``, ``opencode run``) through TAO's gateway, with and without TAO's
plugin.

OpenCode gets an OpenAI-compatible provider ``tao`` (``@ai-sdk/openai-compatible``, which
OpenCode installs itself from npm on first use) whose base URL is the recorder in front of the
gateway. With the plugin (``tao hooks install opencode --scope project``), the node asks for a
``bash`` call (``sleep 1``); OpenCode runs it, the plugin's payloads reach ``/hooks/opencode``
and the gateway's session is OpenCode's. Without it, a parent session starts a sub-agent
(``task``) that runs the command: the gateway keeps each session together from OpenCode's own
headers and links the child to its parent (``x-parent-session-id``).

OpenCode's caches (its npm cache, its bin directory) live under the harness cache, so only the
first run downloads; its config, data and state are the test's own temporary directories.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from shared.contracts import ToolEnd, ToolStart
from shared.harness.opencode import OpenCodeMapper
from tests.harness.conftest import (
    CACHE,
    HarnessStack,
    Seen,
    install_hooks,
    npm_client,
    pinned,
    request_rows,
    write_capture,
)
from tests.harness.recorder import TEXT, Recorded, Recorder, tool_results, tool_script

pytestmark = pytest.mark.harness

VERSION = "1.18.33"
"""The version the captures in docs/harnesses.md come from."""
RUN_TIMEOUT_S = 180
TAO = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "tao"


def _project(tmp_path: Path, base_url: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "tao": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "TAO",
                "options": {"baseURL": f"{base_url}/v1", "apiKey": "dummy"},
                "models": {"tao-sim": {"name": "tao-sim", "tool_call": True}},
            }
        },
        "model": "tao/tao-sim",
        "small_model": "tao/tao-sim",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"bash": "allow", "edit": "allow"},
    }
    (project / "opencode.json").write_text(json.dumps(config))
    return project


def _run(opencode: Path, project: Path, tmp_path: Path, prompt: str, gateway: str) -> str:
    home = CACHE / "opencode" / "home"  # npm and OpenCode caches, reused between runs
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "TAO_GATEWAY_URL": gateway,
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    run = subprocess.run(
        [str(opencode), "run", "--print-logs", prompt],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert run.returncode == 0, f"opencode exited {run.returncode}: {run.stderr[-4000:]}"
    return run.stderr


def _chat(recorded: list[Recorded]) -> list[Recorded]:
    return [r for r in recorded if r.path == "/v1/chat/completions" and r.method == "POST"]


def _capture(name: str, version: str, recorded: list[Recorded], seen: Seen, sids: set[str]) -> None:
    write_capture(
        name,
        {
            "version": version,
            "requests": request_rows(recorded, "authorization"),
            "session_requests": [
                {
                    "session_id": m.session_id,
                    "parent_session_id": m.parent_session_id,
                    "harness": m.harness,
                    "stream": m.stream,
                }
                for m in seen.requests()
                if m.session_id in sids
            ],
        },
    )


def test_opencode_with_tao_plugin_runs_bash_and_tao_sees_it(
    harness_stack: HarnessStack, tmp_path: Path
) -> None:
    version = pinned("opencode", VERSION)
    opencode = npm_client("opencode", "opencode-ai", version, "opencode")
    with Recorder(harness_stack.gateway, commands=("sleep 1",)) as rec:
        project = _project(tmp_path, rec.url)
        install_hooks("opencode", project)
        assert (project / ".opencode" / "plugins" / "tao.ts").exists()
        _run(opencode, project, tmp_path, "Wait one second with sleep.", rec.url)
        recorded = rec.all()

    chat = _chat(recorded)
    sids = {r.header("x-session-affinity") for r in chat}
    assert len(sids) == 1 and None not in sids, [r.headers for r in chat]
    sid = str(sids.pop())
    assert sid.startswith("ses_")
    for r in chat:  # OpenCode's own headers, and the plugin's
        assert r.header("X-Session-Id") == sid and r.header("X-TAO-Harness") == "opencode"
    tool_ids = [m["tool_call_id"] for m in chat[-1].body["messages"] if m.get("role") == "tool"]
    assert len(tool_ids) == 1, chat[-1].body["messages"]
    call_id = tool_ids[0]
    posted = [r.body for r in recorded if r.path == "/hooks/opencode"]
    assert all(r.status == 200 for r in recorded if r.path == "/hooks/opencode")
    assert {"tool.execute.before", "tool.execute.after", "event"} <= {p["hook"] for p in posted}

    def complete(seen: Seen) -> bool:
        reqs = [m for m in seen.requests() if m.session_id == sid]
        hooks = [h for h in seen.hooks if json.dumps(h).find(call_id) >= 0]
        return len(reqs) >= len(chat) and len(hooks) >= 4

    seen = harness_stack.seen().until(complete, f"session {sid}'s requests and bash call")
    requests = [m for m in seen.requests() if m.session_id == sid]
    assert {m.harness for m in requests} == {"opencode"}
    mapper, mapped = OpenCodeMapper(), []
    for payload in seen.hooks:
        if sid in json.dumps(payload):
            mapped += mapper.map(payload, time.time())
    starts = [m for m in mapped if isinstance(m, ToolStart) and m.call_id == call_id]
    ends = [m for m in mapped if isinstance(m, ToolEnd) and m.call_id == call_id]
    assert len(starts) == 1 and len(ends) == 1, mapped
    assert (starts[0].session_id, starts[0].tool) == (sid, "bash")
    assert ends[0].ok and ends[0].duration_s is not None and ends[0].duration_s >= 1.0, ends
    _capture("opencode", version, recorded, seen, {sid})


def _parent_then_child(body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """The parent asks for a sub-agent (``task``), the sub-agent for ``sleep 1``; then text."""
    names = {str((t.get("function") or {}).get("name")) for t in body.get("tools") or () if t}
    if tool_results(body.get("messages")):
        return TEXT
    if headers.get("x-parent-session-id") and "bash" in names:
        return tool_script("bash", {"command": "sleep 1"})
    if "task" in names:
        task = {"description": "Wait", "prompt": "Wait one second.", "subagent_type": "general"}
        return tool_script("task", task)
    return TEXT


def test_opencode_without_plugin_keeps_sessions_and_links_a_sub_agent(
    harness_stack: HarnessStack, tmp_path: Path
) -> None:
    version = pinned("opencode", VERSION)
    opencode = npm_client("opencode", "opencode-ai", version, "opencode")
    with Recorder(harness_stack.gateway, scripter=_parent_then_child) as rec:
        project = _project(tmp_path, rec.url)
        _run(opencode, project, tmp_path, "Ask a sub-agent to wait one second.", rec.url)
        recorded = rec.all()

    chat = _chat(recorded)
    assert not [r for r in recorded if r.path.startswith("/hooks")]  # no plugin, no hooks
    child_reqs = [r for r in chat if r.header("x-parent-session-id")]
    parent_reqs = [r for r in chat if not r.header("x-parent-session-id")]
    assert child_reqs and parent_reqs, [r.headers for r in chat]
    parents = {r.header("x-session-affinity") for r in parent_reqs}
    children = {r.header("x-session-affinity") for r in child_reqs}
    assert len(parents) == 1 and len(children) == 1 and parents != children, (parents, children)
    parent, child = str(parents.pop()), str(children.pop())
    assert {r.header("x-parent-session-id") for r in child_reqs} == {parent}
    ran = [m for r in child_reqs for m in r.body["messages"] if m.get("role") == "tool"]
    assert ran, "the sub-agent's bash call never ran"

    def complete(seen: Seen) -> bool:
        by = [m.session_id for m in seen.requests()]
        return by.count(parent) >= len(parent_reqs) and by.count(child) >= len(child_reqs)

    seen = harness_stack.seen().until(complete, f"sessions {parent} and {child}")
    child_events = [m for m in seen.requests() if m.session_id == child]
    assert {m.parent_session_id for m in child_events} == {parent}
    assert {m.parent_session_id for m in seen.requests() if m.session_id == parent} == {None}
    assert {m.harness for m in seen.requests() if m.session_id in (parent, child)} == {"opencode"}
    _capture("opencode-subagent", version, recorded, seen, {parent, child})
