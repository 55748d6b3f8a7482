"""A `tao up` simnode's live KV events reach a subscriber on the endpoint its nodes-file entry
names. Its endpoints are on 127.0.0.1, where vLLM (and so the simnode) would *connect* its PUB
rather than bind it (``vllm/distributed/kv_events.py:449-455@0.32``: it binds only wildcard,
``::`` and ipc endpoints), and telemetry's SUB connects too: nothing flowed, only the replay's
catch-up did. ``tao up`` now passes ``--kv-bind``."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from services.simnode.__main__ import parse_config
from services.simnode.app import create_app
from shared.cli.stack import StackConfig, simnode_launch
from shared.infra.embedded import free_port
from shared.infra.kvzmq import KvFeed


async def test_live_batches_reach_the_nodes_file_endpoint() -> None:
    cmd, spec = simnode_launch(0, StackConfig(host_kv=2.0), (0, free_port(), free_port()))
    config, _, _ = parse_config(
        [*cmd[3 : cmd.index("--port")], "--port", "1", *cmd[cmd.index("--port") + 2 :]]
    )
    assert config.kv_bind and spec.kv_events is not None
    runner = web.AppRunner(create_app(config))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    feed = KvFeed(spec.id, spec.kv_events, spec.kv_replay, catch_up=True)
    seen: list[bool] = []

    async def follow() -> None:
        async for msg in feed.messages():
            seen.append(msg.replayed)

    task = asyncio.ensure_future(follow())
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(30):
            i = 0
            while not any(not replayed for replayed in seen):  # until a live batch arrives
                body = {
                    "model": "tao-sim",
                    "prompt": list(range(100 + i, 164 + i)),
                    "max_tokens": 1,
                }
                async with http.post(f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                    assert r.status == 200
                i += 1
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.cleanup()
    assert False in seen
