"""mini-swe-agent: the TaoEnvironment wrapper around execute, and MiniSweMapper of its payloads."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.session import END_COMPLETED, SessionEnd
from shared.contracts.tool import SOURCE_WRAPPER, ToolEnd, ToolStart
from shared.harness.base import HookPayloadError
from shared.harness.miniswe import HARNESS, MiniSweMapper
from shared.harness.miniswe_env import Publisher, TaoEnvironment, http_sink, resolve_class

FIXTURES = Path(__file__).parents[2] / "fixtures" / "mini-swe-agent"
AT = 1767225800.0


def load(name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return body


# -- fake mini-swe-agent environments (duck-typed: the project does not depend on it) ----------


class Config:
    timeout = 30


class Submitted(Exception):
    """Stands for minisweagent.exceptions.Submitted (matched by name)."""


class FakeV2Env:
    """v2 shape: execute(action: dict, cwd="", *, timeout=None) -> dict; failures as dicts."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.config = Config()
        self.calls: list[tuple[Any, ...]] = []

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict:
        self.calls.append((action, cwd, timeout))
        command = action["command"]
        if command == "submit":
            raise Submitted({"role": "exit", "content": "diff"})
        if command == "sleep 99":
            return {
                "output": "",
                "returncode": -1,
                "exception_info": "An error occurred while executing the command: timed out",
                "extra": {"exception_type": "TimeoutExpired", "exception": "timed out"},
            }
        return {"output": "3 passed", "returncode": 0, "exception_info": ""}

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {"cwd": "/repo", **kwargs}


class FakeV1Env:
    """v1 shape: execute(command: str, cwd="", *, timeout=None); a timeout raises."""

    def __init__(self) -> None:
        self.config = Config()

    def execute(self, command: str, cwd: str = "", *, timeout: int | None = None) -> dict:
        if command.startswith("sleep"):
            raise subprocess.TimeoutExpired(command, timeout or 30)
        return {"output": "ok", "returncode": 1}


class FakeOldEnv:
    """The first v1 shape: execute(command, cwd="") without a timeout keyword."""

    def execute(self, command: str, cwd: str = "") -> dict:
        return {"output": command, "returncode": 0}


def wrapped(inner: Any, sink: Any = None) -> tuple[TaoEnvironment, list[dict[str, Any]]]:
    got: list[dict[str, Any]] = []
    env = TaoEnvironment.wrap(inner, session_id="task-42", sink=sink or got.append)
    return env, got


def flushed(env: TaoEnvironment) -> None:
    assert env.tao_publisher.flush(10.0), "the publisher thread did not drain"


class TestWrapper:
    def test_config_builds_and_wraps_the_inner_environment(self) -> None:
        """environment_class kwargs: inner_class + the inner's own settings, passed through."""
        got: list[dict[str, Any]] = []
        env = TaoEnvironment(inner_class=FakeV2Env, tao_sink=got.append, image="py:3.11")
        assert isinstance(env.inner, FakeV2Env) and env.inner.kwargs == {"image": "py:3.11"}
        assert env.config is env.inner.config  # everything else is the inner's
        assert env.get_template_vars(x=1) == {"cwd": "/repo", "x": 1}
        assert env.tao_session_id.startswith("mswe-")

    def test_start_and_end_around_execute(self) -> None:
        """A v2 call reports start (with the config timeout) and end (with its outcome) under
        the model's tool_call_id; the result is the inner's, untouched."""
        inner = FakeV2Env()
        env, got = wrapped(inner)
        result = env.execute({"command": "pytest -q", "tool_call_id": "call_1"})
        assert result == {"output": "3 passed", "returncode": 0, "exception_info": ""}
        assert inner.calls == [({"command": "pytest -q", "tool_call_id": "call_1"}, "", None)]
        flushed(env)
        start, end = got
        assert start["event"] == "start" and end["event"] == "end"
        assert {k: start[k] for k in ("session_id", "call_id", "tool", "timeout_s")} == {
            "session_id": "task-42",
            "call_id": "call_1",
            "tool": "bash",
            "timeout_s": 30.0,
        }
        assert (end["returncode"], end["timed_out"], end["error"], end["submitted"]) == (
            0,
            False,
            None,
            False,
        )
        assert end["duration_s"] >= 0 and end["ts"] >= start["ts"]

    def test_payloads_map_to_tool_messages(self) -> None:
        """What the wrapper sends is what MiniSweMapper reads."""
        env, got = wrapped(FakeV2Env())
        env.execute({"command": "ls", "tool_call_id": "call_7"}, "/tmp", timeout=5)
        flushed(env)
        mapper = MiniSweMapper()
        [start] = mapper.map(got[0], AT)
        [end] = mapper.map(got[1], AT)
        assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
        assert (start.call_id, start.timeout_s, start.source) == ("call_7", 5.0, SOURCE_WRAPPER)
        assert (end.call_id, end.ok, end.censored) == ("call_7", True, False)
        assert env.inner.calls[-1] == ({"command": "ls", "tool_call_id": "call_7"}, "/tmp", 5)

    def test_v2_timeout_result_is_censored(self) -> None:
        """A v2 environment's TimeoutExpired result marks the end timed out."""
        env, got = wrapped(FakeV2Env())
        env.execute({"command": "sleep 99"})
        flushed(env)
        assert (got[1]["timed_out"], got[1]["returncode"], got[1]["error"]) == (True, -1, None)
        assert got[0]["call_id"] == "task-42-1"  # no tool_call_id: one of the wrapper's

    def test_v1_timeout_exception_is_reported_and_reraised(self) -> None:
        """A v1 environment's TimeoutExpired still ends the call (timed out), then propagates."""
        env, got = wrapped(FakeV1Env())
        with pytest.raises(subprocess.TimeoutExpired):
            env.execute("sleep 100", timeout=2)
        flushed(env)
        assert [p["event"] for p in got] == ["start", "end"]
        assert (got[0]["timeout_s"], got[1]["timed_out"], got[1]["returncode"]) == (2.0, True, None)
        assert env.execute("true") == {"output": "ok", "returncode": 1}

    def test_submission_ends_the_call_and_the_session(self) -> None:
        """Submitted out of execute: the call ended fine, the task is over; re-raised."""
        env, got = wrapped(FakeV2Env())
        with pytest.raises(Submitted):
            env.execute({"command": "submit", "tool_call_id": "call_9"})
        flushed(env)
        assert (got[1]["submitted"], got[1]["returncode"], got[1]["error"]) == (True, 0, None)
        end, session_end = MiniSweMapper().map(got[1], AT)
        assert isinstance(end, ToolEnd) and end.ok
        assert session_end == SessionEnd(session_id="task-42", ended_at=got[1]["ts"])

    def test_environment_without_timeout_keyword(self) -> None:
        """No timeout given: none is passed, so the oldest execute(command, cwd) works."""
        env, got = wrapped(FakeOldEnv())
        assert env.execute("echo hi") == {"output": "echo hi", "returncode": 0}
        flushed(env)
        assert got[0]["timeout_s"] is None

    def test_a_failing_sink_never_reaches_the_agent(self) -> None:
        """Every send raising: execute still returns the inner result; failures are counted."""

        def broken(payload: dict[str, Any]) -> None:
            raise ConnectionRefusedError("gateway down")

        env, _ = wrapped(FakeV2Env(), sink=broken)
        assert env.execute({"command": "ls"})["returncode"] == 0
        flushed(env)
        assert (env.tao_publisher.failed, env.tao_publisher.sent) == (2, 0)

    def test_a_stalled_sink_does_not_block_execute(self) -> None:
        """While the sink is stuck on its first payload, calls still return; a full queue drops
        payloads instead of waiting."""
        release = threading.Event()
        entered = threading.Event()

        def stuck(payload: dict[str, Any]) -> None:
            entered.set()
            release.wait()

        inner = FakeV2Env()
        env = TaoEnvironment.wrap(inner, session_id="s")
        env.tao_publisher = Publisher(stuck, maxsize=2)
        for _ in range(3):
            assert env.execute({"command": "ls"})["returncode"] == 0
        assert entered.wait(10.0)
        assert env.tao_publisher.dropped >= 1  # 6 payloads, one in the sink, 2 queued
        release.set()
        assert env.tao_publisher.flush(10.0)
        assert len(inner.calls) == 3

    def test_http_sink_posts_to_the_gateway_hook_endpoint(self) -> None:
        """The default transport POSTs JSON to <gateway>/hooks/miniswe."""
        seen: list[tuple[str, dict[str, Any]]] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers["Content-Length"])
                seen.append((self.path, json.loads(self.rfile.read(size))))
                self.send_response(202)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/"
            env, _ = wrapped(FakeV2Env(), sink=http_sink(url))
            env.execute({"command": "ls", "tool_call_id": "c"})
            flushed(env)
        finally:
            server.shutdown()
            server.server_close()
        assert [(path, body["event"]) for path, body in seen] == [
            ("/hooks/miniswe", "start"),
            ("/hooks/miniswe", "end"),
        ]

    def test_http_sink_with_the_gateway_down(self) -> None:
        """Nothing listening: both sends fail quietly."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env, _ = wrapped(FakeV2Env(), sink=http_sink(f"http://127.0.0.1:{port}"))
        env.execute({"command": "ls"})
        flushed(env)
        assert env.tao_publisher.failed == 2

    def test_resolve_class(self) -> None:
        """A class, an import path, and clear errors for names that resolve to nothing."""
        assert resolve_class(FakeV2Env) is FakeV2Env
        assert resolve_class("collections.OrderedDict").__name__ == "OrderedDict"
        with pytest.raises(ValueError, match="cannot import"):
            resolve_class("no_such_module_xyz.Env")
        with pytest.raises(ValueError, match="not a short name"):
            resolve_class("nodots")
        with pytest.raises(ValueError, match="tao_transport"):
            TaoEnvironment(inner_class=FakeOldEnv, tao_transport="carrier-pigeon")


class TestMapper:
    def test_fixtures(self) -> None:
        """start / end / timed-out end / submitted end, with the wrapper's own clock."""
        mapper = MiniSweMapper()
        assert mapper.map(load("wrapper-start.json"), AT) == [
            ToolStart(
                session_id="task-42",
                call_id="call_1",
                tool="bash",
                started_at=1767225600.12,
                source=SOURCE_WRAPPER,
                harness=HARNESS,
                timeout_s=60.0,
            )
        ]
        assert mapper.map(load("wrapper-end.json"), AT) == [
            ToolEnd(
                session_id="task-42",
                call_id="call_1",
                ended_at=1767225604.6,
                tool="bash",
                source=SOURCE_WRAPPER,
                duration_s=4.48,
            )
        ]
        [timeout] = mapper.map(load("wrapper-end-timeout.json"), AT)
        assert isinstance(timeout, ToolEnd) and (timeout.censored, timeout.ok) == (True, False)
        assert mapper.map(load("wrapper-end-submitted.json"), AT)[1] == SessionEnd(
            session_id="task-42", ended_at=1767225711.3, reason=END_COMPLETED
        )

    def test_missing_ts_uses_the_receive_time_and_unknown_events_are_ignored(self) -> None:
        """No ts: the receive time; an event other than start/end maps to nothing."""
        body = load("wrapper-start.json")
        del body["ts"]
        [start] = MiniSweMapper().map(body, AT)
        assert isinstance(start, ToolStart) and start.started_at == AT
        assert MiniSweMapper().map({"event": "progress"}, AT) == []

    @pytest.mark.parametrize(
        ("change", "reason"),
        [
            ({"event": None}, "event: expected a string, got null"),
            ({"session_id": None}, "session_id: expected a string, got null"),
            ({"call_id": ""}, "call_id: empty"),
            ({"ts": "yesterday"}, "ts: expected a number, got str"),
            ({"duration_s": -2}, "duration_s: must be >= 0"),
            ({"returncode": 1.5}, "returncode: expected an integer, got float"),
            ({"timed_out": "no"}, "timed_out: expected a boolean, got str"),
            ({"error": 3}, "error: expected a string, got int"),
            ({"session_id": "s" * 700}, "session_id: unusable as a session id"),
        ],
    )
    def test_bad_payload_names_the_field(self, change: dict[str, Any], reason: str) -> None:
        """Wrong-typed and oversized fields raise HookPayloadError saying which."""
        body = {**load("wrapper-end.json"), **change}
        with pytest.raises(HookPayloadError) as info:
            MiniSweMapper().map(body, AT)
        assert info.value.harness == HARNESS
        assert info.value.reason.startswith(reason), info.value.reason

    def test_truncated_payload(self) -> None:
        """A payload cut after its first fields names the first missing one."""
        with pytest.raises(HookPayloadError, match="call_id: missing"):
            MiniSweMapper().map({"event": "end", "session_id": "task-42"}, AT)
