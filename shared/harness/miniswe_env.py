"""A mini-swe-agent environment that reports every command to TAO: :class:`TaoEnvironment`.

mini-swe-agent runs each action through its environment's ``execute`` and builds the
environment from the ``environment`` section of its YAML config, ``environment_class`` being a
short name or an import path (``minisweagent/environments/__init__.py``: ``get_environment``
pops ``environment_class`` and calls the class with the rest as keyword arguments). So::

    environment:
      environment_class: shared.harness.miniswe_env.TaoEnvironment
      inner_class: docker          # the environment to wrap: short name or import path
      image: python:3.11           # … and its own settings, passed through unchanged
      timeout: 60
      tao_session_id: my-task-1    # optional (else $TAO_SESSION_ID, else a fresh uuid)

The signature of ``execute`` changed between major versions, and both are accepted:

* v1: ``execute(self, command: str, cwd: str = "", *, timeout: int | None = None) -> dict``
  (``output``, ``returncode``); a timeout raises ``subprocess.TimeoutExpired``.
* v2: ``execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict``,
  ``action["command"]`` and ``action["tool_call_id"]``; failures come back as
  ``returncode: -1`` with ``extra.exception_type`` (``TimeoutExpired`` for a timeout), and the
  submission raises ``Submitted`` out of ``execute``.

Around each call the wrapper queues a ``start`` and an ``end`` payload (:mod:`.miniswe`) for a
background thread, then returns the inner result (or re-raises its exception) untouched: the
agent never waits on TAO, and no fault of TAO's (gateway down, queue full, a bad sink) reaches
it. The thread POSTs to ``$TAO_GATEWAY_URL/hooks/miniswe`` (``http://127.0.0.1:8000`` by
default), or publishes on NATS with ``tao_transport: nats`` (:mod:`shared.harness.hookclient`, the
``tao hook`` publisher). Everything else (``config``, ``get_template_vars``, ``serialize``,
``cleanup``, …) is the inner environment's.

Standard library only, and no import of mini-swe-agent: environments are duck-typed.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import queue
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = [
    "DEFAULT_GATEWAY_URL",
    "Publisher",
    "TaoEnvironment",
    "http_sink",
    "nats_sink",
    "resolve_class",
]

DEFAULT_GATEWAY_URL: Final = "http://127.0.0.1:8000"
SEND_TIMEOUT_S: Final = 2.0
QUEUE_SIZE: Final = 4096
EXIT_FLUSH_S: Final = 1.0
_SHORT_NAMES: Final = {  # mini-swe-agent's own map, for when it is not importable
    "local": "minisweagent.environments.local.LocalEnvironment",
    "docker": "minisweagent.environments.docker.DockerEnvironment",
    "singularity": "minisweagent.environments.singularity.SingularityEnvironment",
}
_TIMEOUT_TYPES: Final = frozenset({"TimeoutExpired", "TimeoutError"})

Sink = Callable[[dict[str, Any]], None]


def resolve_class(spec: str | type) -> type:
    """The environment class ``spec`` names: a class, a mini-swe-agent short name (``docker``)
    or an import path (``package.module.Class``)."""
    if isinstance(spec, type):
        return spec
    try:  # mini-swe-agent's resolver knows its current short names
        envs = importlib.import_module("minisweagent.environments")
        cls: type = envs.get_environment_class(spec)
        return cls
    except (ImportError, AttributeError, ValueError):
        pass
    path = _SHORT_NAMES.get(spec, spec)
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"inner_class {spec!r}: not a short name or a module.Class path")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"inner_class {spec!r}: cannot import {path}: {exc}") from exc
    if not isinstance(found, type):
        raise ValueError(f"inner_class {spec!r}: {path} is not a class")
    return found


# -- sinks and the background publisher --------------------------------------------------------


def http_sink(gateway_url: str | None = None) -> Sink:
    """POST each payload to the gateway's ``/hooks/miniswe``."""
    base = (gateway_url or os.environ.get("TAO_GATEWAY_URL") or DEFAULT_GATEWAY_URL).rstrip("/")
    url = f"{base}/hooks/miniswe"

    def send(payload: dict[str, Any]) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        req = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(req, timeout=SEND_TIMEOUT_S) as resp:
            resp.read()

    return send


def nats_sink() -> Sink:
    """Publish each payload on ``tao.v1.hook.miniswe`` as ``tao hook`` does (same URL rules)."""
    from shared.harness import hookclient

    env = os.environ

    def send(payload: dict[str, Any]) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        headers = {hookclient.RECEIVED_AT_HEADER: f"{time.time():.6f}"}
        subject = hookclient.hook_subject("miniswe", env.get("TAO_NAMESPACE", ""))
        deadline = time.monotonic() + SEND_TIMEOUT_S
        hookclient.publish(hookclient.nats_url(env), subject, data, headers, deadline)

    return send


class Publisher:
    """Sends payloads through ``sink`` on one daemon thread, in order; never raises.

    ``put`` drops the payload when :data:`QUEUE_SIZE` are already waiting; a payload the sink
    fails on is dropped too. ``sent``, ``failed`` and ``dropped`` count them. ``flush`` waits
    (at most ``timeout`` seconds) for everything queued before it.
    """

    def __init__(self, sink: Sink, maxsize: int = QUEUE_SIZE) -> None:
        self._sink = sink
        self._queue: queue.Queue[dict[str, Any] | threading.Event] = queue.Queue(maxsize)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.sent = self.failed = self.dropped = 0

    def put(self, payload: dict[str, Any]) -> None:
        try:
            self._start()
            self._queue.put_nowait(payload)
        except queue.Full:
            self.dropped += 1
        except Exception:  # a thread that cannot start: TAO loses the event, not the agent
            self.dropped += 1

    def flush(self, timeout: float) -> bool:
        """True once everything queued before this call was handled (False on timeout)."""
        done = threading.Event()
        try:
            self._start()
            self._queue.put(done, timeout=timeout)
        except Exception:
            return False
        return done.wait(timeout)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tao-publisher", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self._sink(item)
                self.sent += 1
            except Exception:
                self.failed += 1


_PUBLISHERS: dict[Any, Publisher] = {}
_PUBLISHERS_LOCK = threading.Lock()


def _shared_publisher(key: Any, make: Callable[[], Sink]) -> Publisher:
    """One publisher (one thread) per destination for the whole process, flushed at exit."""
    with _PUBLISHERS_LOCK:
        pub = _PUBLISHERS.get(key)
        if pub is None:
            pub = _PUBLISHERS[key] = Publisher(make())
            atexit.register(pub.flush, EXIT_FLUSH_S)
        return pub


# -- the wrapper -------------------------------------------------------------------------------


class TaoEnvironment:
    """Wraps a mini-swe-agent environment; reports each ``execute`` to TAO (module docstring).

    ``inner_class`` and the remaining keyword arguments build the wrapped environment.
    ``tao_session_id`` names the TAO session (give the agent's model the same id in the
    ``X-Session-ID`` header); ``tao_transport`` is ``http`` (default) or ``nats``;
    ``tao_gateway_url`` overrides ``$TAO_GATEWAY_URL``; ``tao_sink`` replaces the transport
    with any callable taking a payload dict (tests). :meth:`wrap` wraps an environment that
    already exists.
    """

    def __init__(
        self,
        *,
        inner_class: str | type = "local",
        tao_session_id: str | None = None,
        tao_transport: str = "http",
        tao_gateway_url: str | None = None,
        tao_sink: Sink | None = None,
        **kwargs: Any,
    ) -> None:
        inner = resolve_class(inner_class)(**kwargs)
        self._tao_setup(inner, tao_session_id, tao_transport, tao_gateway_url, tao_sink)

    @classmethod
    def wrap(
        cls,
        inner: Any,
        *,
        session_id: str | None = None,
        transport: str = "http",
        gateway_url: str | None = None,
        sink: Sink | None = None,
    ) -> TaoEnvironment:
        """A wrapper around the environment ``inner`` (e.g. one ``get_sb_environment`` built)."""
        self = cls.__new__(cls)
        self._tao_setup(inner, session_id, transport, gateway_url, sink)
        return self

    def _tao_setup(
        self,
        inner: Any,
        session_id: str | None,
        transport: str,
        gateway_url: str | None,
        sink: Sink | None,
    ) -> None:
        if transport not in ("http", "nats"):
            raise ValueError(f"tao_transport {transport!r}: expected 'http' or 'nats'")
        sid = session_id or os.environ.get("TAO_SESSION_ID") or f"mswe-{uuid.uuid4().hex}"
        if sink is not None:
            publisher = Publisher(sink)
        elif transport == "nats":
            publisher = _shared_publisher("nats", nats_sink)
        else:
            publisher = _shared_publisher(("http", gateway_url), lambda: http_sink(gateway_url))
        self._tao_inner = inner
        self.tao_session_id = sid
        self.tao_publisher = publisher
        self._tao_calls = 0

    @property
    def inner(self) -> Any:
        """The wrapped environment."""
        return self._tao_inner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_tao_"):  # not set up: no recursion through a missing inner
            raise AttributeError(name)
        return getattr(self._tao_inner, name)

    def execute(
        self, action: Any, cwd: str = "", *, timeout: int | None = None, **kwargs: Any
    ) -> Any:
        """The inner ``execute(action, cwd, timeout=…)``, reported as a start and an end."""
        call_id = self._tao_begin(action, timeout)
        t0 = time.monotonic()
        args = (action,) if cwd == "" else (action, cwd)
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            out = self._tao_inner.execute(*args, **kwargs)
        except BaseException as exc:
            submitted = type(exc).__name__ == "Submitted"
            timed_out = isinstance(exc, subprocess.TimeoutExpired | TimeoutError)
            self._tao_end(
                call_id,
                time.monotonic() - t0,
                returncode=0 if submitted else None,
                timed_out=timed_out,
                error=None if submitted or timed_out else type(exc).__name__,
                submitted=submitted,
            )
            raise
        self._tao_end(call_id, time.monotonic() - t0, **_outcome(out))
        return out

    def _tao_begin(self, action: Any, timeout: int | None) -> str:
        try:
            n = self._tao_calls = self._tao_calls + 1
            call_id = None
            if isinstance(action, Mapping):
                raw = action.get("tool_call_id")
                call_id = raw if isinstance(raw, str) and raw else None
            call_id = call_id or f"{self.tao_session_id}-{n}"
            limit = timeout or getattr(getattr(self._tao_inner, "config", None), "timeout", None)
            limit_s = float(limit) if isinstance(limit, int | float) and limit > 0 else None
            self._tao_send("start", call_id, timeout_s=limit_s)
            return call_id
        except Exception:
            return f"{self.tao_session_id}-x"

    def _tao_end(self, call_id: str, duration_s: float, **fields: Any) -> None:
        with contextlib.suppress(Exception):
            self._tao_send("end", call_id, duration_s=max(0.0, duration_s), **fields)

    def _tao_send(self, event: str, call_id: str, **fields: Any) -> None:
        payload = {
            "event": event,
            "session_id": self.tao_session_id,
            "call_id": call_id,
            "tool": "bash",
            "ts": time.time(),
            **fields,
        }
        self.tao_publisher.put(payload)


def _outcome(out: Any) -> dict[str, Any]:
    """returncode / timed_out / error / submitted of a returned result dict."""
    if not isinstance(out, Mapping):
        return {"returncode": None, "timed_out": False, "error": None, "submitted": False}
    rc = out.get("returncode")
    extra = out.get("extra")
    kind = extra.get("exception_type") if isinstance(extra, Mapping) else None
    kind = kind if isinstance(kind, str) and kind else None
    return {
        "returncode": rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
        "timed_out": kind in _TIMEOUT_TYPES,
        "error": kind if kind not in _TIMEOUT_TYPES else None,
        "submitted": False,
    }
