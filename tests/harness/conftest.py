"""Real harness clients against a whole TAO stack: installing them, the stack, what TAO saw.

Each client is installed once into ``.cache/harness/<client>/`` (git-ignored; another directory
with ``TAO_HARNESS_CACHE``) at the version the captures in docs/harnesses.md were taken with
(another with ``TAO_HARNESS_<CLIENT>_VERSION``, e.g. ``TAO_HARNESS_CLAUDE_CODE_VERSION=latest``).
A test is skipped, with the installer's own error, only when its client cannot be installed
(no npm, no registry); a client that installs and then fails fails the test.

The tier is not part of the default run (``pytest`` deselects it: a first run downloads the
clients, minutes): it runs when selected, ``pytest -m harness`` (what CI runs for it), when
``tests/harness`` is named on the command line, or with ``TAO_HARNESS=1``.

The stack (``shared.cli.stack.Stack``: one sim node at time scale 20 and the five services on
the test NATS and Redis, in a fresh namespace and domain) is started once for the tier; the
client talks to a :class:`tests.harness.recorder.Recorder` in front of its gateway, which
records what the client sends and scripts the node's answers. After the run, :class:`Seen`
reads back from the streams what TAO received: the raw hook payloads and the gateway's
session events (and anything on the tool stream; the tools service applies the tool events
it maps from hooks to the store directly, so the tests read those from the store).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis.asyncio as aioredis

from shared.cli.stack import Stack, StackConfig
from shared.contracts import (
    SessionRequest,
    ToolEnd,
    ToolStart,
    decode_session_event,
    decode_tool_event,
    subjects,
)
from shared.infra import Bus
from shared.infra.store import Store
from tests.harness.recorder import Recorded

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TAO_HARNESS_CACHE") or ROOT / ".cache" / "harness")
INSTALL_TIMEOUT_S = 600
READY_TIMEOUT_S = 30.0
WAIT_S = 20.0


def _selected(config: pytest.Config) -> bool:
    if "harness" in (config.option.markexpr or "") or os.environ.get("TAO_HARNESS") == "1":
        return True
    here = Path(__file__).parent
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == here or here in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the harness tier unless it was asked for (module docstring)."""
    if _selected(config):
        return
    drop = [i for i in items if i.get_closest_marker("harness") is not None]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i.get_closest_marker("harness") is None]


# -- installing the clients -----------------------------------------------------------------------


def pinned(client: str, default: str) -> str:
    """The version to install: ``TAO_HARNESS_<CLIENT>_VERSION``, else ``default``."""
    key = "TAO_HARNESS_" + client.upper().replace("-", "_") + "_VERSION"
    return os.environ.get(key) or default


_ERROR_LINE = re.compile(r"^(npm error (code|errno|syscall|network|notarget|404)\b|ERROR:)")
_FAILED: dict[str, str] = {}
"""Installs that failed in this process, by spec: each is tried once per run."""


def _why(text: str) -> str:
    """The installer's error lines (npm's ``code`` / ``errno``, pip's ``ERROR:``), else its
    last lines."""
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    errors = [x for x in lines if _ERROR_LINE.match(x)]
    return " | ".join(errors[:3] or lines[-3:])


def _skip(client: str, spec: str, reason: str) -> NoReturn:
    _FAILED[spec] = reason
    pytest.skip(f"{client}: cannot install {spec}: {reason}")


def _installed(client: str, exe: Path, stamp: Path, spec: str) -> bool:
    """Whether ``spec`` is installed already (its stamp says so); skips the test when this
    run already failed to install it."""
    if exe.exists() and stamp.exists() and json.loads(stamp.read_text()).get("spec") == spec:
        return True
    if spec in _FAILED:
        pytest.skip(f"{client}: cannot install {spec}: {_FAILED[spec]}")
    return False


def npm_client(client: str, package: str, version: str, binary: str) -> Path:
    """``node_modules/.bin/<binary>`` of ``package@version`` installed under the cache; skips
    the test (with npm's error) when it cannot be installed."""
    prefix = CACHE / client
    exe = prefix / "node_modules" / ".bin" / binary
    stamp = prefix / "installed.json"
    want = f"{package}@{version}"
    if _installed(client, exe, stamp, want):
        return exe
    npm = shutil.which("npm")
    if npm is None:
        _skip(client, want, "npm is not on PATH (Node.js missing)")
    prefix.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), want]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        _skip(client, want, f"npm install ran over {INSTALL_TIMEOUT_S} s")
    if done.returncode != 0 or not exe.exists():
        why = _why(done.stderr or done.stdout) or f"no {binary} executable"
        _skip(client, want, f"npm install exited {done.returncode}: {why}")
    stamp.write_text(json.dumps({"spec": want}))
    return exe


def pip_client(client: str, requirement: str, binary: str) -> Path:
    """``bin/<binary>`` of a virtual environment under the cache holding ``requirement`` (its
    own environment: the project's is never changed); skips when it cannot be installed."""
    venv = CACHE / f"{client}-venv"
    exe = venv / "bin" / binary
    stamp = venv / "installed.json"
    if _installed(client, exe, stamp, requirement):
        return exe
    python = shutil.which("python3")
    if python is None:
        _skip(client, requirement, "no python3 on PATH")
    pip = str(venv / "bin" / "pip")
    for cmd in ([python, "-m", "venv", str(venv)], [pip, "install", "-q", requirement]):
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            _skip(client, requirement, f"{Path(cmd[0]).name} ran over {INSTALL_TIMEOUT_S} s")
        if done.returncode != 0:
            name = f"{Path(cmd[0]).name} {cmd[1]}"
            why = _why(done.stderr or done.stdout)
            _skip(client, requirement, f"{name} exited {done.returncode}: {why}")
    if not exe.exists():
        _skip(client, requirement, f"installed, but it has no {binary} executable")
    stamp.write_text(json.dumps({"spec": requirement}))
    return exe


# -- the stack ------------------------------------------------------------------------------------


@dataclass
class HarnessStack:
    stack: Stack
    namespace: str
    domain: str

    @property
    def gateway(self) -> str:
        return self.stack.gateway_url

    @property
    def nats_url(self) -> str:
        return self.stack.nats_url

    @property
    def redis_url(self) -> str:
        return self.stack.redis_url

    def tao_env(self) -> dict[str, str]:
        """What a hook process (``tao hook``) needs to reach this stack's bus."""
        return {"TAO_NATS_URL": self.nats_url, "TAO_NAMESPACE": self.namespace}

    def seen(self, timeout_s: float = WAIT_S) -> Seen:
        return Seen(self, timeout_s)


async def _ready(stack: Stack, domain: str) -> None:
    client = aioredis.Redis.from_url(stack.redis_url)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            nodes = [r for r in await Store(client, domain).nodes() if r.healthy]
            with urllib.request.urlopen(f"{stack.gateway_url}/v1/models", timeout=2) as resp:
                models = json.loads(resp.read())["data"]
            if nodes and models:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"stack not ready in {READY_TIMEOUT_S:g} s ({stack.log_dir})")
            await asyncio.sleep(0.2)  # polling an external system with a deadline
    finally:
        await client.aclose()


async def _cleanup(hs: HarnessStack) -> None:
    bus = await Bus.connect(hs.nats_url, name="harness-cleanup", namespace=hs.namespace)
    try:
        await bus.delete_streams()
    finally:
        await bus.drain()
    client = aioredis.Redis.from_url(hs.redis_url)
    try:
        await Store(client, hs.domain).clear()
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def harness_stack(nats_url: str, redis_url: str) -> Iterator[HarnessStack]:
    tag = uuid.uuid4().hex[:12]
    config = StackConfig(
        sim_nodes=1,
        time_scale=20.0,
        namespace="t" + tag,
        domain="d" + tag,
        extra_env={"TAO_LOG_LEVEL": "info"},
        env={**os.environ, "TAO_NATS_URL": nats_url, "TAO_REDIS_URL": redis_url},
    )
    stack = Stack(config)
    hs = HarnessStack(stack, config.namespace, "d" + tag)
    try:
        stack.start()
        asyncio.run(_ready(stack, hs.domain))
        yield hs
    finally:
        stack.stop()
        asyncio.run(_cleanup(hs))


# -- what TAO received ----------------------------------------------------------------------------


@dataclass
class Seen:
    """Reads the stack's streams from the start: hook payloads, session and tool events."""

    hs: HarnessStack
    timeout_s: float
    hooks: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[Any] = field(default_factory=list)
    tools: list[Any] = field(default_factory=list)

    def requests(self) -> list[SessionRequest]:
        return [m for m in self.sessions if isinstance(m, SessionRequest)]

    def starts(self) -> list[ToolStart]:
        return [m for m in self.tools if isinstance(m, ToolStart)]

    def ends(self) -> list[ToolEnd]:
        return [m for m in self.tools if isinstance(m, ToolEnd)]

    def settle(self, seconds: float) -> Seen:
        """Read the streams for ``seconds`` (for a capture of what arrives late, not a check)."""
        saved, self.timeout_s = self.timeout_s, seconds
        try:
            with contextlib.suppress(AssertionError):
                self.until(lambda _: False, "nothing")
        finally:
            self.timeout_s = saved
        return self

    def until(self, cond: Callable[[Seen], bool], what: str) -> Seen:
        """Read the streams until ``cond(self)`` holds; fail naming ``what`` after the timeout."""
        asyncio.run(self._read(cond, what))
        return self

    async def _read(self, cond: Callable[[Seen], bool], what: str) -> None:
        bus = await Bus.connect(self.hs.nats_url, name="harness-seen", namespace=self.hs.namespace)
        changed = asyncio.Event()

        def keep(into: list[Any]) -> Any:
            async def handler(value: Any, delivery: Any) -> None:
                into.append(value)
                changed.set()

            return handler

        def hook(data: bytes) -> dict[str, Any]:
            value = json.loads(bytes(data))
            return value if isinstance(value, dict) else {"payload": value}

        try:
            self.hooks.clear()
            self.sessions.clear()
            self.tools.clear()
            await bus.consume(
                subjects.STREAM_HOOK, "harness-seen", hook, keep(self.hooks), ephemeral=True
            )
            await bus.consume(
                subjects.STREAM_SESSION,
                "harness-seen",
                decode_session_event,
                keep(self.sessions),
                ephemeral=True,
            )
            await bus.consume(
                subjects.STREAM_TOOL,
                "harness-seen",
                decode_tool_event,
                keep(self.tools),
                ephemeral=True,
            )
            try:
                async with asyncio.timeout(self.timeout_s):
                    while not cond(self):
                        changed.clear()
                        await changed.wait()
            except TimeoutError:
                names = [h.get("hook_event_name") for h in self.hooks]
                raise AssertionError(
                    f"TAO did not see {what} within {self.timeout_s:g} s: "
                    f"hook payloads {names}, session events "
                    f"{[type(m).__name__ for m in self.sessions]}, tool events {self.tools} "
                    f"(logs: {self.hs.stack.log_dir})"
                ) from None
        finally:
            await bus.drain()


def write_capture(client: str, capture: dict[str, Any]) -> Path:
    """Save what a client sent under the cache (``captures/<client>.json``) for the docs."""
    out = CACHE / "captures" / f"{client}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(capture, indent=1, sort_keys=True, default=str))
    return out


def install_hooks(target: str, project: Path) -> None:
    """``tao hooks install TARGET --scope project`` in ``project``, as a user runs it."""
    tao = Path(sys.executable).with_name("tao")
    installed = subprocess.run(
        [str(tao), "hooks", "install", target, "--scope", "project"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr


def request_rows(recorded: Iterable[Recorded], secret: str) -> list[dict[str, Any]]:
    """Each recorded request for a capture: method, path, query, its headers but the
    ``secret`` one (the client's key), and the shape of a model request's body."""
    return [
        {
            "method": r.method,
            "path": r.path,
            "query": r.query,
            "headers": {k: v for k, v in r.headers.items() if k.lower() != secret},
            "body": request_facts(r.body) if r.path.startswith("/v1") else r.body,
        }
        for r in recorded
    ]


def request_facts(body: Any) -> dict[str, Any]:
    """The shape of a model request body: its keys, and the values of the small fields."""
    if not isinstance(body, dict):
        return {"body": type(body).__name__}
    small = ("model", "metadata", "max_tokens", "stream", "stream_options", "user", "thinking")
    facts: dict[str, Any] = {"keys": sorted(body)}
    facts.update({k: body[k] for k in small if k in body})
    messages = body.get("messages")
    if isinstance(messages, list):
        facts["roles"] = [m.get("role") for m in messages if isinstance(m, dict)]
    tools = body.get("tools")
    if isinstance(tools, list):
        facts["tools"] = sorted(
            str((t.get("function") or {}).get("name") or t.get("name"))
            for t in tools
            if isinstance(t, dict)
        )
    return facts
