"""Session continuation by content (services.gateway.continuation): items, chains, the index."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway.continuation import (
    Continuations,
    answer_items,
    anthropic_items,
    chain,
    chat_items,
    responses_items,
    root,
)
from services.gateway.response_ids import ResponseIds

R = root(None)


class TestItems:
    def test_the_three_apis_read_one_conversation_alike(self) -> None:
        """The same turns written as chat, Anthropic Messages and Responses input give the same
        items (ids, part types and JSON spacing left out)."""
        chat: dict[str, Any] = {
            "messages": [
                {"role": "system", "content": "sys"},
                {"role": "user", "content": [{"type": "text", "text": "go"}]},
                {
                    "role": "assistant",
                    "content": "ok",
                    "tool_calls": [
                        {"id": "a", "function": {"name": "sh", "arguments": '{"b": 1, "a": 2}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "a", "content": "done"},
            ]
        }
        anthropic: dict[str, Any] = {
            "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "ok"},
                        {"type": "tool_use", "id": "t", "name": "sh", "input": {"a": 2, "b": 1}},
                    ],
                },
                {"role": "user", "content": [{"type": "tool_result", "content": "done"}]},
            ],
        }
        responses: dict[str, Any] = {
            "instructions": "sys",
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "go"}]},
                {"type": "reasoning", "summary": []},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}],
                },
                {
                    "type": "function_call",
                    "call_id": "c",
                    "name": "sh",
                    "arguments": '{"a":2,"b":1}',
                },
                {"type": "function_call_output", "call_id": "c", "output": "done"},
            ],
        }
        expected = [
            ("system", "sys"),
            ("user", "go"),
            ("assistant", "ok"),
            ("call", 'sh\x00{"a":2,"b":1}'),
            ("result", "done"),
        ]
        assert chat_items(chat) == expected
        assert anthropic_items(anthropic) == expected
        assert responses_items(responses) == expected

    def test_answer_items_are_what_the_client_echoes(self) -> None:
        """An answer's text and calls are the items of the assistant turn the client re-sends."""
        echoed = chat_items(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "ok",
                        "tool_calls": [{"function": {"name": "sh", "arguments": "{}"}}],
                    }
                ]
            }
        )
        assert answer_items("ok ", [("sh", "{ }")]) == echoed


class TestChain:
    def test_prefixes_meet_and_tenants_do_not(self) -> None:
        """Equal first items give equal hashes up to where they differ; tenants never meet."""
        a = chain(R, [("user", "x"), ("assistant", "y")])
        b = chain(R, [("user", "x"), ("assistant", "z")])
        assert a[0] == b[0] and a[1] != b[1]
        assert chain(root("t1"), [("user", "x")]) != chain(root("t2"), [("user", "x")])


def tip(*texts: str) -> list[bytes]:
    return chain(R, [("user", t) for t in texts])


class TestContinuations:
    def test_longest_tip_wins_and_is_claimed(self) -> None:
        """A request joins the session whose tip is its longest prefix; while it runs, the tip
        is taken (a second identical request finds nothing)."""
        c = Continuations(ttl_s=100)
        c.begin(None, "s1", 0)
        c.answered("s1", tip("a", "b")[-1], 1)
        c.begin(None, "s2", 0)
        c.answered("s2", tip("a")[-1], 1)
        assert c.claim(None, tip("a", "b", "c"), 2) == "s1"
        assert c.claim(None, tip("a", "x"), 2) == "s2"
        assert c.claim(None, tip("a", "b", "c"), 2) is None

    def test_release_gives_the_tip_back(self) -> None:
        c = Continuations(ttl_s=100)
        c.begin(None, "s1", 0)
        c.answered("s1", tip("a")[-1], 1)
        assert c.claim(None, tip("a", "b"), 2) == "s1"
        c.release("s1", 3)
        assert c.claim(None, tip("a", "b"), 4) == "s1"

    def test_equal_tips_are_queued(self) -> None:
        """Two sessions with the same tip: two continuations take one each, oldest first."""
        c = Continuations(ttl_s=100)
        for s in ("s1", "s2"):
            c.begin(None, s, 0)
            c.answered(s, tip("a")[-1], 1)
        got = [c.claim(None, tip("a", "b"), 2), c.claim(None, tip("a", "b"), 2)]
        assert got == ["s1", "s2"]

    @pytest.mark.parametrize(("now", "found"), [(109.9, "s1"), (110.0, None)])
    def test_ttl(self, now: float, found: str | None) -> None:
        """A tip lives ttl_s after its last use."""
        c = Continuations(ttl_s=100)
        c.begin(None, "s1", 0)
        c.answered("s1", tip("a")[-1], 10)
        assert c.claim(None, tip("a", "b"), now) == found

    def test_lru_bound_per_tenant(self) -> None:
        """Past max_sessions, a tenant's least recently used session is dropped; another
        tenant's are not."""
        c = Continuations(ttl_s=100, max_sessions=2)
        c.begin("t2", "x", 0)
        c.answered("x", chain(root("t2"), [("user", "a")])[-1], 0)
        for n, s in enumerate(("s1", "s2", "s3")):
            c.begin("t1", s, n)
            c.answered(s, chain(root("t1"), [("user", s)])[-1], n)
        assert c.claim("t1", chain(root("t1"), [("user", "s1")]), 5) is None
        assert c.claim("t1", chain(root("t1"), [("user", "s3")]), 5) == "s3"
        assert c.claim("t2", chain(root("t2"), [("user", "a")]), 5) == "x"
        assert c.dropped == 1

    def test_forget(self) -> None:
        c = Continuations(ttl_s=100)
        c.begin(None, "s1", 0)
        c.answered("s1", tip("a")[-1], 1)
        c.forget("s1")
        assert c.claim(None, tip("a", "b"), 2) is None and len(c) == 0


class TestResponseIds:
    def test_served_ids_map_per_tenant_with_ttl(self) -> None:
        ids = ResponseIds(ttl_s=10, per_tenant=2)
        ids.served("t", "r1", "s1", 0)
        assert ids.session("t", "r1", 5) == "s1"
        assert ids.session("u", "r1", 5) is None
        assert ids.session("t", "r1", 10) is None
        for n in range(3):
            ids.served("t", f"x{n}", "s", 0)
        assert len(ids) == 2 and ids.session("t", "x0", 1) is None
