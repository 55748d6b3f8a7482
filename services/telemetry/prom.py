"""A small parser for the Prometheus text exposition format (what vLLM serves on ``/metrics``).

Format (https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format): one
sample per line, ``name{label="value",...} value [timestamp]``; ``#`` lines are comments
(``# HELP`` / ``# TYPE``); label values are double-quoted with ``\\\\``, ``\\"`` and ``\\n``
escapes; values are Go floats including ``NaN``, ``+Inf`` and ``-Inf``. Blank lines, any order
of series and labels, trailing commas in the label set and a trailing timestamp are accepted.

A line that does not parse raises :class:`PromParseError` naming the line number and what was
wrong; :func:`parse_lenient` skips such lines instead and returns them for the caller to log,
so one odd line from a newer vLLM does not blind the scheduler to a node.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final

__all__ = ["PromParseError", "Sample", "parse", "parse_lenient", "parse_line"]

_NAME_RE: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}
_SPECIAL: Final = {"nan": math.nan, "+inf": math.inf, "inf": math.inf, "-inf": -math.inf}


class PromParseError(ValueError):
    """Line ``line`` of a metrics page is not in the text format, for ``reason``."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"metrics line {line}: {reason}")


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: metric ``name``, its ``labels`` and ``value``."""

    name: str
    value: float
    labels: dict[str, str] = field(default_factory=dict)


def _value(text: str, lineno: int) -> float:
    special = _SPECIAL.get(text.lower())
    if special is not None:
        return special
    try:
        return float(text)
    except ValueError:
        raise PromParseError(lineno, f"value {text!r} is not a number") from None


def _labels(line: str, pos: int, lineno: int) -> tuple[dict[str, str], int]:
    """Parse ``{...}`` starting at ``line[pos] == "{"``; return the labels and the end index."""
    labels: dict[str, str] = {}
    i = pos + 1
    n = len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == "}":
            return labels, i + 1
        m = _LABEL_RE.match(line, i)
        if m is None:
            raise PromParseError(lineno, f"bad label name at column {i + 1}")
        key = m.group()
        i = m.end()
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != "=":
            raise PromParseError(lineno, f"expected '=' after label {key!r}")
        i += 1
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] != '"':
            raise PromParseError(lineno, f"label {key!r}: value must be double-quoted")
        i += 1
        out: list[str] = []
        while True:
            if i >= n:
                raise PromParseError(lineno, f"label {key!r}: unterminated value")
            c = line[i]
            if c == "\\" and i + 1 < n:
                out.append(_ESCAPES.get(line[i + 1], "\\" + line[i + 1]))
                i += 2
                continue
            if c == '"':
                i += 1
                break
            out.append(c)
            i += 1
        labels[key] = "".join(out)
        while i < n and line[i] in " \t":
            i += 1
        if i < n and line[i] == ",":
            i += 1
        elif i < n and line[i] == "}":
            continue
        else:
            raise PromParseError(lineno, f"expected ',' or '}}' after label {key!r}")


def parse_line(line: str, lineno: int = 1) -> Sample | None:
    """One line: a :class:`Sample`, or ``None`` for a blank or comment line."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    m = _NAME_RE.match(text)
    if m is None:
        raise PromParseError(lineno, "line does not start with a metric name")
    name = m.group()
    i = m.end()
    labels: dict[str, str] = {}
    if i < len(text) and text[i] == "{":
        labels, i = _labels(text, i, lineno)
    rest = text[i:].split()
    if not rest:
        raise PromParseError(lineno, f"metric {name!r} has no value")
    if len(rest) > 2:
        raise PromParseError(lineno, f"metric {name!r}: unexpected text after the value")
    if i < len(text) and text[i] not in " \t":
        raise PromParseError(lineno, f"metric {name!r}: expected a space before the value")
    return Sample(name=name, value=_value(rest[0], lineno), labels=labels)


def parse(text: str) -> list[Sample]:
    """Every sample of a metrics page, in page order; raise on the first bad line."""
    out: list[Sample] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        sample = parse_line(line, lineno)
        if sample is not None:
            out.append(sample)
    return out


def parse_lenient(text: str) -> tuple[list[Sample], list[PromParseError]]:
    """Every sample that parses, and the errors of the lines that did not."""
    out: list[Sample] = []
    errors: list[PromParseError] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        try:
            sample = parse_line(line, lineno)
        except PromParseError as exc:
            errors.append(exc)
            continue
        if sample is not None:
            out.append(sample)
    return out, errors
