"""``tao inspect session|tools --json`` against a real Redis store."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
import redis.asyncio as aioredis

from shared.cli.main import main
from shared.core.session import Session, on_tool_start
from shared.infra.store import Store

SESSION_KEYS = {
    "session",
    "state",
    "admitted",
    "ended",
    "node",
    "tokens",
    "weight",
    "version",
    "turns",
    "model",
    "gateway_id",
    "updated_at",
    "readiness",
    "tool",
    "residency",
}


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[Store]:
    client = aioredis.from_url(redis_url)
    s = Store(client, domain="i" + uuid.uuid4().hex[:12])
    try:
        yield s
    finally:
        await s.clear()
        await client.aclose()


async def test_session_and_tools_json(
    store: Store, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await store.record_tools([("pytest", 4.0, False), ("pytest", 6.0, False)])

    def start(s: Session | None) -> Session:
        base = s or Session(id="cc-1", activity="idle", tokens=2048, turns=1)
        return on_tool_start(base, "toolu_01", "pytest", 1.0e9, source="hook", deadline=1.0e9 + 300)

    await store.update_session("cc-1", start)
    await store.put_residency("cc-1", "sim0", 2048, 1.0e9)
    common = ["--json", "--redis", redis_url, "--domain", store.domain]

    capsys.readouterr()
    assert await asyncio.to_thread(main, ["inspect", "session", "cc-1", *common]) == 0
    view = orjson.loads(capsys.readouterr().out)
    assert set(view) == SESSION_KEYS
    assert view["state"] == "tool" and view["tokens"] == 2048 and view["version"] >= 1
    assert view["tool"]["name"] == "pytest" and view["tool"]["call_id"] == "toolu_01"
    assert view["tool"]["deadline"] == 1.0e9 + 300 and view["tool"]["evidence"] is not None
    assert view["residency"]["sim0"]["k0"] == 2048

    assert await asyncio.to_thread(main, ["inspect", "tools", *common]) == 0
    tools = orjson.loads(capsys.readouterr().out)
    assert tools["tools"]["pytest"]["count"] == 2 and tools["global"]["count"] == 2

    assert await asyncio.to_thread(main, ["inspect", "session", "nobody", *common]) == 2
    err = capsys.readouterr().err
    assert "no session 'nobody'" in err and len(err.strip().splitlines()) == 1
