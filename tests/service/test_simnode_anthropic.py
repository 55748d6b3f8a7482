"""The sim node's reading of Anthropic Messages requests (``services.simnode.anthropic``)."""

from __future__ import annotations

from typing import Any

import pytest

from services.simnode import anthropic as anth
from services.simnode.tokenizer import TemplateError


def test_mid_conversation_system_message_becomes_a_system_chat_message() -> None:
    # The shape Claude Code 2.1.197 sends (beta mid-conversation-system-2026-04-07).
    body: dict[str, Any] = {
        "system": [{"type": "text", "text": "You are Claude Code."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Wait one second."}]},
            {"role": "system", "content": "Available agent types: claude, Explore."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {"a": 1}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    }
    assert [(m["role"], m.get("content")) for m in anth.chat_messages(body)] == [
        ("system", "You are Claude Code."),
        ("user", "Wait one second."),
        ("system", "Available agent types: claude, Explore."),
        ("assistant", ""),
        ("tool", ""),
    ]


@pytest.mark.parametrize(
    ("message", "match"),
    [
        ({"role": "tool", "content": "x"}, r"messages\[0\]: must be an object with role"),
        ({"role": "system", "content": 3}, r"messages\[0\]\.content: must be a string or"),
    ],
)
def test_unreadable_messages_are_named(message: dict[str, Any], match: str) -> None:
    with pytest.raises(TemplateError, match=match):
        anth.chat_messages({"messages": [message]})
