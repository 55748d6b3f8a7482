"""Unit tests of the gateway's request reading: session identity, upstream body, estimates."""

from __future__ import annotations

from typing import Any

import pytest

from services.gateway import requests as gw_requests
from services.gateway.requests import (
    BadRequest,
    describe_request,
    estimate_prompt_tokens,
    harness_of,
    parse_body,
    read_json,
    session_identity,
    upstream_body,
)


def new_id() -> str:
    return "generated"


class TestSessionIdentity:
    @pytest.mark.parametrize(
        ("headers", "body", "expected"),
        [
            ({"X-Session-ID": "h"}, {"user": "u", "program_id": "p"}, ("h", "header")),
            ({"X-Session-ID": "  "}, {"user": "u"}, ("u", "user")),
            ({}, {"session_id": " s ", "user": "u"}, ("s", "session_field")),
            ({}, {"session_id": " ", "user": "u"}, ("u", "user")),
            ({}, {"session_id": 7, "program_id": "p"}, ("p", "program_id")),
            ({}, {"user": "", "program_id": "p"}, ("p", "program_id")),
            ({}, {"program_id": 42}, ("42", "program_id")),
            ({}, {"user": True, "program_id": None}, ("generated", "generated")),
            ({}, {"user": {"x": 1}}, ("generated", "generated")),
            ({}, {}, ("generated", "generated")),
        ],
    )
    def test_precedence(
        self, headers: dict[str, str], body: dict[str, Any], expected: tuple[str, str]
    ) -> None:
        """Header beats the body's session_id beats user beats program_id; blank or non-scalar
        values are skipped (a non-string session_id never gets here: parse_body refuses it)."""
        assert session_identity(headers, body, new_id) == expected


class TestUpstreamBody:
    def test_strips_gateway_fields_keeps_tao_script(self) -> None:
        """program_id, session_id, conversation_id and tao_* fields go, tao_script and OpenAI
        fields stay."""
        body = {
            "model": "m",
            "user": "u",
            "program_id": "p",
            "session_id": "s",
            "conversation_id": "c",
            "tao_x": 1,
            "tao_script": [1],
        }
        assert upstream_body(body, stream=False) == {"model": "m", "user": "u", "tao_script": [1]}

    def test_stream_asks_for_usage_keeping_other_options(self) -> None:
        """A stream request gets include_usage added without losing the client's options."""
        body = {"stream": True, "stream_options": {"continuous_usage_stats": False}}
        out = upstream_body(body, stream=True)
        assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
        assert body["stream_options"] == {"continuous_usage_stats": False}  # input untouched


class TestEstimate:
    @pytest.mark.parametrize(
        ("body", "tokens"),
        [
            ({"messages": [{"role": "user", "content": "abcdefgh"}]}, 2),
            ({"messages": [{"content": [{"type": "text", "text": "abcde"}]}]}, 2),
            (
                {
                    "messages": [
                        {
                            "content": None,
                            "tool_calls": [{"function": {"name": "ab", "arguments": "cdef"}}],
                        }
                    ]
                },
                2,
            ),
            ({"prompt": "abc"}, 1),
            ({"prompt": [1, 2, 3]}, 3),
            ({"prompt": [[1, 2], [3]]}, 3),
            ({}, 0),
        ],
    )
    def test_chars_over_four(self, body: dict[str, Any], tokens: int) -> None:
        """Text counts as ceil(chars / 4); token-id prompts count exactly."""
        assert estimate_prompt_tokens(body) == tokens


class TestDescribe:
    def test_reads_request_facts(self) -> None:
        """Model, stream flag, max tokens, message count and usage wish are read."""
        body = {
            "model": "m",
            "messages": [{"content": "x"}, {"content": "y"}],
            "stream": True,
            "max_completion_tokens": 7,
            "stream_options": {"include_usage": True},
        }
        info = describe_request(body, chat=True)
        assert (info.model, info.stream, info.max_tokens, info.messages_count) == ("m", True, 7, 2)
        assert info.client_wants_usage

    @pytest.mark.parametrize(
        ("body", "chat", "needle"),
        [
            ({"model": "m"}, True, "messages"),
            ({"model": 3, "messages": []}, True, "model"),
            ({"model": "m"}, False, "prompt"),
        ],
    )
    def test_bad_bodies_name_the_field(self, body: dict[str, Any], chat: bool, needle: str) -> None:
        """An unusable body raises BadRequest naming the field."""
        with pytest.raises(BadRequest, match=needle):
            describe_request(body, chat=chat)

    @pytest.mark.parametrize("value", [7, True, ["s"], {"id": "s"}])
    def test_session_id_must_be_a_string(self, value: object) -> None:
        """The body's session_id (a session key) is a string or absent, as user is."""
        with pytest.raises(BadRequest, match="'session_id' must be a string"):
            parse_body({"session_id": value})
        assert parse_body({"session_id": None}) == {"session_id": None}

    def test_body_must_be_object(self) -> None:
        """A JSON array body is refused."""
        with pytest.raises(BadRequest, match="JSON object"):
            parse_body([1])


class TestHarnessOf:
    @pytest.mark.parametrize(
        ("headers", "expected"),
        [
            ({"X-TAO-Harness": "claude-code"}, "claude-code"),
            ({"X-TAO-Harness": "  swe-agent "}, "swe-agent"),
            ({"X-TAO-Harness": "   "}, None),
            ({}, None),
        ],
    )
    def test_header_names_the_harness(self, headers: dict[str, str], expected: str | None) -> None:
        """The harness is the stripped X-TAO-Harness header; absent or blank gives None."""
        assert harness_of(headers) == expected

    def test_overlong_harness_refused(self) -> None:
        """A harness name over 128 characters raises BadRequest naming the header."""
        assert harness_of({"X-TAO-Harness": "h" * 128}) == "h" * 128
        with pytest.raises(BadRequest, match=r"X-TAO-Harness.*got 129"):
            harness_of({"X-TAO-Harness": "h" * 129})


class TestTooManyItems:
    """Past ``max_items`` the message names where only when the path walk could find it: at a
    limit of ``_PATH_SCAN_TOKENS`` items or more the walk would stop empty, so it is not done
    (it cost 50-130 ms of GIL on a 30 MB body)."""

    @pytest.fixture
    def walks(self, monkeypatch: pytest.MonkeyPatch) -> list[int]:
        calls: list[int] = []
        real = gw_requests._path_at

        def counting(text: str, pos: int) -> list[str | int]:
            calls.append(pos)
            return real(text, pos)

        monkeypatch.setattr(gw_requests, "_path_at", counting)
        return calls

    def test_at_the_default_limit_the_walk_is_not_done_and_its_answer_was_empty(
        self, walks: list[int]
    ) -> None:
        limit = gw_requests._PATH_SCAN_TOKENS
        data = b'{"messages":[' + b",".join([b"[1]"] * (limit + 5)) + b"]}"
        with pytest.raises(BadRequest) as refused:
            read_json(data, max_items=limit)
        assert walks == [] and refused.value.message.endswith("TAO_MAX_BODY_ITEMS)")
        head = data.decode()
        assert gw_requests._path_at(head, len(head)) == []  # what the walk would have said

    def test_below_it_the_message_names_where(self, walks: list[int]) -> None:
        data = b'{"messages":[' + b",".join([b"[1]"] * 20) + b"]}"
        with pytest.raises(BadRequest, match=r"more than 10 items .* at 'messages\[\d+\]"):
            read_json(data, max_items=10)
        assert len(walks) == 1
