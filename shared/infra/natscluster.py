"""A NATS cluster on one machine: ``size`` real nats-servers (JetStream) routed to each other.

For the scale-out tests and benchmarks (docs/scale-out.md): streams and the lease bucket can be
replicated (``replicas`` ≤ size), servers can be killed (SIGKILL) and restarted on the same
ports and store directories, as an operator's node failure and recovery would. Clients connect
with :attr:`NatsCluster.url`, every server's URL comma-separated (nats-py tries them in turn
and reconnects to a live one when its server dies).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from .embedded import find_nats_server, free_port, nats_answers, stop_processes
from .errors import EmbeddedServerError

__all__ = ["NatsCluster"]

_START_TIMEOUT_S = 15.0


class NatsCluster:
    """``size`` nats-servers named ``s0``…, cluster ``tao``, each with its own store."""

    def __init__(self, size: int = 3) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.ports = [free_port() for _ in range(size)]
        self.routes = [free_port() for _ in range(size)]
        self._root = Path(tempfile.mkdtemp(prefix="tao-nats-cluster-"))
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self._logs: list[IO[bytes] | None] = [None] * size

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.ports)

    def server_url(self, i: int) -> str:
        return f"nats://127.0.0.1:{self.ports[i]}"

    def start(self) -> NatsCluster:
        """Start every server and wait until each answers (JetStream's meta leader is elected
        a moment later: the first stream or bucket created may need a retry)."""
        try:
            for i in range(self.size):
                self._spawn(i)
            for i in range(self.size):
                self._wait(i)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, i: int) -> None:
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)
        store = self._root / f"s{i}"
        store.mkdir(exist_ok=True)
        cmd = [find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(self.ports[i])]
        cmd += ["-sd", str(store), "-n", f"s{i}", "--cluster_name", "tao"]
        cmd += ["--cluster", f"nats://127.0.0.1:{self.routes[i]}", "--routes", routes]
        log = open(self._root / f"s{i}.log", "ab")  # noqa: SIM115 - closed in stop()/kill()
        self._logs[i] = log
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise EmbeddedServerError("nats-server", f"cannot run {cmd[0]}: {exc}") from exc
        self._procs[i] = proc

    def _wait(self, i: int) -> None:
        proc = self._procs[i]
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc is None or proc.poll() is not None:
                raise EmbeddedServerError(
                    f"nats-server s{i}", f"exited (log: {self._root}/s{i}.log)"
                )
            if nats_answers(self.server_url(i)):
                return
            time.sleep(0.05)  # polling a child process at start-up
        raise EmbeddedServerError(f"nats-server s{i}", f"did not answer in {_START_TIMEOUT_S:g} s")

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (its store stays, for :meth:`restart`)."""
        proc = self._procs[i]
        if proc is not None:
            proc.kill()
            proc.wait()
            self._procs[i] = None
        log = self._logs[i]
        if log is not None:
            log.close()
            self._logs[i] = None

    def restart(self, i: int) -> None:
        """Start server ``i`` again on its port and store (it catches up from its peers)."""
        self.kill(i)
        self._spawn(i)
        self._wait(i)

    def alive(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def stop(self) -> None:
        """Stop every server and delete the stores."""
        stop_processes([p for p in self._procs if p is not None])
        self._procs = [None] * self.size
        for log in self._logs:
            if log is not None:
                log.close()
        self._logs = [None] * self.size
        shutil.rmtree(self._root, ignore_errors=True)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
