"""``python -m services.simnode --port P --node-id ID [...]``: run one sim node.

With ``--kv-events tcp://*:PORT`` (and ``--kv-replay tcp://*:PORT``) the node publishes its
engine's KV-cache events in vLLM's ZMQ format (:mod:`services.simnode.kvpub`), in the
``--kv-encoding`` (``legacy``, ``mapev`` or ``map``) with ``--kv-hash`` ``int`` or ``bytes``
block hashes. ``--host-kv F`` gives the engine a host KV tier of ``F`` × its GPU KV with vLLM
0.32's OffloadingConnector semantics (write-through stores, LRU, asynchronous loads); its blocks
are published as vLLM publishes them (``medium="CPU"``, placeholder payloads).

Bad arguments exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import NoReturn

import zmq
from aiohttp import web

from services.simnode.app import SimNodeConfig, create_app
from services.simnode.kvpub import DEFAULT_BUFFER_STEPS, KV_HASH_KINDS
from shared.contracts.kv import KV_ENCODINGS
from shared.core.engine import DEFAULT_PROFILE, PROFILES


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"simnode: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m services.simnode", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--node-id", required=True)
    p.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--model", default="tao-sim")
    p.add_argument("--kv-tokens", type=int, default=None)
    p.add_argument("--kv-events", metavar="ENDPOINT", help="publish vLLM KV events (tcp://*:5557)")
    p.add_argument("--kv-replay", metavar="ENDPOINT", help="KV-event replay ROUTER (tcp://*:5558)")
    p.add_argument("--kv-encoding", choices=KV_ENCODINGS, default="mapev")
    p.add_argument("--kv-hash", choices=KV_HASH_KINDS, default="int")
    p.add_argument("--kv-buffer-steps", type=int, default=DEFAULT_BUFFER_STEPS, metavar="N")
    p.add_argument("--kv-topic", default="", metavar="TOPIC")
    p.add_argument(
        "--kv-bind",
        action="store_true",
        help="bind --kv-events even on an address vLLM would connect to (tcp://127.0.0.1:P)",
    )
    p.add_argument(
        "--host-kv",
        type=float,
        default=0.0,
        metavar="F",
        help="a host KV tier of F x the GPU KV, as vLLM's OffloadingConnector (default 0: none)",
    )
    return p


def parse_config(argv: Sequence[str] | None = None) -> tuple[SimNodeConfig, str, int]:
    """(config, host, port) from the command line; exits 2 with one line when bad."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not 0 < args.port < 65536:
        parser.error(f"--port: must be 1-65535, got {args.port}")
    if not (args.time_scale > 0 and math.isfinite(args.time_scale)):
        parser.error(f"--time-scale: must be finite and > 0, got {args.time_scale}")
    if not args.node_id.strip():
        parser.error("--node-id: must not be empty")
    if args.kv_replay is not None and args.kv_events is None:
        parser.error("--kv-replay: needs --kv-events")
    for flag, endpoint in (("--kv-events", args.kv_events), ("--kv-replay", args.kv_replay)):
        if endpoint is not None and "://" not in endpoint:
            parser.error(f"{flag}: must be a ZMQ endpoint like tcp://*:5557, got {endpoint!r}")
    if args.kv_buffer_steps < 1:
        parser.error(f"--kv-buffer-steps: must be >= 1, got {args.kv_buffer_steps}")
    config = SimNodeConfig(
        node_id=args.node_id,
        profile=args.profile,
        time_scale=args.time_scale,
        model=args.model,
        kv_tokens=args.kv_tokens,
        kv_events=args.kv_events,
        kv_replay=args.kv_replay,
        kv_encoding=args.kv_encoding,
        kv_hash=args.kv_hash,
        kv_buffer_steps=args.kv_buffer_steps,
        kv_topic=args.kv_topic,
        kv_bind=args.kv_bind,
        host_kv=args.host_kv,
    )
    try:
        config.engine_profile()
        config.host_link()
    except ValueError as exc:
        parser.error(str(exc).replace("host_kv:", "--host-kv:", 1))
    return config, args.host, args.port


def main(argv: Sequence[str] | None = None) -> int:
    config, host, port = parse_config(argv)
    try:
        web.run_app(create_app(config), host=host, port=port, print=None)
    except OSError as exc:
        print(f"simnode: error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    except zmq.ZMQError as exc:
        endpoints = f"{config.kv_events} / {config.kv_replay}"
        print(f"simnode: error: cannot open KV-event sockets {endpoints}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
