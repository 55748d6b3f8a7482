"""Session continuation by content: a request that names no session joins the one it extends (pure).

Many clients name no session (the ``openai`` SDK by default, LiteLLM- and LangChain-based
agents, SWE-agent, replay clients), but every turn of an agent re-sends its conversation: the
messages of the previous request, the answer the gateway returned, and what came after. The
gateway remembers, per live session, one *tip*: the hash chain of its last request's messages
followed by the answer it returned (streamed or not). A request with no explicit id joins the
session whose tip is the longest prefix of its own chain.

**Items.** A conversation is a list of ``(kind, text)`` items, read alike from OpenAI chat
``messages``, Anthropic ``system`` + ``messages`` and Responses ``instructions`` + ``input``
(:func:`chat_items`, :func:`anthropic_items`, :func:`responses_items`) and from the answers
(:func:`answer_items`): ``system``, ``user``, ``assistant`` (text), ``call`` (a tool call:
name and arguments), ``result`` (a tool result's text). Text is stripped; ids (tool-call ids,
message ids), images, reasoning and metadata are left out, since clients re-send them
differently (or not at all) while the words and calls are the conversation. A call's
arguments are compared as JSON with sorted keys when they parse.

**Chain.** ``h[0] = H(tenant)``, ``h[i] = BLAKE2b-128(h[i-1] || kind || 0 || text)``: each
position names the whole conversation up to it, so two chains meet at position ``i`` exactly
when their first ``i`` items are equal, and a tenant's chains never meet another's.

**Matching.** :meth:`Continuations.claim` looks up the request's chain positions from the
longest down, among the tips of live sessions (one dict lookup each), and takes the first
found. So:

* a request that extends session S's last request + answer joins S;
* two sessions with the same first turns (forks, retries, parallel samples) have different
  tips once their answers differ, and each continuation joins its own;
* a request that matches only a prefix shared by several sessions (not any session's whole
  last turn: a fork from an earlier turn, or an edited history) starts a new session. Its
  cache credit still starts from the shared prefix: its first response reports the block keys
  of its prompt's token ids, and the KV index and the shared-prefix registry match keys by
  content (a key is a hash chain of token blocks, ``shared.core.blockkeys``), so the blocks the
  other session left on a node are credited to the fork there;
* sessions whose tips are equal (parallel samples that got the same answer) are queued under
  that tip: each continuation takes the oldest, so N samples that continue stay N sessions.

**Claims and retries.** A claimed tip is taken out while its request runs, and the session
gets its new tip when the answer is complete (:meth:`Continuations.answered`). A request that
fails or whose client leaves before a complete answer gives the tip back
(:meth:`Continuations.release`), so the client's retry joins the same session. A retry of a
request that is still running, or one identical to another request with no answer yet, finds
no tip and starts a new session: the gateway cannot tell a retry from a parallel sample with
the same messages, and splitting one session in two costs only the second one's start (its
credit comes by content, as for a fork; the abandoned one ends by the idle timeout), where
merging two concurrent conversations into one session would break TAO's model of a session
as one sequence of turns.

**Bounds.** At most ``max_sessions`` sessions per tenant, the least recently used dropped
first; a session's tip lives ``ttl_s`` after its last use (TAO's idle timeout: the session is
ended by then) and is dropped at once when the session ends (:meth:`Continuations.forget`).
Each session costs one 16-byte digest and a few dict slots, well under 1 KB.

Explicit ids always win: the gateway asks this only when nothing named the session
(:mod:`.requests`, "Session identity").
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, Final

import orjson

__all__ = [
    "DEFAULT_MAX_SESSIONS",
    "Continuations",
    "Item",
    "ResponseIds",
    "answer_items",
    "anthropic_items",
    "chain",
    "chat_items",
    "responses_items",
    "root",
]

DEFAULT_MAX_SESSIONS: Final = 100_000
"""Sessions remembered per tenant (about 10 MB at most)."""
_DIGEST: Final = 16

Item = tuple[str, str]
"""``(kind, text)``: kind ``system``, ``user``, ``assistant``, ``call`` or ``result``."""


def _text(content: object) -> str:
    """The text of a content value: a string, or the text parts of a list, joined by lines."""
    if isinstance(content, str):
        return content.strip()
    if not isinstance(content, list):
        return ""
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, dict):
            text = part.get("text")
            if isinstance(text, str) and part.get("type") in (
                None,
                "text",
                "input_text",
                "output_text",
            ):
                parts.append(text)
    return "\n".join(p.strip() for p in parts if p.strip())


def _arguments(value: object) -> str:
    """Tool-call arguments in one spelling: JSON with sorted keys when they parse."""
    if isinstance(value, str):
        text = value
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text.strip()
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return ""


def _call(name: object, arguments: object) -> Item:
    return ("call", f"{name if isinstance(name, str) else ''}\x00{_arguments(arguments)}")


_ROLES: Final = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
}


def _chat_message(message: object) -> Iterator[Item]:
    if not isinstance(message, dict):
        return
    role = message.get("role")
    text = _text(message.get("content"))
    if role == "tool" or role == "function":
        yield ("result", text)
        return
    kind = _ROLES.get(role) if isinstance(role, str) else None
    if kind is None:
        return
    if text:
        yield (kind, text)
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            yield _call(fn.get("name"), fn.get("arguments"))


def chat_items(body: Mapping[str, Any]) -> list[Item]:
    """The items of an OpenAI chat request's ``messages``."""
    messages = body.get("messages")
    return [i for m in (messages if isinstance(messages, list) else ()) for i in _chat_message(m)]


def _anthropic_blocks(role: str, content: object) -> Iterator[Item]:
    kind = _ROLES.get(role)
    if isinstance(content, str):
        if kind and content.strip():
            yield (kind, content.strip())
        return
    texts: list[str] = []
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        btype = block.get("type")
        if btype == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            continue
        if texts and kind:  # a run of text blocks is one item, as chat's content parts are
            yield (kind, "\n".join(t.strip() for t in texts if t.strip()))
            texts = []
        if btype == "tool_use":
            yield _call(block.get("name"), block.get("input", {}))
        elif btype == "tool_result":
            yield ("result", _text(block.get("content")))
    if texts and kind:
        joined = "\n".join(t.strip() for t in texts if t.strip())
        if joined:
            yield (kind, joined)


def anthropic_items(body: Mapping[str, Any]) -> list[Item]:
    """The items of an Anthropic Messages request: ``system``, then ``messages``."""
    out: list[Item] = []
    system = body.get("system")
    text = _text(system)
    if text:
        out.append(("system", text))
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        if isinstance(message, dict) and isinstance(message.get("role"), str):
            out.extend(_anthropic_blocks(message["role"], message.get("content")))
    return out


def _responses_item(item: object) -> Iterator[Item]:
    if isinstance(item, str):
        if item.strip():
            yield ("user", item.strip())
        return
    if not isinstance(item, dict):
        return
    itype = item.get("type")
    if itype in (None, "message"):
        role = item.get("role")
        kind = _ROLES.get(role) if isinstance(role, str) else None
        text = _text(item.get("content"))
        if kind and text:
            yield (kind, text)
    elif itype == "function_call":
        yield _call(item.get("name"), item.get("arguments"))
    elif itype == "function_call_output":
        output = item.get("output")
        yield ("result", _text(output) if not isinstance(output, str) else output.strip())
    elif itype in ("local_shell_call", "custom_tool_call"):
        yield _call(item.get("name") or itype, item.get("action") or item.get("input"))
    elif itype in ("local_shell_call_output", "custom_tool_call_output"):
        output = item.get("output")
        yield ("result", output.strip() if isinstance(output, str) else _text(output))


def responses_items(body: Mapping[str, Any]) -> list[Item]:
    """The items of a Responses request: ``instructions``, then ``input`` (a string is one
    user message); reasoning items are left out."""
    out: list[Item] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions.strip():
        out.append(("system", instructions.strip()))
    raw = body.get("input")
    for item in [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else ():
        out.extend(_responses_item(item))
    return out


def answer_items(text: str, calls: Iterable[tuple[str, str]]) -> list[Item]:
    """The items of an answer: its text (when any), then its tool calls ``(name, args)``."""
    out: list[Item] = [("assistant", text.strip())] if text.strip() else []
    out.extend(_call(name, args) for name, args in calls)
    return out


def root(tenant: str | None) -> bytes:
    """The chain's start for a tenant (``None``: authentication off)."""
    return blake2b(b"tao-continuation\x00" + (tenant or "").encode(), digest_size=_DIGEST).digest()


def chain(start: bytes, items: Iterable[Item]) -> list[bytes]:
    """The hash chain over ``items`` from ``start`` (module docstring); ``[i]`` names items
    ``0..i``."""
    out: list[bytes] = []
    h = start
    for kind, text in items:
        step = blake2b(h, digest_size=_DIGEST)
        step.update(kind.encode())
        step.update(b"\x00")
        step.update(text.encode("utf-8", "surrogatepass"))
        h = step.digest()
        out.append(h)
    return out


@dataclass(slots=True)
class _Entry:
    tenant: str | None
    tip: bytes | None
    """The session's last request + answer; ``None`` while a request of it runs."""
    claimed: bytes | None
    """The tip the running request took (given back if it fails)."""
    used_at: float


class Continuations:
    """The tips of live sessions that no client named, per tenant (module docstring)."""

    def __init__(self, *, ttl_s: float, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        if ttl_s <= 0 or max_sessions < 1:
            raise ValueError(
                f"ttl_s must be > 0 and max_sessions >= 1, got {ttl_s}, {max_sessions}"
            )
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._lru: dict[str | None, OrderedDict[str, _Entry]] = {}
        self._tips: dict[bytes, deque[str]] = {}
        self.dropped = 0
        """Sessions forgotten by the bounds (count or time), not by their end."""

    def __len__(self) -> int:
        return sum(len(lru) for lru in self._lru.values())

    def claim(self, tenant: str | None, hashes: Sequence[bytes], now: float) -> str | None:
        """The live session whose tip is the longest prefix of ``hashes`` (the request's
        chain), taken for the request that now runs; ``None``: a new session."""
        self._expire(tenant, now)
        tips = self._tips
        for h in reversed(hashes):
            queue = tips.get(h)
            if queue:
                session = queue.popleft()
                if not queue:
                    del tips[h]
                entry = self._lru[tenant][session]
                entry.claimed, entry.tip, entry.used_at = h, None, now
                self._lru[tenant].move_to_end(session)
                return session
        return None

    def begin(self, tenant: str | None, session: str, now: float) -> None:
        """Remember ``session``, new, with its first request running (no tip yet)."""
        self._expire(tenant, now)
        lru = self._lru.setdefault(tenant, OrderedDict())
        old = lru.pop(session, None)
        if old is not None:
            self._untip(session, old)
        lru[session] = _Entry(tenant, None, None, now)
        while len(lru) > self.max_sessions:
            gone, entry = lru.popitem(last=False)
            self._untip(gone, entry)
            self.dropped += 1

    def answered(self, session: str, tip: bytes, now: float) -> None:
        """The session's request got its whole answer: ``tip`` (request + answer) is now what
        a continuation extends."""
        entry = self._find(session)
        if entry is None:
            return
        self._untip(session, entry)
        entry.tip, entry.claimed, entry.used_at = tip, None, now
        self._tips.setdefault(tip, deque()).append(session)

    def release(self, session: str, now: float) -> None:
        """The session's request ended without a whole answer: give back the tip it took (a
        retry joins the session again)."""
        entry = self._find(session)
        if entry is None or entry.tip is not None or entry.claimed is None:
            return
        entry.tip, entry.claimed, entry.used_at = entry.claimed, None, now
        self._tips.setdefault(entry.tip, deque()).append(session)

    def forget(self, session: str) -> None:
        """The session ended: forget it."""
        for lru in self._lru.values():
            entry = lru.pop(session, None)
            if entry is not None:
                self._untip(session, entry)
                return

    def _find(self, session: str) -> _Entry | None:
        for lru in self._lru.values():
            entry = lru.get(session)
            if entry is not None:
                return entry
        return None

    def _untip(self, session: str, entry: _Entry) -> None:
        if entry.tip is None:
            return
        queue = self._tips.get(entry.tip)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(session)
            if not queue:
                del self._tips[entry.tip]

    def _expire(self, tenant: str | None, now: float) -> None:
        lru = self._lru.get(tenant)
        if not lru:
            return
        cutoff = now - self.ttl_s
        while lru:
            session, entry = next(iter(lru.items()))
            if entry.used_at > cutoff:
                return
            del lru[session]
            self._untip(session, entry)
            self.dropped += 1


class ResponseIds:
    """The Responses ids (``resp_…``) the gateway served, per tenant, to the client's id of
    the session that got each: a later request's ``previous_response_id`` names its session.
    At most ``max_ids`` ids, the oldest dropped first; an id lives ``ttl_s``."""

    def __init__(self, *, ttl_s: float, max_ids: int = DEFAULT_MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.max_ids = max_ids
        self._ids: OrderedDict[tuple[str | None, str], tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def served(self, tenant: str | None, response_id: str, session: str, now: float) -> None:
        """``response_id`` was the answer to a request of the client's ``session``."""
        key = (tenant, response_id)
        self._ids.pop(key, None)
        self._ids[key] = (session, now)
        while len(self._ids) > self.max_ids:
            self._ids.popitem(last=False)

    def session(self, tenant: str | None, response_id: str, now: float) -> str | None:
        """The client's session id of a served ``response_id``; ``None`` if unknown or old."""
        found = self._ids.get((tenant, response_id))
        if found is None:
            return None
        if found[1] <= now - self.ttl_s:
            del self._ids[(tenant, response_id)]
            return None
        return found[0]
