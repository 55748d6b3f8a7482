"""Which shell commands are test or build runs: the tool key a shell call's history is kept under.

A coding agent's shell tool (Claude Code's ``Bash``) runs everything from ``ls`` to a test suite
under one tool name, so one duration history would mix 40 ms and 5-minute calls (TraceLab:
Claude's Bash p50 is 0.41 s while its calls over a minute hold most tool time). The predictor
keys its history by tool name, so a shell call whose command runs tests or a build is reported
as ``<tool>:test`` (``Bash:test``) and learns its own, longer history; every other command keeps
the tool's name.

A command is a test or build run when any of its ``&&`` / ``||`` / ``;`` / ``|`` segments, after
leading ``VAR=value`` assignments and wrappers (``env``, ``time``, ``timeout N``, ``nice``,
``sudo``, ``uv run``, ``poetry run``, ``pipenv run``, ``npx``, ``bunx``, ``python -m``), starts
with a test runner or build tool: ``pytest``, ``tox``, ``nox``, ``make``, ``ctest``, ``bazel``,
``gradle``, ``mvn``, ``jest``, ``vitest``, ``mocha``, ``rspec``, ``phpunit``, ``tsc``, or a
package manager's test or build verb (``cargo test``, ``go test``, ``npm test``, ``npm run
build``, ``dotnet test``, ``python -m unittest`` …). Pure.
"""

from __future__ import annotations

import re
import shlex
from typing import Final

__all__ = ["TEST_SUFFIX", "is_test_or_build", "shell_tool_key"]

TEST_SUFFIX: Final = ":test"
"""Appended to a shell tool's name for a test or build command."""

_RUNNERS: Final = frozenset(
    {
        "pytest", "py.test", "tox", "nox", "make", "gmake", "ctest", "bazel", "bazelisk",
        "gradle", "gradlew", "mvn", "mvnw", "jest", "vitest", "mocha", "rspec", "phpunit",
        "tsc", "unittest", "nosetests", "ninja", "meson", "sbt", "ant", "playwright",
    }
)  # fmt: skip
_VERBS: Final = {
    "cargo": frozenset({"test", "build", "nextest", "check", "bench"}),
    "go": frozenset({"test", "build", "vet"}),
    "npm": frozenset({"test", "t", "build", "ci"}),
    "pnpm": frozenset({"test", "t", "build"}),
    "yarn": frozenset({"test", "build"}),
    "bun": frozenset({"test", "build"}),
    "dotnet": frozenset({"test", "build"}),
    "swift": frozenset({"test", "build"}),
    "mix": frozenset({"test", "compile"}),
    "deno": frozenset({"test"}),
    "cmake": frozenset({"--build"}),
}
_RUN_SCRIPTS: Final = re.compile(r"^(test|build|check|ci)([:\-_].*)?$")
"""``npm run test:unit``, ``yarn run build``: a package script named like a test or build."""
_WRAPPERS: Final = frozenset({"env", "time", "nice", "sudo", "npx", "bunx", "command", "exec"})
_TWO_WORD_WRAPPERS: Final = frozenset({("uv", "run"), ("poetry", "run"), ("pipenv", "run")})
_SPLIT: Final = re.compile(r"&&|\|\||[;|\n]")
_ASSIGN: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _program(word: str) -> str:
    """``./gradlew`` → ``gradlew``; ``/usr/bin/python3.11`` → ``python3.11``."""
    return word.rsplit("/", 1)[-1]


def _segment_is_run(words: list[str]) -> bool:
    i = 0
    while i < len(words):
        w = words[i]
        prog = _program(w)
        if _ASSIGN.match(w) or prog in _WRAPPERS:
            i += 1
        elif prog == "timeout":  # timeout [opts] DURATION cmd
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
            i += 1
        elif i + 1 < len(words) and (prog, words[i + 1]) in _TWO_WORD_WRAPPERS:
            i += 2
        elif prog.startswith("python") and i + 2 < len(words) and words[i + 1] == "-m":
            i += 2  # python -m pytest → pytest
        else:
            break
    if i >= len(words):
        return False
    prog = _program(words[i])
    if prog in _RUNNERS:
        return True
    rest = words[i + 1 :]
    verbs = _VERBS.get(prog)
    if verbs is None or not rest:
        return False
    if rest[0] in verbs:
        return True
    return rest[0] == "run" and len(rest) > 1 and bool(_RUN_SCRIPTS.match(rest[1]))


def is_test_or_build(command: str) -> bool:
    """Whether ``command`` runs tests or a build (module docstring)."""
    for segment in _SPLIT.split(command):
        try:
            words = shlex.split(segment, comments=True)
        except ValueError:  # an unbalanced quote: the plain words are good enough here
            words = segment.split()
        if words and _segment_is_run(words):
            return True
    return False


def shell_tool_key(tool: str, command: object) -> str:
    """The name a shell call's duration is kept under: ``tool`` + :data:`TEST_SUFFIX` for a
    test or build command, else ``tool`` (also when ``command`` is not a string)."""
    if isinstance(command, str) and is_test_or_build(command):
        return tool + TEST_SUFFIX
    return tool
