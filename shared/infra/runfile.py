"""The run file: where ``tao up`` records its servers, so other ``tao`` commands can find them.

Path: ``TAO_RUN_FILE`` if set, else ``$XDG_RUNTIME_DIR/tao/run.json``, else
``~/.cache/tao/run.json``. Content: one JSON object (:class:`RunInfo`). A run file whose PID is
no longer alive is stale: :func:`find_running` ignores it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

import msgspec

from .errors import RunFileError

__all__ = [
    "RunInfo",
    "find_running",
    "pid_alive",
    "read_run_file",
    "remove_run_file",
    "run_file_path",
    "write_run_file",
]


class RunInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A running ``tao up``: its PID, server URLs, and the services it started."""

    pid: int
    nats_url: str
    redis_url: str
    gateway_url: str | None = None
    started_at: float = 0.0
    namespace: str = ""
    services: tuple[str, ...] = ()
    nodes_file: str | None = None
    hook_nats_url: str | None = None
    """The URL ``tao hook`` publishes with (the ``hook`` role's, when access is on)."""


def run_file_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the run file lives (see the module docstring)."""
    env = os.environ if env is None else env
    if env.get("TAO_RUN_FILE"):
        return Path(env["TAO_RUN_FILE"]).expanduser()
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "tao" / "run.json"
    home = env.get("HOME") or str(Path.home())
    return Path(home) / ".cache" / "tao" / "run.json"


def write_run_file(info: RunInfo, path: Path | None = None) -> Path:
    """Write ``info`` atomically (temp file + rename); returns the path."""
    path = path or run_file_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    info = info if info.started_at else msgspec.structs.replace(info, started_at=time.time())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds credentials
    with os.fdopen(fd, "wb") as fh:
        fh.write(msgspec.json.encode(info))
    tmp.replace(path)
    return path


def read_run_file(path: Path | None = None) -> RunInfo | None:
    """The recorded run, or None if there is no run file; RunFileError if it is unreadable."""
    path = path or run_file_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RunFileError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    try:
        return msgspec.json.decode(data, type=RunInfo)
    except msgspec.DecodeError as exc:
        raise RunFileError(str(path), f"not a TAO run file: {exc}") from exc


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (signal 0; a process of another user counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def find_running(path: Path | None = None) -> RunInfo | None:
    """The recorded run if its process is alive; None if there is none or it is stale."""
    info = read_run_file(path)
    if info is None or not pid_alive(info.pid):
        return None
    return info


def remove_run_file(path: Path | None = None, *, pid: int | None = None) -> None:
    """Delete the run file; with ``pid``, only if it records that PID (``tao up`` on exit)."""
    path = path or run_file_path()
    if pid is not None:
        try:
            info = read_run_file(path)
        except RunFileError:
            return
        if info is None or info.pid != pid:
            return
    path.unlink(missing_ok=True)
