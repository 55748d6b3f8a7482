"""Malformed request bodies at the gateway: a 400 naming the field, never a 500.

What a hardening probe of ``tao up`` sent: a lone surrogate in a message and deeply nested
``messages`` were answered 500, ``max_tokens: 1e400`` and ``"stream": "yes"`` were forwarded.
Every body-taking model endpoint (chat, completions, Messages, and the same endpoints of a
gateway over several domains) decodes its body in one place
(:func:`services.gateway.requests.read_body`); checked here through HTTP for each class:
invalid Unicode (lone surrogate escapes, bytes that are not UTF-8), nesting deeper than
:data:`~services.gateway.requests.MAX_BODY_DEPTH`, numbers that are not finite (``1e400``,
``NaN``, ``Infinity``), and wrong types of the fields the gateway reads. Each is answered 400
in the endpoint's own error format, its message names the field, nothing is published and
nothing reaches a node. So is a session, parent or harness header that is not UTF-8 (a 500
before). ``POST /hooks`` forwards its body unparsed (the tools service maps and dead-letters
it): the same bodies are taken there (200), never a 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.app import create_domains_app
from services.gateway.requests import MAX_BODY_DEPTH
from shared.infra import FakeBus
from shared.infra.fake_store import FakeStore
from shared.infra.settings import NodeSpec
from tests.service.test_gateway_service import SETTINGS, Harness, make_harness

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
}
BASE: dict[str, dict[str, bytes]] = {
    "chat": {"model": b'"m"', "messages": b'[{"role":"user","content":"hi"}]'},
    "completions": {"model": b'"m"', "prompt": b'"hi"'},
    "messages": {
        "model": b'"m"',
        "max_tokens": b"16",
        "messages": b'[{"role":"user","content":"hi"}]',
    },
}
TEXT = {"chat": "messages[0].content", "completions": "prompt", "messages": "messages[0].content"}
"""Where each endpoint's prompt text is (the bad text goes there)."""


def raw_body(api: str, **fields: bytes) -> bytes:
    """The endpoint's minimal good body with ``fields`` set to the given raw JSON text."""
    doc = {**BASE[api], **fields}
    return b"{" + b",".join(orjson.dumps(k) + b":" + v for k, v in doc.items()) + b"}"


def with_text(api: str, raw: bytes) -> bytes:
    """The body with its prompt text replaced by the raw JSON ``raw``."""
    if api == "completions":
        return raw_body(api, prompt=raw)
    return raw_body(api, messages=b'[{"role":"user","content":' + raw + b"}]")


def nested(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


# (case, body for an endpoint, what the message names)
TEXT_CASES = [
    ("lone high surrogate", b'"\\ud800"'),
    ("lone low surrogate", b'"ok \\udc00 ok"'),
    ("high surrogate then text", b'"\\ud83dx"'),
    ("byte that is not UTF-8", b'"ok \xff"'),
    ("UTF-8-encoded surrogate", b'"\xed\xa0\x80"'),
    ("truncated UTF-8 sequence", b'"\xe2\x82"'),
]
FIELD_CASES = [
    ("max_tokens 1e400", {"max_tokens": b"1e400"}, "max_tokens"),
    ("max_tokens -1e400", {"max_tokens": b"-1e400"}, "max_tokens"),
    ("NaN", {"temperature": b"NaN"}, "temperature"),
    ("Infinity", {"top_p": b"Infinity"}, "top_p"),
    ("-Infinity", {"temperature": b"-Infinity"}, "temperature"),
    ("stream 'yes'", {"stream": b'"yes"'}, "'stream'"),
    ("stream 1", {"stream": b"1"}, "'stream'"),
    ("user an integer", {"user": b"5"}, "'user'"),
    ("user an object", {"user": b'{"id":"u"}'}, "'user'"),
    ("program_id a list", {"program_id": b"[1]"}, "'program_id'"),
    ("program_id a number", {"program_id": b"1.5"}, "'program_id'"),
    ("max_tokens a string", {"max_tokens": b'"10"'}, "'max_tokens'"),
    ("max_tokens a fraction", {"max_tokens": b"1.5"}, "'max_tokens'"),
    ("max_tokens a boolean", {"max_tokens": b"true"}, "'max_tokens'"),
    ("max_tokens negative", {"max_tokens": b"-3"}, "'max_tokens'"),
    ("max_tokens past int64", {"max_tokens": b"9223372036854775808"}, "'max_tokens'"),
    ("max_completion_tokens 1e30", {"max_completion_tokens": b"1e30"}, "max_completion_tokens"),
    ("stream_options a string", {"stream_options": b'"x"'}, "'stream_options'"),
    ("model a number", {"model": b"5"}, "'model'"),
    ("metadata a list", {"metadata": b"[]"}, "'metadata'"),
    ("metadata.user_id a number", {"metadata": b'{"user_id":5}'}, "'metadata.user_id'"),
    ("return_token_ids a string", {"return_token_ids": b'"yes"'}, "'return_token_ids'"),
    ("nested past the limit", {"tools": nested(MAX_BODY_DEPTH)}, "tools[0][0]"),
    ("nested past the parser", {"tools": nested(5_000)}, "tools[0][0]"),
]
WHOLE_CASES = [
    ("empty", b"", "not JSON"),
    ("a list", b"[1, 2]", "JSON object"),
    ("truncated", b'{"model": "m", "messages": [', "not JSON"),
    ("a trailing comma", b'{"model": "m", "messages": [1,]}', "trailing comma"),
    ("a surrogate in a key", b'{"\\ud800": 1}', "surrogate"),
]


def all_cases() -> list[Any]:
    out = []
    for api in PATHS:
        for name, raw in TEXT_CASES:
            out.append(pytest.param(api, with_text(api, raw), TEXT[api], id=f"{api}-{name}"))
        deep = {"completions": "prompt"}.get(api, "messages")
        for levels in (MAX_BODY_DEPTH, 5_000):
            body = raw_body(api, **{deep: nested(levels)})
            out.append(pytest.param(api, body, f"{deep}[0][0]", id=f"{api}-{deep} {levels} deep"))
        for name, fields, needle in FIELD_CASES:
            out.append(pytest.param(api, raw_body(api, **fields), needle, id=f"{api}-{name}"))
        for name, body, needle in WHOLE_CASES:
            out.append(pytest.param(api, body, needle, id=f"{api}-{name}"))
    return out


def error_message(api: str, answer: dict[str, Any]) -> str:
    """The message of an error answer, checked to be in the endpoint's format."""
    if api == "messages":
        assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    else:
        assert answer["error"]["type"] == "invalid_request_error"
    message = answer["error"]["message"]
    assert isinstance(message, str)
    return message


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS):
        yield harness


class TestOneDomain:
    @pytest.mark.parametrize(("api", "body", "needle"), all_cases())
    async def test_refused_with_400_naming_the_field(
        self, h: Harness, api: str, body: bytes, needle: str
    ) -> None:
        resp = await h.client.post(
            PATHS[api],
            data=body,
            headers={"X-Session-ID": "s1", "Content-Type": "application/json"},
        )
        assert resp.status == 400, await resp.text()
        message = error_message(api, orjson.loads(await resp.read()))
        assert needle in message, message
        assert h.bus.published == [] and h.node.bodies == []
        text = await (await h.client.get("/metrics")).text()
        assert f'tao_gateway_requests_total{{endpoint="{api}",outcome="bad_request"}} 1' in text

    async def test_the_deepest_body_allowed_is_forwarded(self, h: Harness) -> None:
        """Nesting up to the limit is served unchanged; one level more is refused."""
        await h.place("admit", "s1", 1)
        session = {"X-Session-ID": "s1"}
        tools = nested(MAX_BODY_DEPTH - 1)  # the body is level 1
        resp = await h.client.post(
            PATHS["chat"], data=raw_body("chat", tools=tools), headers=session
        )
        assert resp.status == 200, await resp.text()
        assert orjson.dumps(h.node.bodies[-1]["tools"]) == tools
        deeper = raw_body("chat", tools=nested(MAX_BODY_DEPTH))
        resp = await h.client.post(PATHS["chat"], data=deeper, headers=session)
        assert resp.status == 400

    async def test_null_fields_count_as_absent(self, h: Harness) -> None:
        await h.place("admit", "s1", 1)
        nulls = {k: b"null" for k in ("stream", "user", "program_id", "max_tokens", "metadata")}
        resp = await h.client.post(
            PATHS["chat"], data=raw_body("chat", **nulls), headers={"X-Session-ID": "s1"}
        )
        assert resp.status == 200, await resp.text()

    @pytest.mark.parametrize("name", ["X-Session-ID", "x-parent-session-id", "X-TAO-Harness"])
    async def test_a_header_that_is_not_utf8_is_400(self, h: Harness, name: str) -> None:
        """Session, parent and harness headers become message fields: bytes that are not
        UTF-8 there are refused, naming the header (they were a 500)."""
        url = h.client.make_url(PATHS["chat"])
        body = raw_body("chat")
        reader, writer = await asyncio.open_connection(url.host, url.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\n"
            + name.encode() + b": s1\xff\xfe\r\n"
            + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )  # fmt: skip
        await writer.drain()
        answer = await reader.read()
        writer.close()
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400"), head
        assert name in error_message("chat", orjson.loads(payload))
        assert h.bus.published == []

    @pytest.mark.parametrize(
        ("body", "named"),
        [
            (with_text("chat", b'"\\ud800"'), "lone surrogate"),
            (with_text("chat", b'"\xff"'), "not valid UTF-8"),
            (raw_body("chat", messages=nested(100_000)), "nests deeper"),
            (raw_body("chat", temperature=b"NaN"), "NaN"),
            (b"\xff\xfe{", "not valid UTF-8"),
            (b"", "empty"),
            (b'{"session_id": "s1"', "not JSON"),
            (b'[{"session_id": "s1"}]', "must be a JSON object"),
            (b'"Stop"', "must be a JSON object"),
        ],
    )
    async def test_a_malformed_hook_body_is_400_naming_what_is_wrong(
        self, h: Harness, body: bytes, named: str
    ) -> None:
        """A hook post that is no JSON object is answered 400 (never 200 or 500), the message
        names what is wrong, and nothing is forwarded."""
        resp = await h.client.post("/hooks/claude", data=body)
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["type"] == "invalid_request_error"
        assert named in error["message"] and "hook body" in error["message"]
        assert h.relay.metrics.hooks.get(result="bad_request") == 1
        await h.bus.settle()
        assert [s for s, _, _ in h.bus.published if s.startswith("tao.v1.hook")] == []


@pytest.fixture
async def domains() -> AsyncIterator[TestClient[Any, Any]]:
    settings = SETTINGS.replace(gateway_domains=("pa", "pb"))
    links = {
        d: (
            settings.replace(
                domain=d, namespace=d, nodes=(NodeSpec(f"{d}-n1", "http://127.0.0.1:9"),)
            ),
            FakeBus(d),
            FakeStore(d),
        )
        for d in ("pa", "pb")
    }
    client = TestClient(TestServer(create_domains_app(settings, links)))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()
        for _, bus, _ in links.values():
            await bus.drain()


class TestSeveralDomains:
    @pytest.mark.parametrize(
        ("api", "body", "needle"),
        [
            ("chat", with_text("chat", b'"\\ud800"'), TEXT["chat"]),
            ("messages", with_text("messages", b'"\xff"'), TEXT["messages"]),
            ("chat", raw_body("chat", messages=nested(5_000)), "messages[0][0]"),
            ("completions", raw_body("completions", max_tokens=b"1e400"), "max_tokens"),
            ("chat", raw_body("chat", stream=b'"yes"'), "'stream'"),
        ],
    )
    async def test_the_router_refuses_the_same_way(
        self, domains: TestClient[Any, Any], api: str, body: bytes, needle: str
    ) -> None:
        resp = await domains.post(PATHS[api], data=body, headers={"X-Session-ID": "s1"})
        assert resp.status == 400, await resp.text()
        assert needle in error_message(api, orjson.loads(await resp.read()))
