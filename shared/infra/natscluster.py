"""A NATS cluster on one machine: ``size`` real nats-servers (JetStream) routed to each other.

For the scale-out tests and benchmarks (docs/scale-out.md): streams and the lease bucket can be
replicated (``replicas`` ≤ size), servers can be killed (SIGKILL) and restarted on the same
ports and store directories, as an operator's node failure and recovery would. Clients connect
with :attr:`NatsCluster.url`, every server's URL comma-separated (nats-py tries them in turn
and reconnects to a live one when its server dies).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

from .embedded import find_nats_server, free_port, nats_answers
from .errors import EmbeddedServerError
from .serverset import ServerSet

__all__ = ["NatsCluster"]

_START_TIMEOUT_S = 15.0
_SETTLE_TIMEOUT_S = 60.0


class NatsCluster(ServerSet):
    """``size`` nats-servers named ``s0``…, cluster ``tao``, each with its own store."""

    what = "nats-server"

    def __init__(self, size: int = 3) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        super().__init__(size, "tao-nats-cluster-")
        self.ports = [free_port() for _ in range(size)]
        self.routes = [free_port() for _ in range(size)]
        self.monitors = [free_port() for _ in range(size)]
        """HTTP monitoring ports (``/healthz``: JetStream caught up, :meth:`settled`)."""

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

    def _command(self, i: int) -> tuple[list[str], Path]:
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.routes)
        store = self._root / f"s{i}"
        store.mkdir(exist_ok=True)
        cmd = [find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(self.ports[i])]
        cmd += ["-sd", str(store), "-n", f"s{i}", "--cluster_name", "tao"]
        cmd += ["--cluster", f"nats://127.0.0.1:{self.routes[i]}", "--routes", routes]
        cmd += ["-m", str(self.monitors[i])]
        return cmd, store

    def healthy(self, i: int) -> bool:
        """Whether server ``i``'s ``/healthz`` answers 200: it is up, JetStream is on and its
        streams and consumers have caught up with their raft groups."""
        url = f"http://127.0.0.1:{self.monitors[i]}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def settled(self) -> None:
        """Until every live server is healthy (after a kill and restart: the restarted one has
        caught up, so a stream created next finds all its replicas)."""
        live = [i for i in range(self.size) if self.alive(i)]
        self._until(
            "every live server's /healthz",
            lambda: all(self.healthy(i) for i in live),
            _SETTLE_TIMEOUT_S,
        )

    def _wait(self, i: int) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive(i):
                raise EmbeddedServerError(f"nats-server s{i}", f"exited (log: {self.log_path(i)})")
            if nats_answers(self.server_url(i)):
                return
            time.sleep(0.05)  # polling a child process at start-up
        raise EmbeddedServerError(f"nats-server s{i}", f"did not answer in {_START_TIMEOUT_S:g} s")
