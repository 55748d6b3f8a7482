"""The `tao up` run file: location, round trip, stale PIDs, and corrupt files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.infra import (
    RunFileError,
    RunInfo,
    find_running,
    read_run_file,
    remove_run_file,
    run_file_path,
    write_run_file,
)


def info(pid: int) -> RunInfo:
    return RunInfo(pid=pid, nats_url="nats://127.0.0.1:1", redis_url="redis://127.0.0.1:2/0")


def dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class TestLocation:
    def test_tao_run_file_wins(self, tmp_path: Path) -> None:
        """TAO_RUN_FILE overrides every other location."""
        env = {"TAO_RUN_FILE": str(tmp_path / "x.json"), "XDG_RUNTIME_DIR": "/run/user/1"}
        assert run_file_path(env) == tmp_path / "x.json"

    def test_xdg_runtime_dir_then_home_cache(self) -> None:
        """Without TAO_RUN_FILE: $XDG_RUNTIME_DIR/tao/run.json, else ~/.cache/tao/run.json."""
        assert run_file_path({"XDG_RUNTIME_DIR": "/run/user/1"}) == Path("/run/user/1/tao/run.json")
        assert run_file_path({"HOME": "/home/a"}) == Path("/home/a/.cache/tao/run.json")


class TestRoundTrip:
    def test_written_file_is_found_while_the_pid_lives(self, tmp_path: Path) -> None:
        """A run file naming a live PID is returned by find_running, with a start time filled in."""
        path = write_run_file(info(os.getpid()), tmp_path / "tao" / "run.json")
        found = find_running(path)
        assert found is not None and found.pid == os.getpid() and found.started_at > 0
        assert found.nats_url == "nats://127.0.0.1:1"

    def test_stale_pid_is_not_running(self, tmp_path: Path) -> None:
        """A run file whose PID has exited is stale: read returns it, find_running does not."""
        path = write_run_file(info(dead_pid()), tmp_path / "run.json")
        assert read_run_file(path) is not None
        assert find_running(path) is None

    def test_missing_file_is_none(self, tmp_path: Path) -> None:
        """No run file means nothing is running."""
        assert read_run_file(tmp_path / "none.json") is None
        assert find_running(tmp_path / "none.json") is None

    def test_corrupt_file_raises_naming_the_path(self, tmp_path: Path) -> None:
        """A file that is not a run file raises RunFileError with the path in its message."""
        path = tmp_path / "run.json"
        path.write_text('{"pid": "x"}')
        with pytest.raises(RunFileError, match=str(path)):
            read_run_file(path)


class TestRemove:
    def test_remove_with_pid_only_removes_its_own_file(self, tmp_path: Path) -> None:
        """remove_run_file(pid=...) leaves a file written by another `tao up` alone."""
        path = write_run_file(info(os.getpid()), tmp_path / "run.json")
        remove_run_file(path, pid=os.getpid() + 1)
        assert path.exists()
        remove_run_file(path, pid=os.getpid())
        assert not path.exists()
