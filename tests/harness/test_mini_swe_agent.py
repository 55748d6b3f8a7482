"""mini-swe-agent (PyPI ``mini-swe-agent``) through TAO's gateway, with TAO's environment wrapper.

``mini`` runs in its own virtual environment with its builtin ``mini.yaml``, the overlay that
``tao hooks install mini-swe-agent --scope project`` writes (``TaoEnvironment`` around the local
environment) and the test's settings: its litellm model (``openai/tao-sim``) on the recorder in
front of the gateway, ``X-Session-ID`` in ``model_kwargs.extra_headers`` and the same id as
``tao_session_id``. The node answers with ``bash`` tool calls: ``sleep 1``, then the submit
command. mini-swe-agent runs both itself; the wrapper's start/end payloads reach the gateway's
``/hooks/miniswe`` and the hook stream under the session the gateway served.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from shared.contracts import SessionEnd, ToolEnd, ToolStart
from shared.harness.miniswe import MiniSweMapper
from tests.harness.conftest import (
    ROOT,
    HarnessStack,
    Seen,
    install_hooks,
    pinned,
    pip_client,
    request_rows,
    write_capture,
)
from tests.harness.recorder import Recorder

pytestmark = pytest.mark.harness

VERSION = "2.4.6"
"""The version the captures in docs/harnesses.md come from."""
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
RUN_TIMEOUT_S = 180
TAO = Path(sys.executable).with_name("tao")


def _config(sid: str, base_url: str, cwd: Path) -> str:
    return json.dumps(  # JSON is YAML
        {
            "agent": {"mode": "yolo", "confirm_exit": False, "step_limit": 6, "cost_limit": 0},
            "environment": {"cwd": str(cwd), "timeout": 30, "tao_session_id": sid},
            "model": {
                "model_name": "openai/tao-sim",
                "cost_tracking": "ignore_errors",
                "model_kwargs": {
                    "api_base": f"{base_url}/v1",
                    "api_key": "dummy",
                    "extra_headers": {"X-Session-ID": sid},
                },
            },
        }
    )


def test_mini_swe_agent_runs_scripted_commands_and_tao_sees_them(
    harness_stack: HarnessStack, tmp_path: Path
) -> None:
    version = pinned("mini-swe-agent", VERSION)
    mini = pip_client("mini-swe-agent", f"mini-swe-agent=={version}", "mini")
    project = tmp_path / "project"
    project.mkdir()
    install_hooks("mini-swe-agent", project)
    overlay = project / "tao-mini-swe-agent.yaml"
    assert "shared.harness.miniswe_env.TaoEnvironment" in overlay.read_text()
    sid = f"mini-{uuid.uuid4().hex[:12]}"

    with Recorder(harness_stack.gateway, commands=("sleep 1", SUBMIT)) as rec:
        (project / "test.yaml").write_text(_config(sid, rec.url, project))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "PYTHONPATH": str(ROOT),  # shared.harness.miniswe_env (standard library only)
            "TAO_GATEWAY_URL": rec.url,  # the wrapper's payloads go through the recorder too
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of litellm's price list
        }
        traj = tmp_path / "traj.json"
        configs = ["-c", "mini.yaml", "-c", str(overlay), "-c", str(project / "test.yaml")]
        task = ["-t", "Wait one second, then submit.", "-y", "--exit-immediately"]
        run = subprocess.run(
            [str(mini), *configs, *task, "-o", str(traj)],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        recorded = rec.all()
    out = f"stdout: {run.stdout[-3000:]}\nstderr: {run.stderr[-3000:]}"
    assert run.returncode == 0, out
    trajectory = json.loads(traj.read_text())
    info = trajectory["info"]
    assert info["exit_status"] == "Submitted", (info, out)

    model = [r for r in recorded if r.path == "/v1/chat/completions" and r.method == "POST"]
    assert len(model) == 2, [(r.method, r.path, r.status) for r in recorded]
    for r in model:
        assert r.header("X-Session-ID") == sid, r.headers
    hook_posts = [r for r in recorded if r.path == "/hooks/miniswe"]
    assert len(hook_posts) == 4, [(r.path, r.body) for r in hook_posts]
    assert all(r.status == 200 for r in hook_posts)
    call_ids = [r.body["call_id"] for r in hook_posts if r.body["event"] == "start"]
    tool_ids = [m["tool_call_id"] for m in model[-1].body["messages"] if m.get("role") == "tool"]
    assert call_ids[:1] == tool_ids, (call_ids, tool_ids)  # the model's tool_call_id

    def complete(seen: Seen) -> bool:
        reqs = [m for m in seen.requests() if m.session_id == sid]
        ends = [h for h in seen.hooks if h.get("session_id") == sid and h.get("event") == "end"]
        return len(reqs) >= 2 and len(ends) >= 2

    seen = harness_stack.seen().until(complete, f"session {sid}'s requests and commands")
    requests = [m for m in seen.requests() if m.session_id == sid]
    assert {m.model for m in requests} == {"tao-sim"}
    mapper, mapped = MiniSweMapper(), []
    for payload in seen.hooks:
        if payload.get("session_id") == sid:
            mapped += mapper.map(payload, time.time())
    starts = [m for m in mapped if isinstance(m, ToolStart)]
    ends = [m for m in mapped if isinstance(m, ToolEnd)]
    assert [s.call_id for s in starts] == call_ids and len(ends) == 2
    sleep = next(e for e in ends if e.call_id == call_ids[0])
    assert sleep.ok and sleep.duration_s is not None and sleep.duration_s >= 1.0, sleep
    assert any(isinstance(m, SessionEnd) and m.session_id == sid for m in mapped), mapped

    write_capture(
        "mini-swe-agent",
        {
            "version": version,
            "requests": request_rows(recorded, "authorization"),
            "session_requests": [
                {"harness": m.harness, "stream": m.stream, "max_tokens": m.max_tokens}
                for m in requests
            ],
        },
    )
