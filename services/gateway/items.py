"""The words of a conversation, read alike from every API the gateway serves (pure).

A conversation is a list of ``(kind, text)`` items, read alike from OpenAI chat ``messages``,
Anthropic ``system`` + ``messages`` and Responses ``instructions`` + ``input``
(:func:`chat_items`, :func:`anthropic_items`, :func:`responses_items`) and from the answers
(:func:`answer_items`): ``system``, ``user``, ``assistant`` (text), ``call`` (a tool call:
name and arguments), ``result`` (a tool result's text). Text is stripped; ids (tool-call ids,
message ids), images, reasoning and metadata are left out, since clients re-send them
differently (or not at all) while the words and calls are the conversation. A call's
arguments are compared as JSON with sorted keys when they parse.

:func:`loose_items` is the same conversation with every assistant turn (its text and calls)
one marker: what a client that re-sends its own history instead of the served answer still
has in common with the gateway's view (:mod:`.continuation`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

import orjson

__all__ = [
    "ASSISTANT_TURN",
    "Item",
    "answer_items",
    "anthropic_items",
    "chat_items",
    "loose_items",
    "responses_items",
]

Item = tuple[str, str]
"""``(kind, text)``: kind ``system``, ``user``, ``assistant``, ``call`` or ``result``."""
ASSISTANT_TURN: Final[Item] = ("assistant", "")
"""One assistant turn whatever it said (:func:`loose_items`)."""
_ASSISTANT_KINDS: Final = frozenset({"assistant", "call"})


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


def loose_items(items: Iterable[Item]) -> tuple[list[Item], bool]:
    """``items`` with each run of assistant text and calls replaced by :data:`ASSISTANT_TURN`,
    and whether the last item is such a turn (an answer then continues it)."""
    out: list[Item] = []
    open_turn = False
    for item in items:
        if item[0] in _ASSISTANT_KINDS:
            if not open_turn:
                out.append(ASSISTANT_TURN)
                open_turn = True
        else:
            out.append(item)
            open_turn = False
    return out, open_turn
