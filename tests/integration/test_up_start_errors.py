"""``tao up`` names the reason a service failed to start, in its one error line (it used to
say only ``gateway: exited with code 1 (log: ...)``, the reason left in the log)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

DEADLINE_S = 120.0


def _up(tmp_path: Path, nats_url: str, redis_url: str, *argv: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    env = {
        **os.environ,
        "TAO_NATS_URL": nats_url,
        "TAO_REDIS_URL": redis_url,
        "TAO_RUN_FILE": str(tmp_path / "run.json"),
        "TAO_NAMESPACE": f"up{os.getpid()}",
    }
    cmd = [sys.executable, "-m", "shared.cli.entry", "up", "--log-dir", str(tmp_path / "logs")]
    return subprocess.run(
        [*cmd, *argv], env=env, capture_output=True, text=True, timeout=DEADLINE_S, check=False
    )


def test_busy_port_is_named(tmp_path: Path, nats_url: str, redis_url: str) -> None:
    """The gateway cannot bind a port another process holds: exit 2, and the error line
    carries the OSError (address already in use), not just the exit code."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = _up(tmp_path, nats_url, redis_url, "--port", str(port), "--sim-nodes", "1")
    errors = [line for line in done.stderr.splitlines() if line.startswith("tao up: error:")]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1, done.stderr
    assert "gateway: exited with code 1: OSError" in errors[0]
    assert "address already in use" in errors[0] and "Traceback" not in done.stderr
