"""Imported agent sessions, the session-trace records they become, and the readers' shared parts.

A *turn* is one model call: its prompt, completion and cached tokens as the API's usage
reported them, when it was sent and answered, and the tool calls of its response. Every
importer fills :class:`ModelCall` / :class:`ToolCall`; :meth:`TraceSession.to_record` writes the
session-trace JSONL line documented in docs/evaluation.md ("Session-trace JSONL") and read by
:mod:`shared.sim.trace`:

* ``prompt_tokens`` — the whole prompt (the reader derives the growth), ``output_tokens``
  (at least 1: the reader's rule; a call reported with 0 is written as 1), ``cached_tokens``
  (prompt tokens served from the provider's prefix cache; omitted when the log has no figure);
* the tool after the response: with several calls in one response (parallel tool use) the
  turn records the **longest** call — ``tool`` is its name, ``tool_duration_s`` its duration,
  ``tool_timeout_s`` / ``background`` its flags — and ``tools`` lists every call's name in call
  order (only written when there is more than one); ``tool_start_ts`` / ``tool_end_ts`` span all
  timed calls. A call whose end was never logged has no duration and is left out (counted);
* ``request_ts`` / ``response_ts`` and the tool timestamps in epoch seconds, and ``start``, the
  session's arrival offset in seconds from the earliest session of the import.

Errors: :class:`TraceImportError` (a :class:`~shared.core.problem.ProblemError`, so the CLI
prints it as one line and exits 2) names ``FILE:LINE`` (or ``FILE: json.path``) and the reason.
JSONL readers skip a bad line and count it (:class:`LineErrors`); a file without one usable turn
is an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from shared.core.problem import ProblemError

__all__ = [
    "BadRecord",
    "ImportResult",
    "LineErrors",
    "ModelCall",
    "ToolCall",
    "TraceImportError",
    "TraceSession",
    "count",
    "epoch_from_iso",
    "iter_jsonl",
    "read_text",
    "seconds",
    "session_stem",
    "usage_tokens",
]

_NOTE_LIMIT = 3  # bad-line reasons kept per file for the summary


class TraceImportError(ProblemError):
    """A file that cannot be imported: ``field_path`` is ``FILE:LINE`` or ``FILE: path``."""


class BadRecord(ValueError):
    """One record (JSONL line) that cannot be used: skipped and counted by the caller."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call of a response; ``duration_s`` is None when its end was never logged."""

    name: str
    start_ts: float | None = None
    end_ts: float | None = None
    timeout_s: float | None = None
    background: bool = False

    @property
    def duration_s(self) -> float | None:
        if self.start_ts is None or self.end_ts is None:
            return None
        return max(0.0, self.end_ts - self.start_ts)


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call (a turn) and the tool calls its response asked for."""

    prompt_tokens: int
    output_tokens: int
    cached_tokens: int | None = None
    request_ts: float | None = None
    response_ts: float | None = None
    tools: tuple[ToolCall, ...] = ()

    def record(self) -> dict[str, object]:
        """The turn's JSON object (see the module docstring)."""
        rec: dict[str, object] = {
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": max(1, self.output_tokens),
        }
        if self.cached_tokens is not None:
            rec["cached_tokens"] = self.cached_tokens
        _put_ts(rec, "request_ts", self.request_ts)
        _put_ts(rec, "response_ts", self.response_ts)
        timed = [t for t in self.tools if t.duration_s is not None]
        if not timed:
            return rec
        longest = max(timed, key=lambda t: t.duration_s or 0.0)
        rec["tool"] = longest.name
        rec["tool_duration_s"] = round(longest.duration_s or 0.0, 3)
        if len(self.tools) > 1:
            rec["tools"] = [t.name for t in self.tools]
        _put_ts(rec, "tool_start_ts", min(t.start_ts for t in timed if t.start_ts is not None))
        _put_ts(rec, "tool_end_ts", max(t.end_ts for t in timed if t.end_ts is not None))
        if longest.timeout_s is not None:
            rec["tool_timeout_s"] = longest.timeout_s
        if longest.background:
            rec["background"] = True
        return rec


def _put_ts(rec: dict[str, object], key: str, value: float | None) -> None:
    if value is not None:
        rec[key] = round(value, 3)


@dataclass(frozen=True, slots=True)
class TraceSession:
    """One agent session: an id unique within the import, its family and its model calls."""

    id: str
    family: str
    calls: tuple[ModelCall, ...]

    @property
    def first_ts(self) -> float | None:
        """The session's earliest known timestamp (its arrival), or None."""
        for c in self.calls:
            for ts in (c.request_ts, c.response_ts):
                if ts is not None:
                    return ts
        return None

    @property
    def tool_calls(self) -> int:
        """Tool calls with a duration (what the trace records)."""
        return sum(1 for c in self.calls for t in c.tools if t.duration_s is not None)

    def record(self, start: float | None) -> dict[str, object]:
        """The session-trace JSONL object; ``start`` is its arrival offset in seconds."""
        rec: dict[str, object] = {"session": self.id, "family": self.family}
        if start is not None:
            rec["start"] = round(start, 3)
        rec["turns"] = [c.record() for c in self.calls]
        return rec


@dataclass
class ImportResult:
    """What one file gave: its sessions, and what was skipped (for the one-line summary)."""

    path: str
    sessions: list[TraceSession] = field(default_factory=list)
    bad_lines: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return sum(len(s.calls) for s in self.sessions)

    @property
    def tools(self) -> int:
        return sum(s.tool_calls for s in self.sessions)

    def skip(self, what: str, n: int = 1) -> None:
        """Count ``n`` skipped items of kind ``what`` (e.g. "tool calls without an end")."""
        if n:
            self.skipped[what] = self.skipped.get(what, 0) + n

    def records(self) -> list[dict[str, object]]:
        """This file's sessions as trace records, arrivals relative to its earliest session."""
        firsts = [s.first_ts for s in self.sessions if s.first_ts is not None]
        base = min(firsts) if firsts else 0.0
        return [s.record(None if s.first_ts is None else s.first_ts - base) for s in self.sessions]

    def summary(self) -> str:
        """``N sessions, T turns, K tools`` plus what was skipped, on one line."""
        n = len(self.sessions)
        text = f"{n} session{'' if n == 1 else 's'}, {self.turns} turns, {self.tools} tools"
        extra = [f"{v} {k} skipped" for k, v in self.skipped.items()]
        if self.bad_lines:
            extra.append(f"{self.bad_lines} bad lines skipped ({'; '.join(self.notes)})")
        return text + ("; " + ", ".join(extra) if extra else "")

    def require_turns(self, hint: str) -> ImportResult:
        """Fail when no usable turn was found (``hint`` says what was expected)."""
        if self.turns:
            return self
        why = f"no usable turn ({hint})"
        if self.skipped:
            why += "; skipped: " + ", ".join(f"{v} {k}" for k, v in self.skipped.items())
        if self.bad_lines:
            why += f"; {self.bad_lines} bad lines, first: {self.notes[0]}"
        raise TraceImportError(self.path, why)


class LineErrors:
    """Counts bad JSONL lines of one file and keeps the first few reasons."""

    def __init__(self, result: ImportResult) -> None:
        self.result = result

    def add(self, lineno: int, reason: str) -> None:
        self.result.bad_lines += 1
        if len(self.result.notes) < _NOTE_LIMIT:
            self.result.notes.append(f"line {lineno}: {reason}")


# -- reading -------------------------------------------------------------------------------------


def read_text(path: str) -> str:
    """The file's text, or a :class:`TraceImportError` saying why it cannot be read."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except UnicodeDecodeError as exc:
        raise TraceImportError(path, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise TraceImportError(path, f"cannot read: {exc.strerror or exc}") from None


def iter_jsonl(text: str, errors: LineErrors) -> Iterator[tuple[int, Mapping[str, object]]]:
    """``(line number, object)`` for every line that is a JSON object; others are counted."""
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.add(lineno, f"invalid JSON ({exc.msg}, column {exc.colno})")
            continue
        if not isinstance(doc, Mapping):
            errors.add(lineno, f"not a JSON object ({type(doc).__name__})")
            continue
        yield lineno, doc


def session_stem(path: str, suffixes: tuple[str, ...]) -> str:
    """The file name without directory and without the first matching suffix."""
    name = Path(path).name
    for suffix in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


# -- values --------------------------------------------------------------------------------------


def count(value: object, where: str) -> int | None:
    """A token count: None when absent, else a non-negative integer (integral floats accepted,
    as JavaScript writers produce them)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRecord(f"{where}: must be a non-negative integer, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise BadRecord(f"{where}: must be a non-negative integer, got {value!r}")
    if value < 0:
        raise BadRecord(f"{where}: must be a non-negative integer, got {value!r}")
    return int(value)


def seconds(value: object, where: str, *, scale: float = 1.0) -> float | None:
    """An epoch timestamp in seconds (``scale=1e-3`` for epoch milliseconds), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRecord(f"{where}: must be a number, got {value!r}")
    if value < 0:
        raise BadRecord(f"{where}: must be >= 0, got {value!r}")
    return float(value) * scale


def epoch_from_iso(value: object, where: str) -> float:
    """An ISO 8601 timestamp (``2025-05-26T07:27:40.079Z``) in epoch seconds."""
    if not isinstance(value, str):
        raise BadRecord(f"{where}: must be an ISO 8601 string, got {value!r}")
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise BadRecord(f"{where}: not an ISO 8601 timestamp: {value!r}") from None
    if dt.tzinfo is None:
        raise BadRecord(f"{where}: timestamp without a time zone: {value!r}")
    return dt.timestamp()


def _sub(doc: Mapping[str, object], key: str) -> Mapping[str, object] | None:
    v = doc.get(key)
    return v if isinstance(v, Mapping) else None


def usage_tokens(usage: Mapping[str, object], where: str) -> tuple[int, int, int | None]:
    """``(prompt, completion, cached)`` from one call's usage object, in any of three shapes.

    * OpenAI chat completions (and LiteLLM's ``ModelResponse.usage``, which mini-swe-agent
      stores): ``prompt_tokens`` (the whole prompt), ``completion_tokens``,
      ``prompt_tokens_details.cached_tokens``; LiteLLM also copies Anthropic's
      ``cache_read_input_tokens`` there.
    * OpenAI Responses API: ``input_tokens`` (the whole prompt), ``output_tokens``,
      ``input_tokens_details.cached_tokens``.
    * Anthropic Messages API (Claude Code's ``message.usage``): ``input_tokens`` counts only the
      uncached part; the whole prompt is ``input_tokens + cache_read_input_tokens +
      cache_creation_input_tokens`` (Anthropic's prompt-caching docs); cached =
      ``cache_read_input_tokens``.
    """
    cache_read = count(usage.get("cache_read_input_tokens"), f"{where}.cache_read_input_tokens")
    cache_write = count(
        usage.get("cache_creation_input_tokens"), f"{where}.cache_creation_input_tokens"
    )
    if "prompt_tokens" in usage:
        prompt = count(usage.get("prompt_tokens"), f"{where}.prompt_tokens")
        out = count(usage.get("completion_tokens"), f"{where}.completion_tokens")
        details = _sub(usage, "prompt_tokens_details")
        cached = None
        if details is not None:
            cached = count(details.get("cached_tokens"), f"{where}.prompt_tokens_details")
        cached = cached if cached is not None else cache_read
    else:
        prompt = count(usage.get("input_tokens"), f"{where}.input_tokens")
        out = count(usage.get("output_tokens"), f"{where}.output_tokens")
        details = _sub(usage, "input_tokens_details")
        if cache_read is not None or cache_write is not None:  # Anthropic: input is uncached
            prompt = (prompt or 0) + (cache_read or 0) + (cache_write or 0)
            cached = cache_read
        else:
            cached = None
            if details is not None:
                cached = count(details.get("cached_tokens"), f"{where}.input_tokens_details")
    if prompt is None or out is None:
        raise BadRecord(f"{where}: no prompt/completion token counts ({sorted(usage)})")
    return prompt, out, cached
