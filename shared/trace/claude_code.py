"""Claude Code transcripts (``~/.claude/projects/<project>/<session>.jsonl``) → sessions.

Claude Code publishes no schema for these files; the facts below are the ones community tools
agree on and that real transcripts show (ryoppippi/ccusage ``src/data-loader.ts``;
23min/copilot-lens ``docs/research/claude-code-sessions.md``; ticpu/claude-conversation-search-mcp
``docs/jsonl-format.md``; anthropics/claude-code issue #22686):

* one JSON object per line; ``type`` ``"user"`` / ``"assistant"`` carry ``message``,
  ``timestamp`` (ISO 8601, UTC ``Z``), ``sessionId``, ``uuid``, ``parentUuid``, ``isSidechain``;
  other types (``summary``, ``system``, ``file-history-snapshot``, ``progress``,
  ``queue-operation``…) are ignored;
* ``assistant``: ``message.id``, ``message.model``, ``message.content`` (blocks; ``tool_use``
  has ``id``, ``name``, ``input``), ``message.usage`` (Anthropic Messages API:
  ``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``), and ``requestId``. **One API response is written as several
  records**, one per content block, repeating ``message.id`` / ``requestId`` and the usage;
  ``output_tokens`` may grow across them (streaming snapshots), so records are merged per
  ``(message.id, requestId)`` keeping the largest ``output_tokens`` — as ccusage de-duplicates.
  Claude Code's placeholder messages (``model == "<synthetic>"``, ``isApiErrorMessage``) are not
  model calls and are skipped;
* ``user``: a prompt (string content or text blocks), or ``tool_result`` blocks with
  ``tool_use_id``; the record-level ``toolUseResult`` holds the tool's structured result
  (``backgroundTaskId`` when a Bash command went to the background); ``isMeta`` records are
  notices, not prompts;
* subagents: records with ``isSidechain: true`` — inline in the session file (older versions) or
  in ``<session>/subagents/agent-<agentId>.jsonl`` with ``agentId`` (newer).

Mapping. A turn is one merged API response: prompt = input + cache read + cache creation,
completion = output, cached = cache read; ``response_ts`` = its last record's timestamp;
``request_ts`` = the timestamp of the user record (prompt or last tool result) before it. Each
``tool_use`` block is a call from its record's timestamp to the timestamp of the user record
holding its ``tool_result`` (a call without a result is left out and counted); Bash
``input.timeout`` (ms) is its ``tool_timeout_s``. Time a human spends before typing the next
prompt is not a tool and is not recorded.

Sessions: the main thread is one session, id = its ``sessionId`` (else the file name). Each
subagent (sidechain) becomes **its own session** — its calls are real model calls running
concurrently with the parent, whose ``Task`` tool call spans them — with id
``<sessionId>:agent-<agentId>`` (inline sidechains without ``agentId`` are told apart by their
``parentUuid`` chains: ``<sessionId>:side-<n>``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from shared.trace.model import (
    BadRecord,
    ImportResult,
    LineErrors,
    ModelCall,
    ToolCall,
    TraceSession,
    epoch_from_iso,
    iter_jsonl,
    read_text,
    seconds,
    session_stem,
    usage_tokens,
)

__all__ = ["FAMILY", "from_claude_code"]

FAMILY = "claude-code"
_SYNTHETIC_MODEL = "<synthetic>"


@dataclass
class _Use:
    id: str
    name: str
    ts: float
    timeout_s: float | None


@dataclass
class _Call:
    """One API response merged from its records."""

    prompt: int
    output: int
    cached: int | None
    request_ts: float | None
    last_ts: float
    uses: list[_Use] = field(default_factory=list)


@dataclass
class _Thread:
    """The main conversation or one subagent: its calls and tool results, in file order."""

    label: str
    session_id: str | None = None
    calls: dict[tuple[str, str], _Call] = field(default_factory=dict)
    results: dict[str, float] = field(default_factory=dict)
    background: set[str] = field(default_factory=set)
    last_user_ts: float | None = None


class _Reader:
    def __init__(self, result: ImportResult) -> None:
        self.result = result
        self.threads: dict[str, _Thread] = {}
        self.thread_of: dict[str, str] = {}  # record uuid -> thread key
        self.sidechains = 0
        self.other_types: dict[str, int] = {}

    def key(self, rec: Mapping[str, object]) -> str:
        """The record's thread: main, ``agent-<agentId>``, or its parentUuid chain's."""
        uuid, parent = rec.get("uuid"), rec.get("parentUuid")
        agent = rec.get("agentId")
        if rec.get("isSidechain") is not True:
            key = "main"
        elif isinstance(agent, str) and agent:
            key = f"agent-{agent}"
        elif isinstance(parent, str) and parent in self.thread_of:
            key = self.thread_of[parent]
        else:
            self.sidechains += 1
            key = f"side-{self.sidechains}"
        if isinstance(uuid, str):
            self.thread_of[uuid] = key
        return key

    def take(self, lineno: int, rec: Mapping[str, object]) -> None:
        key = self.key(rec)  # every record, so that parentUuid chains stay unbroken
        kind = rec.get("type")
        if kind not in ("user", "assistant"):
            label = kind if isinstance(kind, str) else "untyped"
            self.other_types[label] = self.other_types.get(label, 0) + 1
            return
        ts = epoch_from_iso(rec.get("timestamp"), "timestamp")
        message = rec.get("message")
        if not isinstance(message, Mapping):
            raise BadRecord(f"message: must be an object, got {type(message).__name__}")
        th = self.threads.setdefault(key, _Thread(key))
        sid = rec.get("sessionId")
        if th.session_id is None and isinstance(sid, str) and sid:
            th.session_id = sid
        if kind == "assistant":
            self.assistant(th, lineno, rec, message, ts)
        else:
            self.user(th, rec, message, ts)

    def assistant(
        self,
        th: _Thread,
        lineno: int,
        rec: Mapping[str, object],
        message: Mapping[str, object],
        ts: float,
    ) -> None:
        if message.get("model") == _SYNTHETIC_MODEL or rec.get("isApiErrorMessage") is True:
            self.result.skip("synthetic/API-error messages")
            return
        usage = message.get("usage")
        if not isinstance(usage, Mapping):
            raise BadRecord("message.usage: missing or not an object")
        prompt, output, cached = usage_tokens(usage, "message.usage")
        mid, rid = message.get("id"), rec.get("requestId")
        key = (
            mid if isinstance(mid, str) else f"line {lineno}",
            rid if isinstance(rid, str) else "",
        )
        call = th.calls.get(key)
        if call is None:
            call = th.calls[key] = _Call(prompt, output, cached, th.last_user_ts, ts)
        else:
            call.output = max(call.output, output)
            call.last_ts = max(call.last_ts, ts)
        content = message.get("content")
        if not isinstance(content, list):
            return
        seen = {u.id for u in call.uses}
        for j, block in enumerate(content):
            if not isinstance(block, Mapping) or block.get("type") != "tool_use":
                continue
            uid, name = block.get("id"), block.get("name")
            if not isinstance(uid, str) or not isinstance(name, str):
                raise BadRecord(f"message.content[{j}]: tool_use needs string id and name")
            if uid not in seen:
                seen.add(uid)
                call.uses.append(_Use(uid, name, ts, _timeout(block, j)))

    def user(
        self, th: _Thread, rec: Mapping[str, object], message: Mapping[str, object], ts: float
    ) -> None:
        content = message.get("content")
        results = []
        if isinstance(content, list):
            results = [
                b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_result"
            ]
        for b in results:
            uid = b.get("tool_use_id")
            if not isinstance(uid, str):
                raise BadRecord("tool_result.tool_use_id: must be a string")
            th.results.setdefault(uid, ts)  # a copied record (resumed session) keeps the first
            tur = rec.get("toolUseResult")
            if isinstance(tur, Mapping) and tur.get("backgroundTaskId"):
                th.background.add(uid)
        if results or rec.get("isMeta") is not True:
            th.last_user_ts = ts


def _timeout(block: Mapping[str, object], j: int) -> float | None:
    """Bash ``input.timeout`` in ms, as seconds."""
    args = block.get("input")
    if block.get("name") != "Bash" or not isinstance(args, Mapping):
        return None
    ms = seconds(args.get("timeout"), f"message.content[{j}].input.timeout", scale=1e-3)
    return round(ms, 3) if ms else None


def from_claude_code(path: str) -> ImportResult:
    """Import one transcript (see the module docstring); raises TraceImportError."""
    result = ImportResult(path)
    errors = LineErrors(result)
    reader = _Reader(result)
    for lineno, rec in iter_jsonl(read_text(path), errors):
        try:
            reader.take(lineno, rec)
        except BadRecord as exc:
            errors.add(lineno, str(exc))
    stem = session_stem(path, (".jsonl",))
    main = reader.threads.get("main")
    base = (main.session_id if main else None) or next(
        (t.session_id for t in reader.threads.values() if t.session_id), stem
    )
    for key, th in reader.threads.items():
        calls = _calls(th, result)
        if calls:
            sid = base if key == "main" else f"{th.session_id or base}:{key}"
            result.sessions.append(TraceSession(sid, FAMILY, tuple(calls)))
    others = ", ".join(f"{k} x{v}" for k, v in sorted(reader.other_types.items())[:4])
    return result.require_turns(
        "expected Claude Code records of type assistant with message.usage"
        + (f"; found only {others}" if others else "")
    )


def _calls(th: _Thread, result: ImportResult) -> list[ModelCall]:
    calls = []
    for c in th.calls.values():
        if c.prompt < 1:
            result.skip("responses with an empty prompt")
            continue
        tools = []
        for u in c.uses:
            end = th.results.get(u.id)
            if end is None:
                result.skip("tool calls without a result")
                continue
            tools.append(ToolCall(u.name, u.ts, end, u.timeout_s, u.id in th.background))
        calls.append(ModelCall(c.prompt, c.output, c.cached, c.request_ts, c.last_ts, tuple(tools)))
    return calls
