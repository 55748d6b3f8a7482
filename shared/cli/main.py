"""The ``tao`` command line: ``plan``, ``compare``, ``policies``, ``version``, ``sim``,
``service``, ``up``, ``status``, ``demo``, ``hook``, ``hooks`` and ``engines``.

Exit codes: 0 success; 2 bad usage or bad input, with exactly one line on stderr of the form
``tao plan: error: <field>: <reason>``; 1 an unexpected internal error (also one line);
130 interrupted (Ctrl-C); 141 the reader of stdout went away (``tao compare | head -1``).
No traceback is ever printed.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any, NoReturn, TextIO, cast

import orjson

from shared.cli.compare import compare_documents, compare_table, run_all
from shared.cli.demo import add_demo_parser
from shared.cli.engines import add_engines_parser
from shared.cli.explain import add_explain_parser
from shared.cli.hooks import add_hooks_parsers
from shared.cli.inspect import add_inspect_parser
from shared.cli.keys import add_keys_parser
from shared.cli.kvbridge import add_kvbridge_parser
from shared.cli.ops import OpsError, add_ops_parsers
from shared.cli.plan import plan_document, run_policy
from shared.cli.sim import add_sim_parser, int_at_least, positive_number
from shared.cli.snapshot import parse_snapshot
from shared.cli.top import add_top_parser
from shared.cli.trace import add_trace_parser
from shared.cli.warm import add_warm_parser
from shared.core.generate import CreditMode, generate
from shared.core.policies import DEFAULT_BUDGET, POLICY_NAMES, UnknownPolicyError
from shared.core.problem import Problem, ProblemError
from shared.examples import path as example_path

DISTRIBUTION = "tao-scheduler"
EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141

_GENERATOR_OPTIONS = ("nodes", "candidates", "load", "credit", "seed", "interchangeable")


class UsageError(Exception):
    """Bad usage or bad input: reported as one line, exit 2."""

    def __init__(self, prog: str, message: str) -> None:
        self.prog = prog
        self.message = message
        super().__init__(f"{prog}: error: {message}")


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows every option's default: ``(default: X)`` is appended to an option's help
    when it has a default (not None or False) that the help does not already state."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and default not in (None, False, argparse.SUPPRESS)
            and "default" not in text
            and not isinstance(action, argparse._VersionAction)
        ):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """An argparse parser that raises :class:`UsageError` instead of printing usage and exiting,
    and shows every default in its help (:class:`_DefaultsFormatter`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, message.removeprefix("argument "))


# -- argument types (their messages follow "<option>: ") ------------------------------------------


def _policy_name(text: str) -> str:
    if text not in POLICY_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown policy {text!r}; known: {', '.join(POLICY_NAMES)}"
        )
    return text


def build_parser() -> argparse.ArgumentParser:
    """The ``tao`` parser with its subcommands."""
    parser = _Parser(prog="tao", description="TAO: tool-aware joint scheduling for LLM agents.")
    parser.add_argument("--version", action="version", version=f"tao {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    plan = sub.add_parser(
        "plan",
        help="plan one snapshot (JSON) and print the placement as one JSON line",
        description="Read a snapshot (FILE, or stdin when FILE is '-') and print its plan.",
    )
    plan.add_argument("file", nargs="?", metavar="FILE", help="snapshot JSON; '-' for stdin")
    plan.add_argument("--example", action="store_true", help="plan the bundled example snapshot")
    _add_policy_options(plan, with_policy=True)
    plan.add_argument(
        "--time-limit-ms",
        type=positive_number,
        metavar="MS",
        help="stop searching after MS milliseconds and fall back (tao policies)",
    )
    plan.set_defaults(run=_cmd_plan)

    compare = sub.add_parser(
        "compare",
        help="run every policy on one snapshot and print them side by side",
        description="Run every policy on a generated snapshot (or --snapshot FILE).",
    )
    compare.add_argument("--snapshot", metavar="FILE", help="compare on this snapshot ('-': stdin)")
    compare.add_argument("--nodes", type=int_at_least(1), help="generated nodes (default 4)")
    compare.add_argument(
        "--candidates", type=int_at_least(0), help="generated candidates (default 64)"
    )
    compare.add_argument(
        "--load", type=positive_number, help="demand / free capacity (default 2.0)"
    )
    compare.add_argument(
        "--credit", choices=("one", "several", "none"), help="credit spread (default one)"
    )
    compare.add_argument("--seed", type=int_at_least(0), help="generator seed (default 0)")
    compare.add_argument(
        "--interchangeable",
        action="store_true",
        default=None,
        help="equal free capacity; half the nodes interchangeable",
    )
    _add_policy_options(compare, with_policy=False)
    compare.add_argument("--json", action="store_true", help="print a JSON list, not a table")
    compare.set_defaults(run=_cmd_compare)

    policies = sub.add_parser("policies", help="list the policy names, one per line")
    policies.set_defaults(run=_cmd_policies)

    ver = sub.add_parser("version", help="print the version")
    ver.set_defaults(run=_cmd_version)

    add_sim_parser(sub)
    add_explain_parser(sub)
    add_ops_parsers(sub)
    add_demo_parser(sub)
    add_kvbridge_parser(sub)
    add_trace_parser(sub)
    add_hooks_parsers(sub)
    add_top_parser(sub)
    add_inspect_parser(sub)
    add_engines_parser(sub)
    add_keys_parser(sub)
    add_warm_parser(sub)
    return parser


def _add_policy_options(parser: argparse.ArgumentParser, *, with_policy: bool) -> None:
    if with_policy:
        parser.add_argument(
            "--policy",
            type=_policy_name,
            default="tao",
            metavar="NAME",
            help=f"one of: {', '.join(POLICY_NAMES)} (default tao)",
        )
    parser.add_argument(
        "--budget",
        type=int_at_least(1),
        default=DEFAULT_BUDGET,
        metavar="STATES",
        help=f"DP state budget per solve (default {DEFAULT_BUDGET})",
    )


# -- commands ------------------------------------------------------------------------------------


def _read(source: str) -> bytes:
    if source == "-":
        stream = sys.stdin
        buffer = getattr(stream, "buffer", None)
        return buffer.read() if buffer is not None else stream.read().encode("utf-8")
    try:
        with open(source, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise ProblemError("input", f"cannot read {source!r}: {exc.strerror or exc}") from None


def _emit(text: str, out: TextIO) -> None:
    out.write(text + "\n")
    out.flush()


def _cmd_plan(args: argparse.Namespace, out: TextIO) -> int:
    if args.example and args.file is not None:
        raise UsageError("tao plan", "--example: cannot be combined with FILE")
    if args.example:
        source = str(example_path())
    elif args.file is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("tao plan", "input: no FILE given and stdin is a terminal")
        source = "-"
    else:
        source = args.file
    problem = parse_snapshot(_read(source))
    timed = run_policy(problem, args.policy, budget=args.budget, time_limit_ms=args.time_limit_ms)
    _emit(orjson.dumps(plan_document(timed)).decode(), out)
    return EXIT_OK


def _pick(value: object, default: object) -> object:
    return default if value is None else value


def _generated(args: argparse.Namespace) -> tuple[Problem, str]:
    seed = int(cast(int, _pick(args.seed, 0)))
    nodes = int(cast(int, _pick(args.nodes, 4)))
    candidates = int(cast(int, _pick(args.candidates, 64)))
    load = float(cast(float, _pick(args.load, 2.0)))
    credit = cast(CreditMode, _pick(args.credit, "one"))
    interchangeable = bool(args.interchangeable)
    problem = generate(
        seed,
        nodes=nodes,
        candidates=candidates,
        load=load,
        credit=credit,
        interchangeable=interchangeable,
    )
    title = (
        f"snapshot: generated (seed {seed}, {nodes} nodes, {candidates} candidates, "
        f"load {load:g}, credit {credit}{', interchangeable' if interchangeable else ''})"
    )
    return problem, title


def _cmd_compare(args: argparse.Namespace, out: TextIO) -> int:
    if args.snapshot is not None:
        given = [f"--{name}" for name in _GENERATOR_OPTIONS if getattr(args, name) is not None]
        if given:
            raise UsageError("tao compare", f"--snapshot: cannot be combined with {given[0]}")
        problem = parse_snapshot(_read(args.snapshot))
        title = (
            f"snapshot: {args.snapshot} ({len(problem.nodes)} nodes, "
            f"{len(problem.candidates)} candidates)"
        )
    else:
        problem, title = _generated(args)
    results = run_all(problem, budget=args.budget)
    if args.json:
        _emit(orjson.dumps(compare_documents(results)).decode(), out)
    else:
        _emit(f"{title}\n{compare_table(results)}", out)
    return EXIT_OK


def _cmd_policies(args: argparse.Namespace, out: TextIO) -> int:
    _emit("\n".join(POLICY_NAMES), out)
    return EXIT_OK


def _cmd_version(args: argparse.Namespace, out: TextIO) -> int:
    _emit(f"tao {version()}", out)
    return EXIT_OK


def version() -> str:
    """The installed distribution's version, or ``unknown`` when run from a bare checkout."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


# -- entry point ----------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(prog: str, message: str, code: int) -> int:
    try:
        sys.stderr.write(f"{prog}: error: {_one_line(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return code


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


_TOP_OPTIONS = frozenset({"-h", "--help", "--version"})
"""The options ``tao`` itself takes before its COMMAND."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tao`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    prog = "tao"
    try:
        parser = build_parser()
        given = list(sys.argv[1:] if argv is None else argv)
        first = next((a for a in given if a not in _TOP_OPTIONS), None)
        if first is not None and first.startswith("-"):  # before a COMMAND: name it, not that
            raise UsageError(prog, f"unrecognized arguments: {first}")
        try:
            args, extra = parser.parse_known_args(given)
        except SystemExit as exc:  # --help / --version print and exit 0
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        prog = f"tao {args.command}"
        if extra:  # reported against the subcommand, not the top-level parser
            raise UsageError(prog, f"unrecognized arguments: {' '.join(extra)}")
        code: int = args.run(args, sys.stdout)
        return code
    except UsageError as exc:
        return _fail(exc.prog, exc.message, EXIT_USAGE)
    except ProblemError as exc:
        return _fail(prog, f"{exc.field_path}: {exc.reason}", EXIT_USAGE)
    except UnknownPolicyError as exc:
        return _fail(prog, f"--policy: {exc}", EXIT_USAGE)
    except OpsError as exc:
        return _fail(prog, str(exc), EXIT_USAGE)
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return _fail(prog, "interrupted", EXIT_INTERRUPTED)
    except Exception as exc:
        return _fail(prog, f"internal: {type(exc).__name__}: {exc}", EXIT_INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
