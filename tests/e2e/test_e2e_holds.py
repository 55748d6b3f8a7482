"""Held requests through the whole stack: the 503 on hold timeout, and a client that leaves.

A request whose prompt is larger than any node's usable KV capacity (capacity × target) is
never eligible, so the planner never admits it and the gateway holds it: on the ``tight`` stack
until its 2 s hold timeout, on the main stack (60 s) until the client goes away.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import openai
import orjson
import pytest

from shared.contracts import SessionCancel, decode_session_event, subjects
from shared.infra import Delivery

RELEASE_DEADLINE_S = 20.0  # well under the main stack's 60 s hold timeout
# 50,000 tokens by characters / 4: more than a node holds even after the gateway has scaled its
# estimates by the smallest ratio it learns from the nodes' usage (0.25, calibration.LOW).
OVERSIZED = [{"role": "user", "content": "x " * 100_000}]
SCRIPT = {"output_tokens": 5, "tool_call": None}


def _oversized(c: Any, sid: str) -> Any:
    """A chat request estimated at 12,500+ prompt tokens: more than a node can ever hold."""
    return c.api.chat.completions.create(
        model=c.model,
        messages=OVERSIZED,
        extra_headers={"X-Session-ID": sid},
        extra_body={"tao_script": SCRIPT},
    )


def _oversized_body(model: str) -> bytes:
    return orjson.dumps(
        {
            "model": model,
            "messages": OVERSIZED,
            "stream": True,
            "tao_script": SCRIPT,
        }
    )


async def _raw_post(
    base: str, body: bytes, sid: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST ``body`` to the gateway's chat endpoint over a connection of our own."""
    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Content-Type: application/json\r\nAuthorization: Bearer e2e\r\n"
        f"X-Session-ID: {sid}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    return reader, writer


class TestHoldTimeout:
    async def test_unadmittable_request_gets_503_with_retry_after(self, tight: Any) -> None:
        """A request no node can take waits (pooled) for the hold timeout, then gets 503 with
        Retry-After, and the session is left idle, out of the pool."""
        sid = f"big-{uuid.uuid4().hex[:8]}"
        hold_timeout_s = float(tight.env["TAO_HOLD_TIMEOUT_S"])
        async with tight.clients() as c:
            began = time.monotonic()
            call = asyncio.create_task(_oversized(c, sid))
            await c.await_session(
                sid, lambda s: s is not None and s.activity == "waiting" and s.pooled, "waiting"
            )
            with pytest.raises(openai.APIStatusError) as caught:
                await call
            held = time.monotonic() - began
            err = caught.value
            assert err.status_code == 503
            assert err.response.headers.get("Retry-After") == tight.env["TAO_RETRY_AFTER_S"]
            assert isinstance(err.body, dict) and err.body.get("type") == "service_unavailable"
            assert held >= hold_timeout_s  # it was held, not refused at once
            rec = await c.await_session(
                sid, lambda s: s is not None and s.activity == "idle", "idle after the 503"
            )
            assert rec is not None and not rec.pooled and rec.node is None
            node = await c.store().get_node("sim0")
            assert node is not None and node.reserved == 0


class TestClientDisconnect:
    async def test_client_gone_while_held_releases_the_session(self, e2e: Any) -> None:
        """A held request whose client goes away is withdrawn: the gateway reports a
        client_closed cancel and the session becomes idle, long before the hold timeout."""
        sid = f"gone-{uuid.uuid4().hex[:8]}"
        cancels: asyncio.Queue[SessionCancel] = asyncio.Queue()

        async def on_event(ev: Any, d: Delivery) -> None:
            if isinstance(ev, SessionCancel) and ev.session_id == sid:
                await cancels.put(ev)

        async with e2e.clients() as c:
            await c.bus.subscribe(
                subjects.session_events(), "e2e-watch", decode_session_event, on_event
            )
            # A raw connection, closed by hand: an HTTP client library's cancel may keep or
            # pool the socket for a while, and then the gateway cannot know the client left.
            _, writer = await _raw_post(e2e.gateway, _oversized_body(c.model), sid)
            await c.await_session(
                sid, lambda s: s is not None and s.activity == "waiting", "waiting"
            )
            writer.close()  # the client goes away
            await writer.wait_closed()
            cancel = await asyncio.wait_for(cancels.get(), RELEASE_DEADLINE_S)
            assert cancel.reason == "client_closed"
            rec = await c.await_session(
                sid,
                lambda s: s is not None and s.activity == "idle",
                "idle after the disconnect",
                timeout_s=RELEASE_DEADLINE_S,
            )
            assert rec is not None and not rec.pooled and rec.request_id is None
