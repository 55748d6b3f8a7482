"""Codex CLI (npm ``@openai/codex``, headless ``codex exec``) through TAO's gateway.

Codex gets a model provider ``tao`` with ``wire_api = "responses"`` whose base URL is the
recorder in front of the gateway, so it speaks the Responses API (``POST /v1/responses``,
streamed). The node asks for its shell tool to run ``sleep 1``; Codex runs it and sends the
call and its output back in the next request's ``input``. TAO sees Codex's session from what it
sends (its ``session-id`` header, the conversation id; the gateway's precedence reads it before
the body and the content), infers the call from the answer (its ``function_call`` starts it, the
next request ends it), and ``tao inspect session`` finds the session with its turns.

Codex's home (``CODEX_HOME``: config, sessions, logs) is the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from shared.contracts import SessionResponse
from tests.harness.conftest import HarnessStack, npm_client, pinned, request_rows, write_capture
from tests.harness.recorder import Recorded, Recorder

pytestmark = pytest.mark.harness

VERSION = "0.171.0"
"""The version the captures in docs/harnesses.md come from."""
RUN_TIMEOUT_S = 180
TAO = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "tao"


def _config(home: Path, base_url: str, model: str) -> None:
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "tao"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "[model_providers.tao]\n"
        'name = "TAO"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "TAO_CODEX_KEY"\n'
    )


def _tao_json(hs: HarnessStack, *args: str) -> dict[str, Any]:
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


def _model(hs: HarnessStack) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{hs.gateway}/v1/models", timeout=5) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


def _responses(recorded: list[Recorded]) -> list[Recorded]:
    return [r for r in recorded if r.path == "/v1/responses" and r.method == "POST"]


def test_codex_exec_runs_a_shell_call_and_tao_sees_its_session(
    harness_stack: HarnessStack, tmp_path: Path
) -> None:
    version = pinned("codex", VERSION)
    codex = npm_client("codex", "@openai/codex", version, "codex")
    project = tmp_path / "project"
    project.mkdir()
    with Recorder(harness_stack.gateway, commands=("sleep 1",)) as rec:
        home = tmp_path / "codex-home"
        _config(home, rec.url, _model(harness_stack))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "CODEX_HOME": str(home),
            "TAO_CODEX_KEY": "dummy",
            "RUST_LOG": "warn",
        }
        run = subprocess.run(
            [str(codex), "exec", "--skip-git-repo-check", "Wait one second with sleep."],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        recorded = rec.all()
    turns = _responses(recorded)
    assert run.returncode == 0, f"codex exited {run.returncode}: {run.stderr[-4000:]} {turns}"
    assert len(turns) >= 2, [(r.path, r.status, r.scripted) for r in recorded]
    sids = {r.header("session-id") for r in turns}
    assert len(sids) == 1 and None not in sids, json.dumps([r.headers for r in turns], indent=1)
    sid = str(sids.pop())
    outputs = [i for i in turns[-1].body["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == 1, turns[-1].body["input"]
    call_id = outputs[0]["call_id"]

    def complete(seen: Any) -> bool:
        done = [m for m in seen.sessions if isinstance(m, SessionResponse) and m.session_id == sid]
        return len(done) >= len(turns)

    seen = harness_stack.seen().until(complete, f"Codex session {sid}'s turns")
    requests = [m for m in seen.requests() if m.session_id == sid]
    assert len(requests) == len(turns) and {m.harness for m in requests} == {"codex"}
    answers = [m for m in seen.sessions if isinstance(m, SessionResponse) and m.session_id == sid]
    called = [c for a in answers for c in a.tool_calls]
    assert [c.id for c in called] == [call_id], called
    deadline = time.monotonic() + 20
    while True:  # the inferred call's end is written with the next request (polling the store)
        view = _tao_json(harness_stack, "inspect", "session", sid)
        if view.get("turns", 0) >= len(turns):
            break
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["session"] == sid, view
    write_capture(
        "codex",
        {
            "version": version,
            "requests": request_rows(recorded, "authorization"),
            "input_types": [
                [i.get("type") or i.get("role") for i in r.body["input"]] for r in turns
            ],
            "tools": [t.get("name") or t.get("type") for t in turns[0].body.get("tools") or ()],
            "inspect_session": view,
        },
    )
