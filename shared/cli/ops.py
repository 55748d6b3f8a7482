"""Operating commands: ``tao service``, ``tao up`` and ``tao status``.

``tao service NAME [ARGS...]`` runs one service in the foreground, exactly as
``python -m services.NAME ARGS...`` (the container entry point in compose.yaml).

``tao up`` starts the whole stack on this machine (:mod:`shared.cli.stack`), prints the gateway,
NATS and Redis URLs, writes the run file that ``tao status`` (and later ``tao inspect`` /
``tao hook``) read, and runs until Ctrl-C, then stops everything in order.

``tao status [--json]`` reads the scheduler state from Redis: nodes (capacity, reserved, free,
healthy), sessions (activity, node, tokens, version, tool) and planner counters (ticks, plans
applied / discarded / truncated, fallbacks, solve-time percentiles). The Redis URL comes from
``--redis``, else ``TAO_REDIS_URL``, else the run file of a running ``tao up``. The JSON form is
documented in the README ("`tao status --json`").
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

import anyio
import orjson

from services.gateway.gatewaykey import KeyPolicy
from shared.cli.stack import SERVICES, Stack, StackConfig, StackError
from shared.core.engine import DEFAULT_PROFILE, PROFILES
from shared.infra.access import redact
from shared.infra.errors import SettingsError
from shared.infra.runfile import RunInfo, find_running, remove_run_file, write_run_file
from shared.infra.settings import Settings
from shared.tables import render

__all__ = ["add_ops_parsers", "redis_url", "status_table"]

KNOWN_SERVICES: tuple[str, ...] = (*SERVICES, "simnode")
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class OpsError(Exception):
    """A usage or environment problem of an operating command: one line, exit 2."""


def add_ops_parsers(sub: Any) -> None:
    """Register ``service``, ``up`` and ``status`` on the ``tao`` subparsers."""
    svc = sub.add_parser(
        "service",
        help="run one service in the foreground (python -m services.NAME)",
        description="Run one TAO service: " + ", ".join(KNOWN_SERVICES) + ".",
    )
    svc.add_argument("name", choices=KNOWN_SERVICES, metavar="NAME")
    svc.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the service")
    svc.set_defaults(run=_cmd_service, passthrough=True)

    up = sub.add_parser(
        "up",
        help="start NATS, Redis, simulated nodes and every service on this machine",
        description="Start the whole stack; Ctrl-C stops it.",
    )
    up.add_argument("--sim-nodes", type=int, default=2, metavar="N", help="simnodes (default 2)")
    up.add_argument("--policy", metavar="NAME", help="placement policy (default: TAO_POLICY)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    up.add_argument(
        "--host", default="127.0.0.1",
        help="gateway listen address (default 127.0.0.1); beyond loopback, e.g. 0.0.0.0, "
        "clients and hooks need the gateway key (TAO_GATEWAY_KEY, or one generated and "
        "shown once)",
    )  # fmt: skip
    up.add_argument("--time-scale", type=float, default=1.0, help="simnode speed-up (default 1)")
    up.add_argument(
        "--kv-tokens", type=int, metavar="N",
        help="simnode KV capacity in tokens (default: the profile's)",
    )  # fmt: skip
    up.add_argument(
        "--profile", metavar="NAME",
        help=f"simnode engine profile, one of {', '.join(sorted(PROFILES))} "
        f"(default {DEFAULT_PROFILE})",
    )  # fmt: skip
    up.add_argument(
        "--host-kv", type=float, default=0.0, metavar="F",
        help="each simnode's host KV tier, F x its GPU KV, as vLLM's OffloadingConnector "
        "(default 0: none)",
    )  # fmt: skip
    up.add_argument("--log-dir", metavar="DIR", help="where children log (default: a temp dir)")
    up.set_defaults(run=_cmd_up)

    st = sub.add_parser(
        "status",
        help="show nodes, sessions and planner counters",
        description="Show the scheduler state from Redis (see README: `tao status --json`).",
    )
    st.add_argument("--json", action="store_true", help="print one JSON object")
    st.add_argument("--redis", metavar="URL", help="Redis URL (default: env, then the run file)")
    st.add_argument("--nats", metavar="URL", help="accepted for symmetry; status reads Redis")
    st.add_argument("--domain", metavar="NAME", help="scheduling domain (default: TAO_DOMAIN)")
    st.set_defaults(run=_cmd_status)


# -- tao service ---------------------------------------------------------------------------------


def _cmd_service(args: argparse.Namespace, out: TextIO) -> int:
    argv = [a for a in args.args if a != "--"]
    sys.argv = [f"tao service {args.name}", *argv]
    try:
        runpy.run_module(f"services.{args.name}", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


# -- tao up --------------------------------------------------------------------------------------


def up_config(args: argparse.Namespace, env: Mapping[str, str]) -> StackConfig:
    """What ``tao up`` starts: its flags, and the bus namespace and scheduling domain of the
    environment (``TAO_NAMESPACE`` / ``TAO_DOMAIN``, read as the services read them; a bad
    setting is one line here rather than five dead services), so that a hook or client sent
    with the namespace set reaches the services it started."""
    given = {**env, "TAO_POLICY": args.policy} if args.policy is not None else env
    try:
        settings = Settings.from_env(given)
    except SettingsError as exc:
        text = str(exc)
        if args.policy is not None and text.startswith("TAO_POLICY:"):
            text = "--policy:" + text.removeprefix("TAO_POLICY:")  # the flag, as given
        raise OpsError(text) from None
    return StackConfig(
        sim_nodes=args.sim_nodes,
        policy=args.policy,
        gateway_host=args.host,
        gateway_port=args.port,
        time_scale=args.time_scale,
        kv_tokens=args.kv_tokens,
        profile=args.profile,
        host_kv=args.host_kv,
        log_dir=args.log_dir,
        namespace=settings.namespace,
        domain=settings.domain,
    )


def _cmd_up(args: argparse.Namespace, out: TextIO) -> int:
    if args.sim_nodes < 0:
        raise OpsError("--sim-nodes: must be >= 0")
    if not 0 <= args.port <= 65535:
        raise OpsError(f"--port: must be in 0..65535, got {args.port}")
    if not args.time_scale > 0:
        raise OpsError(f"--time-scale: must be > 0, got {args.time_scale}")
    profile = PROFILES.get(args.profile or DEFAULT_PROFILE)
    if args.host_kv != 0.0 and profile is not None:  # (a bad --profile is told on its own)
        try:
            profile.host_link(args.host_kv)
        except ValueError as exc:
            raise OpsError(f"--host-kv: {exc}") from None
    if find_running() is not None:
        raise OpsError("another `tao up` is running (see `tao status`); stop it first")
    config = up_config(args, os.environ)
    stop = threading.Event()
    # Both signals only set the event; the loop below then stops everything in order. SIGINT
    # gets a handler of its own too, because a shell starts background jobs with it ignored.
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in _STOP_SIGNALS}
    stack = Stack(config)
    try:
        try:
            stack.start()
        except StackError as exc:
            raise OpsError(str(exc)) from None
        nodes_file = str(stack.nodes_file or "") or os.environ.get("TAO_NODES_FILE") or None
        write_run_file(
            RunInfo(
                pid=os.getpid(),
                nats_url=stack.nats_for("ops"),
                redis_url=stack.redis_for("ops"),
                hook_nats_url=stack.nats_for("hook"),
                gateway_url=stack.gateway_url,
                started_at=time.time(),
                namespace=config.namespace,
                services=(*SERVICES, *stack.node_urls),
                nodes_file=nodes_file,
            )
        )
        kind = "embedded" if stack.embedded else "configured"
        if stack.access_dir is not None:
            kind += f", one user per service: {stack.access_dir}"
        out.write(
            f"tao up: gateway {stack.gateway_url}/v1 (listening on {config.gateway_host})\n"
            + key_lines(stack.keys)
            + f"  nats  {redact(stack.nats_for('ops'))} ({kind})\n"
            f"  redis {redact(stack.redis_for('ops'))} ({kind})\n"
            + "".join(f"  node  {k} {v}\n" for k, v in stack.node_urls.items())
            + (f"  nodes file {nodes_file}\n" if nodes_file else "")
            + f"  logs  {stack.log_dir}\nCtrl-C stops everything.\n"
        )
        out.flush()
        while not stop.wait(0.5):
            dead = stack.failed()
            if dead:
                name, code = dead[0]
                raise OpsError(stack.exited(name, code))
    finally:
        out.write("tao up: stopping\n")
        out.flush()
        stack.stop()
        remove_run_file(pid=os.getpid())
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def key_lines(keys: KeyPolicy | None) -> str:
    """What ``tao up`` says about the gateway key: the key itself only when this start
    generated it (once, as Jupyter shows its token), else where it comes from."""
    if keys is None or keys.mode in ("open", "tenants"):
        return ""
    if keys.mode == "off":
        return "  key   none: TAO_GATEWAY_AUTH=off, anyone who reaches the gateway may use it\n"
    if keys.generated:
        return (
            f"  key   {keys.key}\n"
            f"        (generated; stored in {keys.path}, owner only; shown this once. Clients\n"
            "        send 'Authorization: Bearer <key>' or 'x-api-key', hooks "
            "'X-TAO-Hook-Token')\n"
        )
    where = keys.path if keys.path is not None else keys.source
    return f"  key   required; from {where}\n"


# -- tao status ----------------------------------------------------------------------------------


def redis_url(args: argparse.Namespace) -> str:
    """``--redis``, else ``TAO_REDIS_URL``, else the running ``tao up``'s Redis."""
    if args.redis:
        return str(args.redis)
    env = os.environ.get("TAO_REDIS_URL")
    if env:
        return env
    running = find_running()
    if running is None:
        raise OpsError("no Redis: pass --redis URL, set TAO_REDIS_URL, or start `tao up`")
    return running.redis_url


async def _read_status(url: str, domain: str) -> dict[str, Any]:
    from redis.exceptions import RedisError

    from shared.infra.redisconn import open_redis
    from shared.infra.store import Store

    client = open_redis(url, socket_connect_timeout=2.0, socket_timeout=5.0)
    try:
        return await Store(client, domain).status()
    except (RedisError, OSError) as exc:
        raise OpsError(f"cannot read {url}: {exc}") from None
    finally:
        await client.aclose()


def _cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    url = redis_url(args)
    domain = args.domain or os.environ.get("TAO_DOMAIN") or "default"
    status = anyio.run(_read_status, url, domain)
    if args.json:
        out.write(orjson.dumps(status).decode() + "\n")
    else:
        out.write(status_table(status) + "\n")
    out.flush()
    return 0


def _ms(v: object) -> str:
    return "-" if v is None else f"{float(v):.1f}"  # type: ignore[arg-type]


def status_table(status: dict[str, Any]) -> str:
    """A human-readable form of ``Store.status()``."""
    lines = [f"domain {status.get('domain')}", ""]
    nodes = []
    for n in status.get("nodes", []):
        rate = n.get("prefix_hit_rate")
        nodes.append([
            str(n["id"]), "yes" if n["healthy"] else "no", str(n["capacity_tokens"]),
            str(n["reserved"]), str(n["free"]), "-" if rate is None else f"{rate:.0%}",
        ])  # fmt: skip
    header = ["node", "healthy", "capacity", "reserved", "free", "prefix hit"]
    lines.append(render(header, nodes, align="<<>>>>"))
    sessions = [s for s in status.get("sessions", []) if not s.get("ended")]
    lines += ["", f"sessions {len(sessions)} live"]
    rows = [
        [str(s["id"])[:40], str(s["activity"]), str(s["node"] or "-"), str(s["tokens"]),
         str(s["version"])]
        for s in sessions[:50]
    ]  # fmt: skip
    lines.append(render(["session", "activity", "node", "tokens", "version"], rows, align="<<<>>"))
    if len(sessions) > 50:
        lines.append(f"... {len(sessions) - 50} more (use --json)")
    p = status.get("planner", {})
    solve = p.get("solve_ms") or {}
    lines += [
        "",
        f"planner ticks {p.get('ticks', 0)}  applied {p.get('plans_applied', 0)}  "
        f"discarded {p.get('plans_discarded', 0)}  truncated {p.get('plans_truncated', 0)}  "
        f"fallbacks {p.get('fallbacks', 0)}",
        f"solve ms p50 {_ms(solve.get('p50'))}  p90 {_ms(solve.get('p90'))}  "
        f"p99 {_ms(solve.get('p99'))}",
    ]
    return "\n".join(lines)
