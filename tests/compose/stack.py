"""One compose project, driven through the ``docker compose`` CLI (the compose tier's helper)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 600
FIRST_REQUEST_S = 3.0
"""The bound on the first request after ``up --wait``. A warm stack answers it in about 0.3 s;
a gateway that reported healthy before its planner was warm held it about 8 s (issue 31: the
planner's numba warm-up, ``planner_warm`` 8.2 s). 3 s is ten times the first and well below the
second, so a slow CI machine passes and a cold planner behind a ready gateway does not."""
VIOLATION = re.compile(r"permissions? violation|publish violation|subscription violation", re.I)
ERROR_LINE = re.compile(r'"level":\s*"(error|critical)"')
"""A TAO service's JSON log line at level error or critical (``"error": null`` is a field of
healthy lines, so the word alone is no sign)."""
NATS_ERROR = re.compile(r"\[(ERR|FTL)\]")
"""nats-server's error and fatal lines."""
TRACEBACK = re.compile(r"Traceback \(most recent call last\)")
"""A Python traceback, printed raw or inside a JSON line's ``exception`` field."""
FORMING = re.compile(r"\[ERR\] Error trying to connect to route \(attempt \d+\)")
"""The one error line a healthy NATS cluster logs: while the servers of
deploy/compose.domains.yaml start together, each dials routes to peers not listening yet and
retries (the cluster's health checks, JetStream included, still have to pass)."""


def run(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    check: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command in the repository root; a failure shows its output."""
    done = subprocess.run(
        list(argv),
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-6000:]}\n--- stderr\n{done.stderr[-6000:]}"
        )
    return done


def wait_for(what: str, condition: Callable[[], bool], timeout: float, every: float = 0.5) -> float:
    """Poll ``condition`` until it holds; the seconds it took, or AssertionError naming ``what``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(every)
    return time.monotonic() - start


@dataclass
class ComposeStack:
    """``docker compose -f FILE -p PROJECT`` with extra environment (interpolated values)."""

    file: Path
    project: str
    env: dict[str, str] = field(default_factory=dict)

    def compose(self, *args: str, timeout: float = 300, check: bool = True,
                profiles: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
        argv = ["docker", "compose", "-f", str(self.file), "-p", self.project]
        for profile in profiles:
            argv += ["--profile", profile]
        return run([*argv, *args], env=self.env, timeout=timeout, check=check)

    def up(self) -> None:
        self.compose("up", "--detach", "--wait", "--wait-timeout", str(UP_TIMEOUT_S),
                     timeout=UP_TIMEOUT_S + 60)  # fmt: skip

    def down(self) -> None:
        self.compose("--profile", "*", "down", "--volumes", "--remove-orphans", "--timeout", "5",
                     timeout=300, check=False)  # fmt: skip

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.env['TAO_GATEWAY_HOST_PORT']}"

    def containers(self, all_: bool = True) -> dict[str, str]:
        """service name → container id (one container per service here)."""
        out = self.compose("ps", "--all" if all_ else "--status=running", "--format", "json")
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        return {row["Service"]: row["ID"] for row in rows}

    def inspect(self, container: str, template: str) -> str:
        return run(["docker", "inspect", "-f", template, container]).stdout.strip()

    def restarts(self) -> dict[str, int]:
        return {s: int(self.inspect(c, "{{.RestartCount}}")) for s, c in self.containers().items()}

    def trouble(self) -> dict[str, list[str]]:
        """service → what is wrong in its container: the :func:`trouble` lines of its log and a
        restart (RestartCount > 0); only services with something to show."""
        found: dict[str, list[str]] = {}
        for service, container in self.containers().items():
            lines = trouble(self.logs(service))
            count = int(self.inspect(container, "{{.RestartCount}}"))
            if count:
                lines.insert(0, f"container restarted {count} time(s)")
            if lines:
                found[service] = lines[:5]
        return found

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", "--no-log-prefix", service).stdout

    def exec(self, service: str, *command: str, user: str | None = None,
             check: bool = False) -> subprocess.CompletedProcess[str]:  # fmt: skip
        extra = ["--user", user] if user else []
        return self.compose("exec", "-T", *extra, service, *command, check=check, timeout=60)

    def gateway_key(self) -> str:
        """The key the gateway checks (docker/keys.sh put it in the gateway's own volume)."""
        return self.exec("gateway", "cat", "/keys/gateway-key", check=True).stdout.strip()

    def kill_main_process(self, service: str) -> None:
        """SIGKILL the service's process inside its container (as a crash would): the container
        exits and its restart policy brings it back (``docker kill`` would count as a stop)."""
        self.exec(service, "sh", "-c", "kill -KILL -1", check=False)

    def crash_and_restart(self, service: str) -> int:
        """:meth:`kill_main_process`, then wait until its restart policy has it running again;
        the restart count it had before."""
        container = self.containers()[service]
        before = int(self.inspect(container, "{{.RestartCount}}"))
        self.kill_main_process(service)
        wait_for(
            f"{service} restarted",
            lambda: (
                int(self.inspect(container, "{{.RestartCount}}")) > before
                and self.inspect(container, "{{.State.Running}}") == "true"
            ),
            timeout=60,
        )
        return before


def trouble(text: str) -> list[str]:
    """The lines of a log that tell of a refused permission, an error (a TAO service's, or
    nats-server's other than :data:`FORMING`) or a Python traceback."""
    return [
        ln
        for ln in text.splitlines()
        if VIOLATION.search(ln)
        or ERROR_LINE.search(ln)
        or TRACEBACK.search(ln)
        or (NATS_ERROR.search(ln) and not FORMING.search(ln))
    ]
