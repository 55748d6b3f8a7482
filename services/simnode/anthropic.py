"""The sim node's Anthropic Messages API (``POST /v1/messages``): request and answer shapes.

Like vLLM (vllm/entrypoints/anthropic/serving.py), the node turns the Anthropic request into
chat messages and runs it as a chat completion: ``system`` (a string or text blocks) becomes a
system message, and so does a ``role: "system"`` entry of ``messages`` (Claude Code 2.1.197
sends one, with the beta ``mid-conversation-system-2026-04-07``: tests/harness); a message's
text blocks its content; ``tool_use`` blocks the assistant's ``tool_calls`` (arguments = the
``input`` object as compact JSON, key order kept, as the node writes a scripted call's
arguments); each ``tool_result`` block a ``tool`` message, placed
before the rest of its user message; image and thinking blocks are ignored. So the ids of
turn N's prompt and output are a token prefix of turn N+1's prompt, as for chat.

The answer follows Anthropic's format with vLLM's usage (since vllm-project/vllm PR #40912):
``input_tokens`` = prompt − cached, ``cache_read_input_tokens`` = cached,
``cache_creation_input_tokens`` = 0. Finish reasons map ``stop`` → ``end_turn``, ``length`` →
``max_tokens``, ``tool_calls`` → ``tool_use``.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any, Final

from services.simnode.tokenizer import TemplateError
from shared.core.engine import Completion

__all__ = ["arguments_text", "chat_messages", "stop_reason", "tool_input", "tool_use_id", "usage"]

_STOP: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def arguments_text(value: object) -> str:
    """A tool call's arguments as the node writes them: compact JSON in the given key order."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _text_of(blocks: object, where: str) -> str:
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise TemplateError(f"{where}: must be a string or a list of blocks")
    texts = []
    for k, block in enumerate(blocks):
        if not isinstance(block, Mapping):
            raise TemplateError(f"{where}[{k}]: must be an object")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
    return "\n".join(texts)


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Messages request (module docstring); :class:`TemplateError`
    names the message or block that cannot be read."""
    out: list[dict[str, Any]] = []
    system = _text_of(body.get("system"), "system")
    if system:
        out.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise TemplateError("messages: required non-empty list")
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, Mapping) or msg.get("role") not in ("user", "assistant", "system"):
            raise TemplateError(
                f"{where}: must be an object with role 'user', 'assistant' or 'system'"
            )
        content = msg.get("content")
        if msg["role"] == "system":  # Claude Code's mid-conversation system message
            out.append({"role": "system", "content": _text_of(content, f"{where}.content")})
            continue
        if isinstance(content, str):
            out.append({"role": msg["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise TemplateError(f"{where}.content: must be a string or a list of blocks")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for k, block in enumerate(content):
            if not isinstance(block, Mapping):
                raise TemplateError(f"{where}.content[{k}]: must be an object")
            kind = block.get("type")
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "tool_use":
                if not isinstance(block.get("name"), str):
                    raise TemplateError(f"{where}.content[{k}]: tool_use needs a string name")
                args = arguments_text(block.get("input", {}))
                fn = {"name": block["name"], "arguments": args}
                calls.append({"id": block.get("id"), "type": "function", "function": fn})
            elif kind == "tool_result":
                result = _text_of(block.get("content"), f"{where}.content[{k}].content")
                out.append({"role": "tool", "content": result})
        if texts or calls:
            entry: dict[str, Any] = {"role": msg["role"], "content": "\n".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            out.append(entry)
    return out


def stop_reason(finish_reason: str) -> str:
    """Anthropic's ``stop_reason`` for the node's finish reason."""
    return _STOP.get(finish_reason, "end_turn")


def tool_use_id(request_id: str) -> str:
    """The id of the tool call a request made."""
    return f"toolu_{zlib.crc32(request_id.encode()):08x}"


def tool_input(arguments: str | None) -> dict[str, Any]:
    """A scripted call's arguments as the ``input`` object (``{}`` unless a JSON object)."""
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def usage(c: Completion) -> dict[str, int]:
    """The ``usage`` of a finished request (module docstring)."""
    return {
        "input_tokens": c.prompt_tokens - c.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": c.cached_tokens,
        "output_tokens": c.completion_tokens,
    }
