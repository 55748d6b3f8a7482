"""``tao trace import``: real agent logs → one session-trace JSONL file.

``tao trace import --from mini-swe-agent|claude-code|opencode FILE... [-o trace.jsonl]`` runs the
importer of :mod:`shared.trace` on every file, prints one summary line per file on stderr
(sessions, turns, tools, and what was skipped) and writes all sessions, in file order, to
``-o`` (default: stdout) in the format of docs/evaluation.md ("Session-trace JSONL"), which
``tao sim --trace`` and ``tao demo --trace`` read. Arrival offsets (``start``) are relative to the
earliest session of the whole import. A session id seen before (the same file twice, a resumed
Claude Code session) gets a ``#2``, ``#3``… suffix.

Any file that cannot be read or holds no usable turn fails the whole command with one line
naming ``FILE:LINE`` and the reason (exit 2); the output file is then left untouched (it is
written to a temporary file and renamed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, TextIO

from shared.cli.ops import OpsError
from shared.trace import IMPORTERS, TraceSession

__all__ = ["add_trace_parser", "import_files"]


def add_trace_parser(sub: Any) -> None:
    """Register ``tao trace`` (with its ``import`` subcommand)."""
    trace = sub.add_parser(
        "trace",
        help="import agent logs as session traces (tao trace import ...)",
        description="Session traces: import real agent logs for tao sim / tao demo --trace.",
    )
    tsub = trace.add_subparsers(dest="trace_command", metavar="COMMAND", required=True)
    imp = tsub.add_parser(
        "import",
        help="convert mini-swe-agent / Claude Code / OpenCode logs to session-trace JSONL",
        description="Convert agent logs to the session-trace JSONL of docs/evaluation.md.",
    )
    imp.add_argument(
        "--from", dest="source", required=True, choices=tuple(IMPORTERS), help="log format"
    )
    imp.add_argument("files", nargs="+", metavar="FILE", help="log files")
    imp.add_argument(
        "-o", "--output", default="-", metavar="FILE", help="output JSONL (default: stdout)"
    )
    imp.set_defaults(run=_cmd_import)


def import_files(
    source: str, paths: Sequence[str], log: TextIO | None = None
) -> list[dict[str, object]]:
    """Every session of ``paths`` as trace records; one summary line per file on ``log``."""
    importer = IMPORTERS[source]
    sessions: list[TraceSession] = []
    for path in paths:
        result = importer(path)
        if log is not None:
            log.write(f"tao trace import: {path}: {result.summary()}\n")
        sessions.extend(result.sessions)
    firsts = [s.first_ts for s in sessions if s.first_ts is not None]
    base = min(firsts) if firsts else 0.0
    seen: dict[str, int] = {}
    records = []
    for s in sessions:
        rec = s.record(None if s.first_ts is None else s.first_ts - base)
        n = seen[s.id] = seen.get(s.id, 0) + 1
        if n > 1:
            rec["session"] = f"{s.id}#{n}"
        records.append(rec)
    return records


def _write(records: Sequence[dict[str, object]], output: str, out: TextIO) -> None:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    if output == "-":
        out.write(text)
        out.flush()
        return
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=".trace-", suffix=".jsonl", dir=os.path.dirname(os.path.abspath(output))
        )
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, output)
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise OpsError(f"-o: cannot write {output!r}: {exc.strerror or exc}") from None


def _cmd_import(args: argparse.Namespace, out: TextIO) -> int:
    records = import_files(args.source, args.files, sys.stderr)
    _write(records, args.output, out)
    turns = sum(len(r["turns"]) for r in records if isinstance(r["turns"], list))
    where = "stdout" if args.output == "-" else args.output
    n = len(records)
    sys.stderr.write(
        f"tao trace import: wrote {n} session{'' if n == 1 else 's'}, {turns} turns to {where}\n"
    )
    return 0
