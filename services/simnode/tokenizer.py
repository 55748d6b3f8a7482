"""Deterministic tokenizer and chat template of the sim node.

Text is split into words (``\\w+``) and single punctuation characters; whitespace is dropped (the
prompt only has to produce the same ids for the same text, not be reversible). A piece found in
the fixed word table gets that word's id; any other piece gets a stable 64-bit BLAKE2b hash of
its UTF-8 bytes folded into the hashed id range (never Python's salted ``hash`` of a str), so
ids agree across processes and machines.

Word table: id ``i < WORD_VOCAB`` is written in base 64 with one two-letter syllable per digit
(16 consonants × 4 vowels), least significant first: 0 → ``"ba"``, 65 → ``"bebe"``… The table
is a bijection, so :func:`decode` then :func:`encode` returns generated ids unchanged; engine
outputs (:data:`shared.core.engine.OUTPUT_VOCAB` = WORD_VOCAB) are always in the table.

Chat template (ChatML-like, role markers as special ids)::

    <im_start> ROLE content-ids <im_end>              one per message, in order
    <im_start> TOOLS tools-json-ids <im_end>           first, when the request has ``tools``
    <im_start> ASSISTANT                               the generation prompt

An assistant message with tool calls renders its content, then per call
``<tool_call> name-ids arguments-ids </tool_call>``; the model's scripted output for a tool
call is exactly those ids, so turn N's prompt + output is a token prefix of turn N+1's prompt.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any, Final

__all__ = [
    "ASSISTANT",
    "IM_END",
    "IM_START",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "VOCAB_SIZE",
    "WORD_VOCAB",
    "TemplateError",
    "decode",
    "encode",
    "render_messages",
    "tool_call_ids",
    "word",
]

WORD_VOCAB: Final = 32_000
VOCAB_SIZE: Final = 65_536
_SPECIAL_BASE: Final = VOCAB_SIZE - 16
IM_START: Final = _SPECIAL_BASE
IM_END: Final = _SPECIAL_BASE + 1
TOOL_CALL_START: Final = _SPECIAL_BASE + 2
TOOL_CALL_END: Final = _SPECIAL_BASE + 3
SYSTEM: Final = _SPECIAL_BASE + 4
USER: Final = _SPECIAL_BASE + 5
ASSISTANT: Final = _SPECIAL_BASE + 6
TOOL: Final = _SPECIAL_BASE + 7
TOOLS: Final = _SPECIAL_BASE + 8
_HASHED: Final = _SPECIAL_BASE - WORD_VOCAB
_ROLES: Final = {
    "system": SYSTEM,
    "developer": SYSTEM,
    "user": USER,
    "assistant": ASSISTANT,
    "tool": TOOL,
    "function": TOOL,
}
_SYLLABLES: Final = tuple(c + v for c in "bcdfghjklmnprstv" for v in "aeiou"[:4])
_PIECE: Final = re.compile(r"\w+|[^\w\s]")


class TemplateError(ValueError):
    """A chat message that cannot be rendered (names the message index and the problem)."""


def word(i: int) -> str:
    """The table word of id ``i`` (0 ≤ i < WORD_VOCAB)."""
    parts = []
    while True:
        i, digit = divmod(i, 64)
        parts.append(_SYLLABLES[digit])
        if i == 0:
            return "".join(parts)


_WORDS: Final = tuple(word(i) for i in range(WORD_VOCAB))
_WORD_IDS: Final = {w: i for i, w in enumerate(_WORDS)}


@lru_cache(maxsize=1 << 16)
def _piece_id(piece: str) -> int:
    known = _WORD_IDS.get(piece)
    if known is not None:
        return known
    digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
    return WORD_VOCAB + int.from_bytes(digest, "big") % _HASHED


def encode(text: str) -> list[int]:
    """Token ids of ``text``."""
    return [_piece_id(p) for p in _PIECE.findall(text)]


def decode(ids: Iterable[int]) -> str:
    """Text of ``ids``: table words joined by spaces; other ids render as ``<id>``."""
    return " ".join(_WORDS[i] if 0 <= i < WORD_VOCAB else f"<{i}>" for i in ids)


def tool_call_ids(name: str, arguments: str) -> list[int]:
    """The ids of one rendered tool call."""
    return [TOOL_CALL_START, *encode(name), *encode(arguments), TOOL_CALL_END]


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping):
                raise TemplateError(f"{where}.content: parts must be objects")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
        return "\n".join(texts)
    raise TemplateError(f"{where}.content: must be a string, a list of parts or null")


def _render_tool_calls(calls: Any, where: str) -> list[int]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise TemplateError(f"{where}.tool_calls: must be a list")
    out: list[int] = []
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise TemplateError(f"{where}.tool_calls[{k}]: needs function.name")
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            args = json.dumps(args, sort_keys=True, separators=(",", ":"))
        out.extend(tool_call_ids(fn["name"], args))
    return out


def render_messages(
    messages: Sequence[Any], tools: Any = None, *, add_generation_prompt: bool = True
) -> list[int]:
    """Prompt ids of an OpenAI ``messages`` list (and optional ``tools``)."""
    ids: list[int] = []
    if tools:
        ids += [IM_START, TOOLS, *encode(json.dumps(tools, sort_keys=True)), IM_END]
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping):
            raise TemplateError(f"{where}: must be an object")
        role = msg.get("role")
        if role not in _ROLES:
            raise TemplateError(f"{where}.role: must be one of {', '.join(_ROLES)}, got {role!r}")
        ids += [IM_START, _ROLES[role], *encode(_content_text(msg.get("content"), where))]
        if role == "assistant":
            ids += _render_tool_calls(msg.get("tool_calls"), where)
        ids.append(IM_END)
    if add_generation_prompt:
        ids += [IM_START, ASSISTANT]
    return ids
