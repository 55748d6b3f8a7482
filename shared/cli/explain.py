"""``tao explain SESSION``: why a session was admitted, released, held or kept waiting.

It reads round records (:mod:`shared.core.explain`) from a simulator record file (``tao sim
--record FILE``) or a live planner's log (its ``plan_round`` JSON lines: ``tao up``'s log dir
keeps ``planner.log``), picks the entries about the session up to ``--at T`` and prints one line
each: when, what, by which rule, at what price, and whether the plan took effect.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from shared.cli.ops import OpsError
from shared.core.explain import ExplainError, explain, rounds_from_lines

__all__ = ["add_explain_parser"]


def add_explain_parser(sub: Any) -> None:
    """Register ``tao explain`` on the ``tao`` subcommand parser."""
    p = sub.add_parser(
        "explain",
        help="say why a session was admitted, released, held or kept waiting",
        description="Read round records (tao sim --record FILE, or a planner log's plan_round "
        "lines) and print every decision about SESSION with its rule and price.",
    )
    p.add_argument("session", metavar="SESSION", help="the session id")
    p.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="FILE",
        help="a `tao sim --record` file or a planner log (JSON lines)",
    )
    p.add_argument("--at", type=float, metavar="T", help="only decisions up to time T (seconds)")
    p.add_argument("--policy", metavar="NAME", help="a record file's runs of this policy only")
    p.add_argument("--seed", type=int, metavar="N", help="a record file's runs of this seed only")
    p.set_defaults(run=_cmd_explain)


def _cmd_explain(args: argparse.Namespace, out: TextIO) -> int:
    try:
        with open(args.source, encoding="utf-8", errors="replace") as f:
            rounds = rounds_from_lines(f)
    except OSError as exc:
        raise OpsError(f"--from: cannot read {args.source!r}: {exc.strerror}") from None
    except ExplainError as exc:
        raise OpsError(f"--from {args.source}: {exc}") from None
    if args.policy is not None:
        rounds = [r for r in rounds if r.get("policy") == args.policy]
    if args.seed is not None:
        rounds = [r for r in rounds if r.get("seed") == args.seed]
    try:
        lines = explain(rounds, args.session, args.at)
    except ExplainError as exc:
        raise OpsError(str(exc)) from None
    out.write("\n".join(lines) + "\n")
    return 0
