"""``tao inspect``: what TAO knows, one subcommand per target.

    tao inspect node NODE [--json]                          KV cache of one node
    tao inspect prefix --node NODE --tokens FILE [--json]   resident prefix of some token ids
    tao inspect session ID [--json]                         one session (inspect_state.py)
    tao inspect tools [--json]                              tool duration statistics

``node`` and ``prefix`` ask the telemetry service over NATS (core request/reply on
``tao.v1.inspect.node|prefix``, :mod:`services.telemetry.inspect`). NATS is ``--nats``, else
``TAO_NATS_URL`` (namespace ``TAO_NAMESPACE``), else the run file of a running ``tao up``. When
there is no NATS, or no telemetry answers within ``--timeout`` (2 s), the command reads the node
itself: from the nodes file (``TAO_NODES_FILE``, else the running ``tao up``'s) it takes the
node's ``kv_events`` / ``kv_replay`` endpoints, replays the publisher's buffer from seq 0
(:class:`~shared.infra.kvzmq.KvFeed` with ``catch_up``), keeps listening for ``--live`` seconds
(0.5) after the first live batch (or after the replay, if none comes), and answers from an index
built the way telemetry builds it. There ``healthy`` means "the node's KV stream answered" and
``capacity_tokens`` is the nodes file's override (``null`` without one): the scraper's view is
telemetry's.

``--json`` prints exactly the documented objects (:mod:`shared.contracts.inspect`):

* node: ``{"node", "blocks", "resident_tokens", "seq", "incarnation", "healthy",
  "capacity_tokens", "host_blocks", "host_resident_tokens"}`` (the host fields: the node's host
  KV tier, 0 without one);
* prefix: ``{"resident_prefix_tokens": N, "host_prefix_tokens": H}`` (``FILE`` is a JSON list
  of token ids; ``H``: the leading tokens resident in the node's host KV tier).

Without ``--json`` a short table says the same and where it came from. A bad ``--tokens`` file,
an unknown node, or a node that neither telemetry nor the nodes file can answer for: exit 2,
one line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncGenerator
from typing import Any, Final, TextIO, cast

import anyio
import msgspec

from shared.cli.inspect_state import add_state_parsers
from shared.cli.ops import OpsError
from shared.contracts import subjects
from shared.contracts.errors import ContractError, DecodeError
from shared.contracts.inspect import (
    InspectRefused,
    NodeInspect,
    NodeQuery,
    PrefixInspect,
    PrefixQuery,
    decode_reply,
    encode_body,
)
from shared.contracts.kv import KVEventBatch, decode_kv_batch
from shared.core.blockkeys import DEFAULT_BLOCK_SIZE, TOKEN_MAX
from shared.core.kvindex import KvIndex
from shared.core.tiers import CPU
from shared.infra.errors import BusError, RunFileError, SettingsError
from shared.infra.nodesfile import NodesFileError, load_nodes_file
from shared.infra.runfile import RunInfo, find_running
from shared.infra.settings import NodeSpec, Settings

__all__ = ["add_inspect_parser", "read_tokens", "replay_index"]

DEFAULT_TIMEOUT_S: Final = 2.0
DEFAULT_LIVE_S: Final = 0.5
_REPLAY_TIMEOUT_S: Final = 2.0
_DEADLINE_S: Final = 30.0


def add_inspect_parser(sub: Any) -> None:
    """Register ``inspect`` and its targets on the ``tao`` subparsers."""
    insp = sub.add_parser(
        "inspect",
        help="what TAO knows about a node, a prefix, a session or the tools",
        description="Inspect one target; see `tao inspect TARGET --help`.",
    )
    targets = insp.add_subparsers(dest="target", metavar="TARGET", required=True)

    node = targets.add_parser(
        "node",
        help="resident blocks, seq, incarnation, health and capacity of one node",
        description="A node's KV cache as TAO sees it (telemetry, else the node's KV stream).",
    )
    node.add_argument("node", metavar="NODE", help="node id")
    _add_common(node)
    node.set_defaults(run=_cmd_node)

    prefix = targets.add_parser(
        "prefix",
        help="how many leading tokens of a token-id list are resident on a node",
        description="Walk TAO's block keys of FILE's token ids against a node's resident blocks.",
    )
    prefix.add_argument("--node", required=True, metavar="NODE", help="node id")
    prefix.add_argument(
        "--tokens", required=True, metavar="FILE", help="JSON list of token ids ('-': stdin)"
    )
    _add_common(prefix)
    prefix.set_defaults(run=_cmd_prefix)

    add_state_parsers(targets)  # `session` and `tools`: the store's view (inspect_state.py)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--nats", metavar="URL", help="NATS URL (default: TAO_NATS_URL, then tao up)")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"wait for telemetry, s (default {DEFAULT_TIMEOUT_S:g})",
    )
    p.add_argument(
        "--live",
        type=float,
        default=DEFAULT_LIVE_S,
        metavar="S",
        help=f"read the node's live stream this long when reading it directly (default "
        f"{DEFAULT_LIVE_S:g})",
    )


# -- inputs --------------------------------------------------------------------------------------


def read_tokens(source: str) -> list[int]:
    """The token ids in ``source`` (a JSON list of ints in 0..2**32-1); OpsError if not."""
    try:
        if source == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(source, "rb") as fh:
                data = fh.read()
    except OSError as exc:
        raise OpsError(f"--tokens: cannot read {source!r}: {exc.strerror or exc}") from None
    try:
        tokens = msgspec.json.decode(data, type=list[int])
    except msgspec.DecodeError as exc:
        raise OpsError(f"--tokens: {source!r} is not a JSON list of token ids: {exc}") from None
    bad = next((t for t in tokens if not 0 <= t <= TOKEN_MAX), None)
    if bad is not None:
        raise OpsError(f"--tokens: token id {bad} is outside 0..{TOKEN_MAX}")
    return tokens


def _check(args: argparse.Namespace, node: str) -> None:
    try:
        subjects.check_name(node, "node id")
    except ContractError as exc:
        raise OpsError(f"node: {exc}") from None
    if not args.timeout > 0:
        raise OpsError(f"--timeout: must be > 0, got {args.timeout}")
    if not args.live >= 0:
        raise OpsError(f"--live: must be >= 0, got {args.live}")


class _Where:
    """Where to ask: NATS (URL, namespace) and the node inventory, found once."""

    def __init__(self, args: argparse.Namespace) -> None:
        try:
            self.settings = Settings.from_env()
        except SettingsError as exc:
            raise OpsError(str(exc)) from None
        try:
            self.running: RunInfo | None = find_running()
        except RunFileError:
            self.running = None
        self.nats = args.nats or self.settings.nats_url
        self.namespace = self.settings.namespace
        if self.nats is None and self.running is not None:
            self.nats, self.namespace = self.running.nats_url, self.running.namespace

    def spec(self, node: str) -> NodeSpec | None:
        nodes = self.settings.nodes
        if not nodes and self.running is not None and self.running.nodes_file:
            try:
                nodes = load_nodes_file(self.running.nodes_file)
            except NodesFileError as exc:
                raise OpsError(f"nodes file of the running tao up: {exc}") from None
        return next((n for n in nodes if n.id == node), None)


# -- asking telemetry ----------------------------------------------------------------------------


async def _ask(where: _Where, what: str, body: bytes, timeout: float) -> bytes | None:
    """Telemetry's reply, or None when there is no NATS or no answer in time."""
    if where.nats is None:
        return None
    import nats.errors

    from shared.infra.bus import Bus

    try:
        bus = await Bus.connect(
            where.nats,
            name="tao-inspect",
            namespace=where.namespace,
            connect_timeout_s=timeout,
            allow_reconnect=False,
            quiet=True,
        )
    except BusError:
        return None
    try:
        return await bus.request(subjects.inspect(what), body, timeout)
    except BusError:
        return None
    finally:
        with contextlib.suppress(nats.errors.Error):
            await bus.nc.close()


# -- reading the node directly ---------------------------------------------------------------------


async def replay_index(
    spec: NodeSpec,
    *,
    live_s: float = DEFAULT_LIVE_S,
    replay_timeout_s: float = _REPLAY_TIMEOUT_S,
    deadline_s: float = _DEADLINE_S,
) -> tuple[KvIndex, bool]:
    """An index of ``spec``'s KV stream: its replay buffer from seq 0, then ``live_s`` of live
    batches; and whether the stream answered at all (a replay or any batch)."""
    from shared.infra.kvzmq import KvFeed

    if spec.kv_events is None:
        raise OpsError(f"node {spec.id!r} has no kv_events endpoint in the nodes file")
    feed = KvFeed(
        spec.id, spec.kv_events, spec.kv_replay, catch_up=True, replay_timeout_s=replay_timeout_s
    )
    index = KvIndex()
    heard = False
    stream = cast(AsyncGenerator[Any, None], feed.messages())  # an async generator
    loop = asyncio.get_running_loop()
    first_wait = (replay_timeout_s if spec.kv_replay else 0.0) + live_s
    end: float | None = None
    try:
        with anyio.move_on_after(deadline_s):
            while True:
                wait = first_wait if not heard and end is None else live_s
                if end is not None:
                    wait = end - loop.time()
                if wait <= 0:
                    break
                try:
                    msg = await asyncio.wait_for(anext(stream), wait)
                except (TimeoutError, StopAsyncIteration):
                    break
                heard = True
                try:
                    batch = decode_kv_batch(msg.payload)
                except DecodeError:
                    batch = KVEventBatch(ts=msg.received_at, events=[])
                index.apply(spec.id, msg.seq, batch, msg.received_at)
                if not msg.replayed and end is None:
                    end = loop.time() + live_s
    finally:
        await stream.aclose()  # runs its finally: closes the sockets
    return index, heard or feed.stats.replays > 0


# -- commands ------------------------------------------------------------------------------------


def _cmd_node(args: argparse.Namespace, out: TextIO) -> int:
    node = str(args.node)
    _check(args, node)
    where = _Where(args)
    raw = anyio.run(_ask, where, "node", encode_body(NodeQuery(node)), float(args.timeout))
    source = "telemetry"
    if raw is not None:
        try:
            reply = decode_reply(raw, NodeInspect)
        except InspectRefused as exc:
            raise OpsError(str(exc)) from None
    else:
        spec = _direct_spec(where, node)
        index, heard = anyio.run(_replay, spec, float(args.live))
        reply = index.inspect_node(node, heard, spec.capacity_tokens)
        source = "the node's KV stream (telemetry did not answer)"
    if args.json:
        out.write(encode_body(reply).decode() + "\n")
    else:
        out.write(_node_table(reply, source) + "\n")
    return 0


def _cmd_prefix(args: argparse.Namespace, out: TextIO) -> int:
    node = str(args.node)
    _check(args, node)
    tokens = read_tokens(str(args.tokens))
    where = _Where(args)
    body = encode_body(PrefixQuery(node, tokens))
    raw = anyio.run(_ask, where, "prefix", body, float(args.timeout))
    source = "telemetry"
    if raw is not None:
        try:
            reply = decode_reply(raw, PrefixInspect)
        except InspectRefused as exc:
            raise OpsError(str(exc)) from None
    else:
        spec = _direct_spec(where, node)
        index, _ = anyio.run(_replay, spec, float(args.live))
        bs = index.block_size(node) or DEFAULT_BLOCK_SIZE
        reply = PrefixInspect(
            index.walk_tokens(node, tokens, bs), index.walk_tokens(node, tokens, bs, CPU)
        )
        source = "the node's KV stream (telemetry did not answer)"
    if args.json:
        out.write(encode_body(reply).decode() + "\n")
    else:
        n, host = reply.resident_prefix_tokens, reply.host_prefix_tokens
        tiered = f", {host} in its host KV tier" if host else ""
        out.write(f"{n} of {len(tokens)} tokens resident on {node}{tiered} (from {source})\n")
    return 0


async def _replay(spec: NodeSpec, live_s: float) -> tuple[KvIndex, bool]:
    return await replay_index(spec, live_s=live_s)


def _direct_spec(where: _Where, node: str) -> NodeSpec:
    spec = where.spec(node)
    why = "no NATS known" if where.nats is None else "telemetry did not answer"
    if spec is None:
        raise OpsError(f"unknown node {node!r}: {why} and it is not in the nodes file")
    if spec.kv_events is None:
        raise OpsError(f"node {node!r}: {why} and it has no kv_events endpoint to read")
    return spec


def _node_table(r: NodeInspect, source: str) -> str:
    rows = [
        ("node", r.node),
        ("blocks", f"{r.blocks:,}"),
        ("resident tokens", f"{r.resident_tokens:,}"),
        ("seq", "-" if r.seq is None else str(r.seq)),
        ("incarnation", str(r.incarnation)),
        ("healthy", "yes" if r.healthy else "no"),
        ("capacity", "-" if r.capacity_tokens is None else f"{r.capacity_tokens:,} tokens"),
    ]
    if r.host_blocks:  # the node's host KV tier (vLLM's OffloadingConnector)
        rows[3:3] = [
            ("host blocks", f"{r.host_blocks:,}"),
            ("host tokens", f"{r.host_resident_tokens:,}"),
        ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines.append(f"(from {source})")
    return "\n".join(lines)
