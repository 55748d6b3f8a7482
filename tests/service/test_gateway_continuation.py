"""Service tests of session continuation by content and ``previous_response_id`` at the gateway.

The real app on an in-memory bus, forwarding to the stub node of
:mod:`tests.service.test_gateway_service` (which answers "Hello", or the tool call it is
given), plus a ``/v1/responses`` route answering like vLLM's Responses endpoint.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from shared.contracts import SessionEnd, SessionRequest, SessionResponse
from tests.service.test_gateway_service import (
    SETTINGS,
    TOOL_CHUNKS,
    Harness,
    StubNode,
    make_harness,
)

SYSTEM = {"role": "system", "content": "You are a careful agent."}
FIRST = {"role": "user", "content": "fix the bug"}
HELLO = {"role": "assistant", "content": "Hello"}
_ids = itertools.count(1)


class ResponsesNode(StubNode):
    """The stub node with ``/v1/responses``: each answer is ``resp_<n>`` saying "Hello"."""

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/v1/responses", self.responses)
        return app

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        rid = f"resp_{next(_ids)}"
        usage = {
            "input_tokens": 40,
            "input_tokens_details": {"cached_tokens": 16},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 43,
        }
        text = {"type": "output_text", "text": "Hello", "annotations": []}
        message = {"type": "message", "id": "msg_1", "role": "assistant", "content": [text]}
        response = {
            "id": rid,
            "object": "response",
            "status": "completed",
            "output": [message],
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(response)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        created = {**response, "status": "in_progress", "output": [], "usage": None}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": created}),
            ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": "Hel"}),
            ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "delta": "lo"}),
            ("response.completed", {"response": response}),
        ]
        for n, (kind, data) in enumerate(events):
            payload = orjson.dumps({"type": kind, "sequence_number": n, **data})
            await resp.write(f"event: {kind}\ndata: ".encode() + payload + b"\n\n")
        return resp


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS, node=ResponsesNode()):
        yield harness


class Turns:
    """Sends turns, admitting each new session on the stub node as it registers."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.admitted: set[str] = set()

    async def send(
        self, messages: list[dict[str, Any]], *, path: str = "/v1/chat/completions", **body: Any
    ) -> tuple[str, Any]:
        """One request; its session id and its response (read)."""
        h = self.h
        seen = len(h.rec.of(SessionRequest))
        headers = body.pop("headers", None)
        payload = {"model": "m", **({"messages": messages} if messages else {}), **body}
        task = asyncio.create_task(h.client.post(path, json=payload, headers=headers))
        reqs = await h.rec.next(SessionRequest, seen + 1)
        sid = reqs[-1].session_id
        if sid not in self.admitted:
            self.admitted.add(sid)
            await h.place("admit", sid, len(self.admitted))
        resp = await task
        data = await resp.read()
        await h.relay.flush()
        return sid, (resp.status, data)


class TestContinuation:
    async def test_next_turn_joins_the_session_it_continues(self, h: Harness) -> None:
        """A request that extends a session's last request and answer joins that session, and
        a third turn joins it again; no SessionEnd is published for it."""
        t = Turns(h)
        sid, _ = await t.send([SYSTEM, FIRST])
        again, _ = await t.send([SYSTEM, FIRST, HELLO, {"role": "user", "content": "go on"}])
        third, _ = await t.send(
            [SYSTEM, FIRST, HELLO, {"role": "user", "content": "go on"}, HELLO, FIRST]
        )
        assert sid.startswith("gw-") and again == sid and third == sid
        assert h.rec.of(SessionEnd) == []

    async def test_streamed_answer_is_remembered(self, h: Harness) -> None:
        """The answer of a stream ("Hel" + "lo") is what the next turn must carry."""
        t = Turns(h)
        sid, _ = await t.send([FIRST], stream=True)
        again, _ = await t.send([FIRST, HELLO, {"role": "user", "content": "more"}])
        assert again == sid

    async def test_tool_call_and_result_continue(self, h: Harness) -> None:
        """A streamed tool call, echoed back with its result (arguments re-spaced), continues."""
        h.node.chunks = TOOL_CHUNKS
        t = Turns(h)
        sid, _ = await t.send([FIRST], stream=True)
        call = {"id": "other-id", "type": "function", "function": {"name": "bash"}}
        call["function"]["arguments"] = '{ "cmd": "ls" }'
        echoed = {"role": "assistant", "content": None, "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": "other-id", "content": "a.txt"}
        again, _ = await t.send([FIRST, echoed, result])
        assert again == sid

    async def test_a_changed_answer_joins_the_only_session_it_extends(self, h: Harness) -> None:
        """A conversation whose assistant turn differs from what the gateway answered (a replay
        client re-sending its trace's text) joins the one session it extends, its assistant
        text aside; with two such sessions (a fork) it starts its own."""
        t = Turns(h)
        sid, _ = await t.send([FIRST])
        again, _ = await t.send([FIRST, {"role": "assistant", "content": "Bye"}, FIRST])
        assert again == sid
        fork_a, _ = await t.send([SYSTEM, FIRST])
        fork_b, _ = await t.send([SYSTEM, FIRST])
        nxt = [SYSTEM, FIRST, {"role": "assistant", "content": "Bye"}, FIRST]
        third, _ = await t.send(nxt)
        assert third not in (fork_a, fork_b, sid)

    async def test_parallel_samples_with_equal_answers_stay_apart(self, h: Harness) -> None:
        """Two sessions with the same first turn and the same answer: their two continuations
        go one to each, never both to one."""
        t = Turns(h)
        a, _ = await t.send([SYSTEM, FIRST])
        b, _ = await t.send([SYSTEM, FIRST])
        assert a != b
        nxt = [SYSTEM, FIRST, HELLO, {"role": "user", "content": "next"}]
        first, _ = await t.send(nxt)
        second, _ = await t.send(nxt)
        assert {first, second} == {a, b}

    async def test_fork_from_an_earlier_turn_is_a_new_session(self, h: Harness) -> None:
        """A request extending only a prefix of a session (its first turn, not its last) starts a
        new session."""
        t = Turns(h)
        sid, _ = await t.send([FIRST])
        again, _ = await t.send([FIRST, HELLO, {"role": "user", "content": "a"}])
        fork, _ = await t.send([FIRST, HELLO, {"role": "user", "content": "b"}])
        assert again == sid and fork != sid

    async def test_explicit_id_wins(self, h: Harness) -> None:
        """A request that continues a session by content but names another keeps its name."""
        t = Turns(h)
        sid, _ = await t.send([FIRST])
        named, _ = await t.send([FIRST, HELLO, FIRST], headers={"X-SMG-Routing-Key": "mine"})
        assert named == "mine" != sid
        again, _ = await t.send([FIRST, HELLO, FIRST])  # the tip was not taken by "mine"
        assert again == sid

    async def test_failed_turn_gives_the_tip_back(self, h: Harness) -> None:
        """A continuation the node fails leaves the session continuable: the retry joins it."""
        t = Turns(h)
        sid, _ = await t.send([FIRST])
        h.node.fail_status = 500
        failed, (status, _) = await t.send([FIRST, HELLO, FIRST])
        h.node.fail_status = None
        retry, (ok, _) = await t.send([FIRST, HELLO, FIRST])
        assert (failed, status) == (sid, 500)
        assert (retry, ok) == (sid, 200)

    async def test_a_failed_first_turn_ends_its_new_session(self, h: Harness) -> None:
        """A new unnamed session whose first request fails is ended, as a one-turn one was."""
        t = Turns(h)
        h.node.fail_status = 500
        sid, _ = await t.send([FIRST])
        [end] = await h.rec.next(SessionEnd)
        assert (end.session_id, end.reason) == (sid, "error")

    async def test_an_ended_session_is_not_continued(self, h: Harness) -> None:
        """After DELETE /v1/sessions/{id} the conversation starts a new session."""
        t = Turns(h)
        sid, _ = await t.send([FIRST])
        assert (await h.client.delete(f"/v1/sessions/{sid}")).status == 200
        again, _ = await t.send([FIRST, HELLO, FIRST])
        assert again != sid


class TestResponses:
    async def test_responses_are_forwarded_and_accounted(self, h: Harness) -> None:
        """/v1/responses goes to the node's /v1/responses; its usage (cached tokens too) is
        reported, and a streamed answer arrives as the node sent it."""
        t = Turns(h)
        sid, (status, data) = await t.send(
            [], path="/v1/responses", input="fix the bug", headers={"X-Session-ID": "r1"}
        )
        assert (sid, status) == ("r1", 200)
        assert orjson.loads(data)["output"][0]["content"][0]["text"] == "Hello"
        [resp] = await h.rec.next(SessionResponse)
        assert (resp.usage.prompt_tokens, resp.usage.cached_tokens) == (40, 16)
        assert resp.finish_reason == "stop"
        _, (status, streamed) = await t.send(
            [], path="/v1/responses", input="x", stream=True, headers={"X-Session-ID": "r1"}
        )
        assert status == 200 and b"event: response.completed" in streamed
        done = await h.rec.next(SessionResponse, 2)
        assert done[-1].error is None and done[-1].ttft_s is not None

    async def test_previous_response_id_names_the_session(self, h: Harness) -> None:
        """A request whose previous_response_id is a response the gateway served joins that
        response's session; an unknown one names nothing."""
        t = Turns(h)
        sid, (_, data) = await t.send([], path="/v1/responses", input="a", user="u1")
        rid = orjson.loads(data)["id"]
        chained, _ = await t.send([], path="/v1/responses", input="b", previous_response_id=rid)
        assert sid == "u1" and chained == "u1"
        other, _ = await t.send(
            [], path="/v1/responses", input="c", previous_response_id="resp_unknown"
        )
        assert other != "u1"

    async def test_responses_input_continues_by_content(self, h: Harness) -> None:
        """A Responses request that re-sends the conversation (instructions, input, the answer
        as an output_text message) continues the session, as chat does."""
        t = Turns(h)
        sid, _ = await t.send([], path="/v1/responses", instructions="sys", input="fix")
        answer = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello"}],
        }
        again, _ = await t.send(
            [],
            path="/v1/responses",
            instructions="sys",
            input=[{"role": "user", "content": "fix"}, answer, {"role": "user", "content": "go"}],
        )
        assert again == sid

    @pytest.mark.parametrize(
        ("body", "named"),
        [
            ({}, "'input' is required"),
            ({"input": 3}, "'input' must be a string or a list"),
            ({"input": [1]}, "'input[0]' must be an object"),
            ({"input": [{"role": "user", "content": 2}]}, "'input[0].content'"),
            ({"input": "x", "max_output_tokens": 0}, "'max_output_tokens'"),
            ({"input": "x", "previous_response_id": 5}, "'previous_response_id'"),
        ],
    )
    async def test_bad_bodies_are_400_naming_the_field(
        self, h: Harness, body: dict[str, Any], named: str
    ) -> None:
        """A Responses body the gateway cannot serve is answered 400, naming the field."""
        resp = await h.client.post("/v1/responses", json={"model": "m", **body})
        assert resp.status == 400
        assert named in (await resp.json())["error"]["message"]
