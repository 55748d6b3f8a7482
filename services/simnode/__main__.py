"""``python -m services.simnode --port P --node-id ID [...]``: run one sim node.

Bad arguments exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from typing import NoReturn

from aiohttp import web

from services.simnode.app import SimNodeConfig, create_app
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
    config = SimNodeConfig(
        node_id=args.node_id,
        profile=args.profile,
        time_scale=args.time_scale,
        model=args.model,
        kv_tokens=args.kv_tokens,
    )
    try:
        config.engine_profile()
    except ValueError as exc:
        parser.error(str(exc))
    return config, args.host, args.port


def main(argv: Sequence[str] | None = None) -> int:
    config, host, port = parse_config(argv)
    try:
        web.run_app(create_app(config), host=host, port=port, print=None)
    except OSError as exc:
        print(f"simnode: error: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
