"""The ``tao`` entry point: small commands, usage errors, and how it ends on trouble."""

from __future__ import annotations

import argparse
import sys

import pytest

from shared.cli import main as main_module
from shared.cli.main import main
from shared.core.policies import POLICY_NAMES
from shared.examples import path as example_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestSmallCommands:
    """``policies``, ``version`` and ``--help`` print to stdout and exit 0."""

    def test_policies(self, capsys: pytest.CaptureFixture[str]) -> None:
        """One policy name per line, tao first."""
        code, out, _ = run(capsys, "policies")
        assert code == 0
        assert out.splitlines() == list(POLICY_NAMES)
        assert out.splitlines()[0] == "tao"

    def test_version(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``tao version`` prints ``tao <version>``."""
        code, out, _ = run(capsys, "version")
        assert code == 0
        assert out.startswith("tao ")

    def test_help(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``--help`` prints usage and exits 0."""
        code, out, _ = run(capsys, "plan", "--help")
        assert code == 0
        assert out.startswith("usage: tao plan")


class TestUsage:
    """Bad usage exits 2 with one stderr line and never a traceback."""

    @pytest.mark.parametrize(
        ("argv", "start"),
        [
            ([], "tao: error: the following arguments are required"),
            (["deploy"], "tao: error: COMMAND: invalid choice: 'deploy'"),
            (["policies", "extra"], "tao policies: error: unrecognized arguments: extra"),
        ],
    )
    def test_bad_usage(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], start: str
    ) -> None:
        """The line starts with the program and says what is wrong."""
        code, out, err = run(capsys, *argv)
        assert (code, out) == (2, "")
        assert err.count("\n") == 1
        assert err.startswith(start)

    def test_terminal_stdin(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``tao plan`` with no FILE refuses to wait on an interactive terminal."""

        class Tty:
            def isatty(self) -> bool:
                return True

        monkeypatch.setattr(sys, "stdin", Tty())
        code, _, err = run(capsys, "plan")
        assert code == 2
        assert err.startswith("tao plan: error: input: no FILE given and stdin is a terminal")


class TestEndings:
    """Broken pipes, Ctrl-C and internal errors end with a code and at most one line."""

    def test_broken_pipe(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A reader that went away gives exit 141 and nothing on stderr."""

        class Closed:
            def write(self, text: str) -> int:
                raise BrokenPipeError(32, "Broken pipe")

            def flush(self) -> None:
                raise BrokenPipeError(32, "Broken pipe")

            def fileno(self) -> int:
                raise ValueError("no descriptor")

        monkeypatch.setattr(sys, "stdout", Closed())
        code = main(["policies"])
        assert code == 141
        assert capsys.readouterr().err == ""

    def test_interrupt(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Ctrl-C exits 130 with one line."""

        def interrupted(*args: object, **kwargs: object) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(main_module, "run_policy", interrupted)
        code, _, err = run(capsys, "plan", str(example_path()))
        assert code == 130
        assert err == "tao plan: error: interrupted\n"

    def test_internal_error(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An unexpected exception exits 1 with one line naming it, no traceback."""

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("kernel\nexploded")

        monkeypatch.setattr(main_module, "run_policy", broken)
        code, _, err = run(capsys, "plan", str(example_path()))
        assert code == 1
        assert err == "tao plan: error: internal: RuntimeError: kernel exploded\n"


def _options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("tao",)):  # type: ignore[no-untyped-def]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, (*path, name))
        elif action.option_strings:
            yield path, parser, action


class TestHelpShowsDefaults:
    def test_every_option_with_a_default_shows_it(self) -> None:
        """Each option whose default is a value (not None or False) says it in --help."""
        from shared.cli.main import build_parser

        missing = []
        checked = 0
        for path, parser, action in _options(build_parser()):
            if action.default in (None, False, argparse.SUPPRESS) or action.dest == "help":
                continue
            checked += 1
            formatter = parser._get_formatter()
            text = formatter._expand_help(action) if action.help else ""
            if "default" not in text:
                missing.append(f"{' '.join(path)} {action.option_strings[0]}")
        assert checked > 10 and missing == []
