"""Unit tests of token ids at the gateway: reading, hiding, refusals and block keys."""

from __future__ import annotations

import tomllib
from typing import Any

import orjson
import pytest

from services.gateway.requests import upstream_body
from services.gateway.responses import StreamStats, read_body
from services.gateway.tokenids import (
    TokenIdNodes,
    block_keys_of,
    client_wants_ids,
    rejects_field,
    take_ids,
)
from shared.core.blockkeys import chain_keys
from shared.infra.nodesfile import parse_nodes, render_nodes_file


def ev(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_body(**extra: Any) -> dict[str, Any]:
    return {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop", **extra}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


class TestTakeIds:
    def test_chat_prompt_at_top_output_on_choice(self) -> None:
        """Chat: prompt ids at the top level, output ids on choice 0."""
        obj = {**chat_body(token_ids=[7, 8]), "prompt_token_ids": [1, 2, 3]}
        assert take_ids(obj) == ([1, 2, 3], [7, 8], True)
        assert obj["prompt_token_ids"] == [1, 2, 3]  # untouched without strip

    def test_completions_both_on_choice_and_choice_zero_wins(self) -> None:
        """Completions: both lists on the choice; choice 1's ids are never taken."""
        obj = {
            "choices": [
                {"index": 1, "text": "b", "prompt_token_ids": [9], "token_ids": [9]},
                {"index": 0, "text": "a", "prompt_token_ids": [1, 2], "token_ids": [5]},
            ]
        }
        assert take_ids(obj) == ([1, 2], [5], True)

    def test_strip_null_and_drop(self) -> None:
        """``null`` keeps the keys with null values (vLLM's unasked JSON); ``drop`` removes them."""
        nulled = {**chat_body(token_ids=[7]), "prompt_token_ids": [1]}
        take_ids(nulled, "null")
        assert nulled["prompt_token_ids"] is None and nulled["choices"][0]["token_ids"] is None
        dropped = {**chat_body(token_ids=[7]), "prompt_token_ids": [1]}
        take_ids(dropped, "drop")
        assert "prompt_token_ids" not in dropped and "token_ids" not in dropped["choices"][0]

    def test_null_fields_are_not_ids(self) -> None:
        """A node not asked writes ``null``: no ids, nothing found."""
        assert take_ids({**chat_body(token_ids=None), "prompt_token_ids": None}) == (
            None,
            None,
            False,
        )


class TestReadBody:
    def test_strip_rewrites_only_when_ids_present(self) -> None:
        """Stripping re-serialises a body that had ids and returns others byte for byte."""
        raw = orjson.dumps({**chat_body(token_ids=[4, 5]), "prompt_token_ids": [1, 2]})
        stats, out = read_body(raw, strip_ids=True)
        assert (stats.prompt_ids, stats.output_ids) == ([1, 2], [4, 5])
        assert orjson.loads(out)["prompt_token_ids"] is None
        assert stats.usage.total_tokens == 5
        plain = orjson.dumps(chat_body())
        assert read_body(plain, strip_ids=True)[1] is plain
        assert read_body(raw, strip_ids=False)[1] is raw


class TestStreamIds:
    def test_ids_collected_and_hidden_from_client(self) -> None:
        """Prompt ids of the first chunk and the output ids of every chunk are collected; the
        client's chunks lose them, and a chunk that carried only ids is dropped."""
        stats = StreamStats(keep_usage_chunk=False, strip_ids=True)
        role = {
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            "prompt_token_ids": [1, 2, 3],
        }
        out = stats.observe(ev(role))
        assert out is not None and b"prompt_token_ids" not in out and b"assistant" in out
        text = {"choices": [{"index": 0, "delta": {"content": "a"}, "token_ids": [10, 11]}]}
        out = stats.observe(ev(text))
        assert out == ev({"choices": [{"index": 0, "delta": {"content": "a"}}]})
        held = {"choices": [{"index": 0, "delta": {}, "finish_reason": None, "token_ids": [12]}]}
        assert stats.observe(ev(held)) is None
        last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": []}]}
        out = stats.observe(ev(last))
        assert out is not None and b"stop" in out and b"token_ids" not in out
        result = stats.result()
        assert (result.prompt_ids, result.output_ids) == ([1, 2, 3], [10, 11, 12])
        assert result.finish_reason == "stop"

    def test_client_that_asked_sees_ids_unchanged(self) -> None:
        """Without stripping every event passes byte for byte and the ids are still read."""
        stats = StreamStats(keep_usage_chunk=False)
        event = ev({"choices": [{"index": 0, "delta": {}, "token_ids": [5]}]})
        assert stats.observe(event) is event
        assert stats.result().output_ids == [5]

    def test_completions_prompt_ids_on_choice(self) -> None:
        """Completions streams carry the prompt ids on the first choice chunk."""
        stats = StreamStats(keep_usage_chunk=False, strip_ids=True)
        first = {"choices": [{"index": 0, "text": "x", "prompt_token_ids": [4], "token_ids": [9]}]}
        out = stats.observe(ev(first))
        assert out == ev({"choices": [{"index": 0, "text": "x"}]})
        assert stats.result().prompt_ids == [4] and stats.result().output_ids == [9]


class TestFieldAndRefusal:
    def test_upstream_body_asks_for_ids(self) -> None:
        """``token_ids`` adds ``return_token_ids: true``; the client's own flag is kept apart."""
        assert upstream_body({"model": "m"}, stream=False, token_ids=True)["return_token_ids"]
        assert "return_token_ids" not in upstream_body({"model": "m"}, stream=False)
        assert client_wants_ids({"return_token_ids": True})
        assert not client_wants_ids({"return_token_ids": "yes"})

    @pytest.mark.parametrize(
        ("status", "body", "refused"),
        [
            (400, b'{"message": "Unsupported parameter(s): `return_token_ids`"}', True),
            (422, b'{"detail": [{"msg": "Extra inputs are not permitted"}]}', True),
            (400, b'{"message": "max_tokens must be at least 1"}', False),
            (500, b"return_token_ids", False),
        ],
    )
    def test_refusal_detection(self, status: int, body: bytes, refused: bool) -> None:
        """Only a 400/422 naming the field or refusing extra fields counts as a refusal."""
        assert rejects_field(status, body) is refused

    def test_nodes_remember_refusals_and_config(self) -> None:
        """A refusing node and a disabled node are not asked; others are."""
        nodes = TokenIdNodes(["off"])
        assert nodes.ask("n1") and not nodes.ask("off")
        assert nodes.refused("n1") is True  # news: the caller logs it
        assert nodes.refused("n1") is False  # idempotent, and not logged again
        assert nodes.refused("off") is False and not nodes.ask("n1")


class TestBlockKeys:
    def test_keys_of_the_prompt_only(self) -> None:
        """Keys cover the full blocks of the prompt with the node's block size: the output is
        rendered again in the next prompt, so its blocks are not counted."""
        prompt = list(range(40))
        assert block_keys_of(prompt, 16) == chain_keys(prompt, 16)
        assert len(block_keys_of(prompt, 16) or []) == 2
        assert block_keys_of(list(range(15)), 16) == []

    @pytest.mark.parametrize(
        ("prompt", "block_size"),
        [
            (None, 16),
            ([1, 2], None),
            ([1, 2], 0),
            (["a", 2], 1),
            ([-1, 2], 1),
            ([2**32], 1),
        ],
    )
    def test_no_keys_without_ids_block_size_or_valid_ids(
        self, prompt: list[Any] | None, block_size: int | None
    ) -> None:
        """No prompt ids, no block size, or lists that are not uint32 ids give ``None``."""
        assert block_keys_of(prompt, block_size) is None


class TestNodesFileSwitch:
    def test_return_token_ids_read_and_written(self) -> None:
        """``return_token_ids = false`` in the nodes file reaches NodeSpec and survives a
        render/parse round trip; the default (true) is not written."""
        doc = tomllib.loads(
            '[[node]]\nid = "a"\nurl = "http://h:1"\nreturn_token_ids = false\n'
            '[[node]]\nid = "b"\nurl = "http://h:2"\n'
        )
        nodes = parse_nodes(doc)
        assert [n.return_token_ids for n in nodes] == [False, True]
        text = render_nodes_file(nodes)
        assert text.count("return_token_ids") == 1
        assert parse_nodes(tomllib.loads(text)) == nodes

    def test_non_bool_refused(self) -> None:
        """A value other than true/false is an error naming the node and key."""
        doc = {"node": [{"id": "a", "url": "http://h:1", "return_token_ids": "no"}]}
        with pytest.raises(ValueError, match="node 'a': return_token_ids must be true or false"):
            parse_nodes(doc)
