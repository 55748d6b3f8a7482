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
    conversation,
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


SYS, U1, U2 = ("system", "be careful"), ("user", "fix the bug"), ("user", "and the test")


def asked(c: Continuations, items: list[tuple[str, str]], now: float = 2.0) -> str | None:
    conv = conversation(None, items)
    assert conv is not None
    return c.claim(None, conv.exact, now, conv.loose)


def served(c: Continuations, session: str, request: list[tuple[str, str]], answer: str) -> None:
    """``session`` was asked ``request`` and answered ``answer`` (text and one call)."""
    conv = conversation(None, request)
    assert conv is not None
    c.begin(None, session, 0.0)
    c.answered(session, conv.tip([("assistant", answer), ("call", "sh\x00{}")]), 1.0)


class TestLooseContinuation:
    """A request that re-sends its own history (any assistant text, any calls) joins the only
    live session it extends when that session has no request running; forks and parallel
    samples never merge, and a client that re-sent the served answer joins its own fork."""

    def test_a_replayed_history_joins_its_session(self) -> None:
        c = Continuations(ttl_s=100)
        served(c, "s1", [SYS, U1], "served text")
        replay = [SYS, U1, ("assistant", "trace text"), ("result", "ok"), U2]
        assert asked(c, replay) == "s1"

    def test_a_fork_starts_its_own_session(self) -> None:
        """Two sessions whose last requests share the prefix: a replayed continuation fits
        both, so it joins neither; re-sending one's served answer still joins that one."""
        c = Continuations(ttl_s=100)
        served(c, "s1", [SYS, U1], "one")
        served(c, "s2", [SYS, U1], "two")
        assert asked(c, [SYS, U1, ("assistant", "trace"), U2]) is None
        exact = [SYS, U1, ("assistant", "two"), ("call", "sh\x00{}"), U2]
        assert asked(c, exact) == "s2"

    def test_parallel_samples_do_not_merge(self) -> None:
        """Two requests at once extending one session: the first joins, the second finds the
        session running and starts its own (exactly and loosely alike)."""
        c = Continuations(ttl_s=100)
        served(c, "s1", [SYS, U1], "one")
        sample = [SYS, U1, ("assistant", "trace"), U2]
        assert asked(c, sample) == "s1"
        assert asked(c, sample) is None
        served(c, "s2", [SYS, U2], "two")
        exact = [SYS, U2, ("assistant", "two"), ("call", "sh\x00{}"), U1]
        assert asked(c, exact) == "s2" and asked(c, exact) is None

    def test_running_session_blocks_a_shorter_match(self) -> None:
        """A request extending a running session never falls back to an older session whose
        tip is a shorter prefix (a split left behind)."""
        c = Continuations(ttl_s=100)
        served(c, "old", [SYS, U1], "a")
        served(c, "live", [SYS, U1, ("assistant", "a"), U2], "b")
        later = [SYS, U1, ("assistant", "x"), U2, ("assistant", "y"), ("user", "3")]
        assert asked(c, later) == "live"
        assert asked(c, later) is None

    def test_total_bound_over_tenants(self) -> None:
        c = Continuations(ttl_s=100, max_sessions=10, max_total=15)
        c.begin("quiet", "q", 0)
        for n in range(100):
            c.begin(f"flood{n % 2}", f"f{n}", 0)
        assert len(c) == 15 and c.dropped == 86
        c.answered("q", chain(root("quiet"), [U1])[-1], 1)
        assert c.claim("quiet", chain(root("quiet"), [U1, U2]), 2) == "q"
