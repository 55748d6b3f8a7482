"""Sim node tokenizer and chat template: stable ids, round trips, prefix-preserving turns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.simnode import tokenizer as tok
from shared.core.engine import OUTPUT_VOCAB, generated_token_ids


class TestTokenizer:
    """encode/decode are deterministic and generated ids round-trip."""

    def test_word_table_is_bijective(self) -> None:
        """Every table word decodes back to its own id."""
        assert tok.WORD_VOCAB == OUTPUT_VOCAB
        ids = list(range(tok.WORD_VOCAB))
        assert tok.encode(tok.decode(ids)) == ids

    def test_generated_ids_round_trip(self) -> None:
        """Engine output ids -> text -> ids is the identity."""
        ids = list(generated_token_ids("chatcmpl-x-1", 300))
        assert tok.encode(tok.decode(ids)) == ids

    def test_unknown_pieces_hash_into_range(self) -> None:
        """Arbitrary text gets ids in the hashed range, equal for equal text."""
        ids = tok.encode("Hello, wörld! def f(x): return x_1")
        assert ids == tok.encode("Hello, wörld! def f(x): return x_1")
        assert all(tok.WORD_VOCAB <= i < tok.IM_START for i in ids)
        assert len(ids) == 12  # Hello , wörld ! def f ( x ) : return x_1

    def test_stable_across_processes(self) -> None:
        """Another interpreter with a different hash seed produces the same ids."""
        text = 'The quick brown fox; tool=bash {"cmd": "ls -la"}'
        code = (
            "import json,sys; from services.simnode import tokenizer as t;"
            "print(json.dumps(t.encode(sys.argv[1])))"
        )
        env = {**os.environ, "PYTHONHASHSEED": "12345"}
        out = subprocess.run(
            [sys.executable, "-c", code, text], env=env, capture_output=True, text=True, check=True
        )
        assert json.loads(out.stdout) == tok.encode(text)


class TestChatTemplate:
    """Rendering is deterministic and turn N's prompt + output prefixes turn N+1's prompt."""

    def test_turn_prefix_with_tool_call(self) -> None:
        """An assistant tool call and its tool result extend the previous prompt + output."""
        msgs: list[dict[str, object]] = [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "Fix the bug."},
        ]
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
        p1 = tok.render_messages(msgs, tools)
        filler = list(generated_token_ids("r1", 5))
        args = '{"cmd":"pytest -x"}'
        output = filler + tok.tool_call_ids("bash", args)
        msgs.append(
            {
                "role": "assistant",
                "content": tok.decode(filler),
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": args},
                    }
                ],
            }
        )
        msgs.append({"role": "tool", "tool_call_id": "call_1", "content": "1 failed"})
        p2 = tok.render_messages(msgs, tools)
        assert p2[: len(p1) + len(output)] == p1 + output
        assert p2[-2:] == [tok.IM_START, tok.ASSISTANT]

    def test_content_parts_and_null(self) -> None:
        """List-of-parts content renders like the joined text; null content renders empty."""
        a = tok.render_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
        b = tok.render_messages([{"role": "user", "content": "hi"}])
        assert a == b
        assert tok.render_messages([{"role": "assistant", "content": None}])[:3] == [
            tok.IM_START,
            tok.ASSISTANT,
            tok.IM_END,
        ]

    @pytest.mark.parametrize(
        ("messages", "match"),
        [
            ([{"role": "wizard", "content": "x"}], "role"),
            (["not an object"], "object"),
            ([{"role": "user", "content": 5}], "content"),
            ([{"role": "assistant", "content": "", "tool_calls": [{"function": {}}]}], "name"),
        ],
    )
    def test_bad_messages_named(self, messages: list[object], match: str) -> None:
        """A malformed message raises TemplateError naming its index and problem."""
        with pytest.raises(tok.TemplateError, match=match):
            tok.render_messages(messages)
