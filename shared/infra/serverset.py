"""What the one-machine server clusters share (:mod:`.natscluster`, :mod:`.rediscluster`): a
numbered set of real server processes, each with its own log file under one temporary folder,
that can be killed (SIGKILL) and restarted on the same port and data, and stopped together."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Self

from .embedded import stop_processes
from .errors import EmbeddedServerError

__all__ = ["ServerSet"]


class ServerSet:
    """``size`` servers; a subclass says how server ``i`` starts (:meth:`_command`) and when it
    answers (:meth:`_wait`), and forms the set in :meth:`start`."""

    what = "server"

    def __init__(self, size: int, prefix: str) -> None:
        self.size = size
        self._root = Path(tempfile.mkdtemp(prefix=prefix))
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self._logs: list[IO[bytes] | None] = [None] * size

    def _command(self, i: int) -> tuple[list[str], Path]:
        """Server ``i``'s command line and working folder."""
        raise NotImplementedError

    def _wait(self, i: int) -> None:
        """Until server ``i`` answers; EmbeddedServerError if it exits or never does."""
        raise NotImplementedError

    def log_path(self, i: int) -> Path:
        return self._root / f"{self.what}-{i}.log"

    def _spawn(self, i: int) -> None:
        cmd, folder = self._command(i)
        log = open(self.log_path(i), "ab")  # noqa: SIM115 - closed in kill()/stop()
        self._logs[i] = log
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=folder)
        except OSError as exc:
            raise EmbeddedServerError(self.what, f"cannot run {cmd[0]}: {exc}") from exc
        self._procs[i] = proc

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (its data stays, for :meth:`restart`)."""
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
        """Start server ``i`` again on its port and data; it rejoins its peers."""
        self.kill(i)
        self._spawn(i)
        self._wait(i)

    def heal(self) -> None:
        """Restart every server that is down (after a test that killed one), and wait until the
        whole set is settled again (:meth:`settled`)."""
        for i in range(self.size):
            if not self.alive(i):
                self.restart(i)
        self.settled()

    def settled(self) -> None:
        """Until the set as a whole serves again (a subclass: its peers have caught up)."""

    def _until(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        """Poll ``ok`` every 50 ms until it holds (an OSError or EmbeddedServerError from it
        counts as not yet); EmbeddedServerError naming ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except (OSError, EmbeddedServerError):
                pass
            time.sleep(0.05)  # polling the servers
        raise EmbeddedServerError(f"{self.what} set", f"{what}: not within {timeout:g} s")

    def alive(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def stop(self) -> None:
        """Stop every server and delete the folder."""
        stop_processes([p for p in self._procs if p is not None])
        self._procs = [None] * self.size
        for log in self._logs:
            if log is not None:
                log.close()
        self._logs = [None] * self.size
        shutil.rmtree(self._root, ignore_errors=True)

    def start(self) -> Self:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
