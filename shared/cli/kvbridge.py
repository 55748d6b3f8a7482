"""``tao kv-bridge --node ID``: forward one vLLM node's ZMQ KV-event stream onto NATS.

For deployments where the scheduler cannot reach the engines' ZMQ sockets: a sidecar next to
the engine subscribes to its PUB socket (:class:`~shared.infra.kvzmq.KvFeed`, which fills gaps
from the replay socket itself) and publishes every payload, bytes unchanged, on
``subjects.kv_events(ID)`` (JetStream stream ``TAO_V1_KV``) with the headers ``Tao-KV-Seq``
(decimal ``seq``) and ``Tao-Received-At`` (epoch seconds). A payload that NATS does not take is
retried until it does (in order), so the NATS stream has no holes the bridge could have filled;
meanwhile ZMQ buffers, and what it drops past its high-water mark is replayed.

Endpoints: ``--kv-events`` / ``--kv-replay``, else the ``kv_events`` / ``kv_replay`` of node ID
in the nodes file (``TAO_NODES_FILE``, else the one of a running ``tao up``). NATS:
``--nats``, else ``TAO_NATS_URL``, else the running ``tao up``'s. Runs until SIGINT/SIGTERM
(the shared service runner: the bus is drained on the way out). Bad arguments, an unknown node
or a node without ``kv_events`` exit 2 with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any, TextIO

import anyio

from shared.cli.ops import OpsError
from shared.contracts import subjects
from shared.contracts.errors import SubjectError
from shared.infra.errors import RunFileError, SettingsError
from shared.infra.kvzmq import DEFAULT_REPLAY_TIMEOUT_S, KvFeed, bridge_headers
from shared.infra.nodesfile import NodesFileError, load_nodes_file
from shared.infra.runfile import RunInfo, find_running, run_file_path
from shared.infra.runner import ServiceContext, run_service_async
from shared.infra.settings import NodeSpec, Settings

__all__ = ["add_kvbridge_parser", "bridge"]

SERVICE = "kv-bridge"
_RETRY_FIRST_S = 0.1
_RETRY_MAX_S = 5.0


def add_kvbridge_parser(sub: Any) -> None:
    """Register ``kv-bridge`` on the ``tao`` subparsers."""
    p = sub.add_parser(
        "kv-bridge",
        help="forward one vLLM node's ZMQ KV events onto NATS (with gap replay)",
        description="Forward one node's KV-event stream onto NATS until SIGINT/SIGTERM.",
    )
    p.add_argument("--node", required=True, metavar="ID", help="node id (subject token)")
    p.add_argument("--kv-events", metavar="URL", help="ZMQ PUB endpoint (default: nodes file)")
    p.add_argument("--kv-replay", metavar="URL", help="ZMQ replay endpoint (default: nodes file)")
    p.add_argument("--nats", metavar="URL", help="NATS URL (default: TAO_NATS_URL, then tao up)")
    p.add_argument(
        "--replay-timeout",
        type=float,
        default=DEFAULT_REPLAY_TIMEOUT_S,
        metavar="S",
        help=f"wait for each replay frame, s (default {DEFAULT_REPLAY_TIMEOUT_S:g})",
    )
    p.set_defaults(run=_cmd_kv_bridge)


def _endpoint(flag: str, value: str | None) -> str | None:
    if value is not None and "://" not in value:
        raise OpsError(f"{flag}: must be a ZMQ endpoint like tcp://host:5557, got {value!r}")
    return value


def _nodes(settings: Settings, running: RunInfo | None) -> tuple[NodeSpec, ...]:
    if settings.nodes:
        return settings.nodes
    if running is not None and running.nodes_file:
        try:
            return load_nodes_file(running.nodes_file)
        except NodesFileError as exc:
            raise OpsError(f"nodes file of the running tao up: {exc}") from None
    return ()


def resolve(args: argparse.Namespace, env: dict[str, str]) -> tuple[Settings, str, str, str | None]:
    """(settings with the NATS URL, node, kv_events, kv_replay), or :class:`OpsError`."""
    try:
        settings = Settings.from_env(env)
    except SettingsError as exc:
        raise OpsError(str(exc)) from None
    node = str(args.node)
    try:
        subjects.kv_events(node)
    except SubjectError as exc:
        raise OpsError(f"--node: {exc}") from None
    if not args.replay_timeout > 0:
        raise OpsError(f"--replay-timeout: must be > 0, got {args.replay_timeout}")
    events = _endpoint("--kv-events", args.kv_events)
    replay = _endpoint("--kv-replay", args.kv_replay)
    try:
        running = find_running(run_file_path(env))
    except RunFileError:  # unreadable: as if no tao up were running (like `tao inspect`)
        running = None
    if events is None:
        spec = next((n for n in _nodes(settings, running) if n.id == node), None)
        if spec is None:
            raise OpsError(
                f"--node: unknown node {node!r} (not in the nodes file); pass --kv-events"
            )
        if spec.kv_events is None:
            raise OpsError(f"--node: node {node!r} has no kv_events endpoint")
        events = spec.kv_events
        replay = replay or spec.kv_replay
    nats = args.nats or settings.nats_url
    if nats is None and running is not None:
        nats = running.nats_url
    if nats is None:
        raise OpsError("no NATS: pass --nats URL, set TAO_NATS_URL, or start `tao up`")
    if "://" not in nats:
        raise OpsError(f"--nats: must be a URL like nats://host:4222, got {nats!r}")
    return settings.replace(nats_url=nats), node, events, replay


async def bridge(feed: KvFeed, ctx: ServiceContext) -> None:
    """Publish every message of ``feed`` on NATS, in order, retrying each until it is taken."""
    bus = ctx.require_bus()
    subject = subjects.kv_events(feed.node)
    ctx.log.info(
        "kv_bridge_started", node=feed.node, kv_events=feed.kv_events, kv_replay=feed.kv_replay
    )
    async for msg in feed.messages():
        delay = _RETRY_FIRST_S
        while True:
            try:
                await bus.publish(subject, msg.payload, bridge_headers(msg))
                break
            except Exception as exc:  # NATS down or slow: keep the order, wait and retry
                ctx.log.warning(
                    "kv_bridge_publish_failed",
                    node=feed.node,
                    seq=msg.seq,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_s=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX_S)


def _cmd_kv_bridge(args: argparse.Namespace, out: TextIO) -> int:
    settings, node, events, replay = resolve(args, dict(os.environ))
    timeout = float(args.replay_timeout)

    async def main(_settings: Settings, ctx: ServiceContext) -> None:
        feed = KvFeed(node, events, replay, replay_timeout_s=timeout)
        await bridge(feed, ctx)

    async def run() -> int:
        return await run_service_async(SERVICE, main, settings=settings)

    return anyio.run(run)
