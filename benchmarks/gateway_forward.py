"""Gateway forward overhead: one admitted session's requests through the gateway to a stub node.

A script, not a test: it prints a markdown table to stdout::

    PYTHONPATH=. .venv/bin/python -m benchmarks.gateway_forward
    PYTHONPATH=. .venv/bin/python -m benchmarks.gateway_forward --requests 2000 --rounds 5

The real gateway app (``services.gateway.create_app``) on an in-memory bus, admitted sessions
(placements delivered first, so nothing is held), and a stub node in the same process that
answers at once: JSON, or an SSE stream of ``--chunks`` chunks. Each request is timed from the
client's send to its last byte (aiohttp client, one connection reused), sequentially.

Variants, run interleaved round by round in one process (the machine's noise hits both):

* ``abortable``: today's forward (:mod:`services.gateway.proxy`): the upstream wait races the
  node's down event (two tasks per request) and a watch task closes the connection if the node
  is marked down;
* ``plain``: the same code with those two helpers replaced by a plain ``await`` and no watch
  (the forward as it was before node-down aborts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import Awaitable
from contextlib import contextmanager
from typing import Any

import orjson
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer

from services.gateway import create_app
from services.gateway import proxy as gw_proxy
from shared.contracts import Placement
from shared.infra import FakeBus, Settings
from shared.infra.logging import configure_logging

GW = "bench"
USAGE = {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}
ANSWER = {"role": "assistant", "content": "ok"}
CHUNK = {"id": "c", "object": "chat.completion.chunk", "model": "m"}


def _node_app(chunks: int) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "c",
                    "object": "chat.completion",
                    "model": "m",
                    "choices": [{"index": 0, "message": ANSWER, "finish_reason": "stop"}],
                    "usage": USAGE,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(chunks):
            delta = {"content": "x"} if i else {"role": "assistant", "content": ""}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            chunk = {**CHUNK, "choices": [choice]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        usage = {**CHUNK, "choices": [], "usage": USAGE}
        await resp.write(b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@contextmanager
def _plain() -> Any:
    """The forward without the node-down race and watch (see the module docstring)."""

    async def unless(aw: Awaitable[Any], abort: asyncio.Event | None) -> Any:
        return await aw

    def close_on(abort: asyncio.Event | None, up: Any) -> None:
        return None

    saved = gw_proxy._unless, gw_proxy._close_on
    gw_proxy._unless, gw_proxy._close_on = unless, close_on
    try:
        yield
    finally:
        gw_proxy._unless, gw_proxy._close_on = saved


async def _timed(http: ClientSession, url: str, n: int, stream: bool, sid: str) -> list[float]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with http.post(url, json=body, headers={"X-Session-ID": sid}) as resp:
            await resp.read()
            assert resp.status == 200, resp.status
        out.append((time.perf_counter() - t0) * 1e3)
    return out


async def main_async(args: argparse.Namespace) -> str:
    configure_logging(level="warning")  # one log line per request would be timed too
    node = TestServer(_node_app(args.chunks))
    await node.start_server()
    bus = FakeBus()
    app = create_app(
        Settings(gateway_id=GW), bus, node_urls={"n1": str(node.make_url("")).rstrip("/")}
    )
    gw = TestServer(app)
    await gw.start_server()
    url = str(gw.make_url("/v1/chat/completions"))
    sids = {(v, s): f"{v}-{s}" for v in ("abortable", "plain") for s in (False, True)}
    for i, sid in enumerate(sids.values()):
        await bus.publish_msg(
            Placement(
                kind="admit", session_id=sid, version=1, tick=i + 1, gateway_id=GW, node_id="n1"
            )
        )
    await bus.settle()
    samples: dict[tuple[str, bool], list[float]] = {k: [] for k in sids}
    async with ClientSession() as http:
        for stream in (False, True):  # warm-up
            await _timed(http, url, 50, stream, sids[("abortable", stream)])
        for r in range(args.rounds):
            for variant in ("abortable", "plain") if r % 2 == 0 else ("plain", "abortable"):
                for stream in (False, True):
                    sid = sids[(variant, stream)]
                    with _plain() if variant == "plain" else contextlib.nullcontext():
                        samples[(variant, stream)] += await _timed(
                            http, url, args.requests, stream, sid
                        )
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
    await gw.close()
    await node.close()
    await bus.drain()
    lines = [
        "| variant | stream | requests | p50 ms | p90 ms | p99 ms | mean ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for (variant, stream), xs in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        q = statistics.quantiles(xs, n=100)
        lines.append(
            f"| {variant} | {'yes' if stream else 'no'} | {len(xs)} | {q[49]:.3f} | "
            f"{q[89]:.3f} | {q[98]:.3f} | {statistics.fmean(xs):.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=1000, help="requests per variant per round")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds")
    p.add_argument("--chunks", type=int, default=32, help="SSE chunks per streamed answer")
    print(asyncio.run(main_async(p.parse_args())))


if __name__ == "__main__":
    main()
