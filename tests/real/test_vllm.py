"""TAO against two real vLLM engines (CPU build, tiny local model): what no simnode can tell.

Every number compared here comes from vLLM itself: its ``/metrics``, its ZMQ KV events and
replay socket, and the ``usage.prompt_tokens_details.cached_tokens`` it reports per request.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from benchmarks.replay_client import WORDS
from shared.cli.engines import start_engine, write_state
from shared.contracts.kv import BlockStored, decode_kv_batch
from shared.infra.kvzmq import KvFeed
from shared.infra.store import Store
from tests.real.conftest import BLOCK, KV_BLOCKS, Rig

pytestmark = pytest.mark.real


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@pytest.fixture
async def http(rig: Rig) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        yield session


@pytest.fixture
async def store(rig: Rig) -> AsyncIterator[Store]:
    client = aioredis.Redis.from_url(rig.stack.redis_url)
    try:
        yield Store(client, rig.domain)
    finally:
        await client.aclose()


async def chat(
    http: aiohttp.ClientSession,
    base: str,
    messages: list[dict[str, Any]],
    *,
    sid: str | None = None,
    max_tokens: int = 16,
    stream: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    """One chat completion (the streamed chunks folded into one answer when ``stream``)."""
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    headers = {"X-Session-ID": sid} if sid else {}
    async with http.post(f"{base}/v1/chat/completions", json=body, headers=headers) as resp:
        if not stream:
            assert resp.status == 200, await resp.text()
            return dict(await resp.json())
        assert resp.status == 200, await resp.text()
        folded: dict[str, Any] = {"text": "", "token_ids": [], "chunks": 0}
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            folded["chunks"] += 1
            if chunk.get("prompt_token_ids") is not None:
                folded["prompt_token_ids"] = chunk["prompt_token_ids"]
            if chunk.get("usage"):
                folded["usage"] = chunk["usage"]
            for choice in chunk.get("choices", []):
                folded["text"] += choice.get("delta", {}).get("content") or ""
                folded["token_ids"] += choice.get("token_ids") or []
        return folded


def cached(answer: dict[str, Any]) -> int:
    details = answer["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


async def settle() -> None:
    """Let the engine's KV events reach telemetry and its 50 ms flush reach the store."""
    await asyncio.sleep(1.5)


async def wait_for(cond: Any, what: str, timeout_s: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        got = await cond()
        if got:
            return got
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.5)


async def serving_node(store: Store, sid: str) -> str:
    """The node the session's last request was placed on (its admission; ``home`` once the
    response event has been applied)."""
    session = await store.get_session(sid)
    assert session is not None
    node = session.node if session.node is not None else session.home
    assert node is not None, session
    return node


class TestNodes:
    async def test_capacity_and_block_size_come_from_vllm_metrics(
        self, rig: Rig, store: Store
    ) -> None:
        """Telemetry's node records carry the engines' own KV size from
        ``vllm:cache_config_info`` (blocks x block size) and their health."""

        async def both() -> bool:
            recs = [await store.get_node(n.id) for n in rig.nodes]
            return all(r is not None and r.healthy and r.capacity_tokens for r in recs)

        await wait_for(both, "both nodes scraped healthy")
        for node in rig.nodes:
            rec = await store.get_node(node.id)
            assert rec is not None
            assert (rec.capacity_tokens, rec.block_size) == (KV_BLOCKS * BLOCK, BLOCK)
            assert rec.models == frozenset({"tiny"})


class TestKvEvents:
    async def test_real_events_decode_and_replay_in_vllm_032s_shape(
        self, rig: Rig, http: aiohttp.ClientSession
    ) -> None:
        """A request to the engine stores blocks; the replay socket's answers (vLLM 0.32's
        ``[b"", topic, seq, payload]``) come back whole, every batch decodes, and the stored
        blocks carry the fields of this release, with the engine's block size."""
        rng = random.Random(1)
        node = rig.nodes[0]
        await chat(http, rig.root(node.id), [{"role": "user", "content": text(rng, 200)}])
        feed = KvFeed(node.id, node.kv_events or "", node.kv_replay)
        try:
            replayed = await feed.replay_from(0)
        finally:
            feed.close()
        assert replayed, "the replay socket answered nothing"
        assert feed.stats.bad_frames == 0, dict(feed.stats.bad_frame_reasons)
        assert [m.seq for m in replayed] == list(range(len(replayed)))
        stored: list[BlockStored] = []
        for msg in replayed:
            batch = decode_kv_batch(msg.payload)
            assert batch.unknown_events == 0
            stored += [e for e in batch.events if isinstance(e, BlockStored)]
        assert stored
        assert {e.block_size for e in stored} == {BLOCK}
        assert all(len(e.token_ids) == BLOCK * len(e.block_hashes) for e in stored)
        assert {e.medium for e in stored} == {"GPU"}

    async def test_inspect_node_reads_the_engine(
        self, rig: Rig, http: aiohttp.ClientSession
    ) -> None:
        """``tao inspect node`` (telemetry's index) counts the engine's resident blocks."""
        rng = random.Random(2)
        node = rig.nodes[1]
        await chat(http, rig.root(node.id), [{"role": "user", "content": text(rng, 300)}])
        await settle()
        doc = inspect_node(rig, node.id)
        assert doc["node"] == node.id and doc["blocks"] > 0
        assert doc["capacity_tokens"] == KV_BLOCKS * BLOCK


def inspect_node(rig: Rig, node: str) -> dict[str, Any]:
    env = {
        **os.environ,
        "TAO_NATS_URL": rig.stack.nats_url,
        "TAO_NAMESPACE": rig.namespace,
        "TAO_NODES_FILE": "",
    }
    out = subprocess.run(
        [sys.executable, "-m", "shared.cli.main", "inspect", "node", node, "--json"],
        capture_output=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()
    doc = json.loads(out.stdout)
    assert isinstance(doc, dict)
    return doc


class TestResidency:
    async def test_resident_prefix_is_what_vllm_reuses_turn_by_turn(
        self, rig: Rig, http: aiohttp.ClientSession, store: Store
    ) -> None:
        """For each turn of a session through the gateway, the prefix telemetry credits the
        session on the node that serves the turn is never more than the ``cached_tokens``
        vLLM reports for it, and short of it by at most the blocks the previous reply filled
        (the reply is rendered again in the next prompt and may or may not tokenize as it was
        generated); also after other traffic evicted it from the 8,192-token cache."""
        rng = random.Random(3)
        sid = f"real-res-{rng.randrange(10**6)}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": text(rng, 250)},
            {"role": "user", "content": text(rng, 120)},
        ]
        rows: list[tuple[int, int, int, str]] = []  # credited, cached, previous reply, node
        reply_tokens = 0
        for turn in range(6):
            before = (await store.residency([sid])).get(sid, {})
            answer = await chat(http, rig.stack.gateway_url, messages, sid=sid, max_tokens=24)
            served = await serving_node(store, sid)
            if turn:
                rows.append((before.get(served, (0, 0.0))[0], cached(answer), reply_tokens, served))
            reply_tokens = answer["usage"]["completion_tokens"]
            reply = answer["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": reply})
            messages.append({"role": "user", "content": text(rng, 80)})
            await settle()
            if turn == 3:  # flood both engines past the gateway with more than their KV
                for node in rig.nodes:
                    flooded = 0
                    while flooded < 1.2 * KV_BLOCKS * BLOCK:
                        flood = [{"role": "user", "content": text(rng, 1500)}]
                        got = await chat(http, rig.root(node.id), flood, max_tokens=4)
                        flooded += got["usage"]["prompt_tokens"]
                await settle()
        for credited, got, reply, _ in rows:
            assert credited <= got <= credited + BLOCK * (1 + reply // BLOCK), rows
        assert all(credited > 0 for credited, _, _, _ in rows[:3]), rows  # the prefix was reused
        assert rows[3][0] < rows[2][0] and rows[3][1] < rows[2][1], rows  # the flood evicted it
        assert rows[4][0] > 0, rows  # and the next turn's prefix is credited again

    async def test_sessions_stay_on_the_engine_holding_their_prefix(
        self, rig: Rig, http: aiohttp.ClientSession, store: Store
    ) -> None:
        """Four concurrent sessions of four turns: the planner keeps each on the node that
        served its first turn, and every later turn reuses the cached prefix there."""
        rng = random.Random(4)

        async def one(i: int) -> tuple[list[str], list[int]]:
            sid = f"real-stay-{i}-{rng.randrange(10**6)}"
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": text(random.Random(i), 200)},
                {"role": "user", "content": text(random.Random(100 + i), 60)},
            ]
            served: list[str] = []
            hits: list[int] = []
            for _ in range(4):
                answer = await chat(http, rig.stack.gateway_url, messages, sid=sid, max_tokens=16)
                served.append(await serving_node(store, sid))
                hits.append(cached(answer))
                messages.append(
                    {"role": "assistant", "content": answer["choices"][0]["message"]["content"]}
                )
                messages.append({"role": "user", "content": text(random.Random(200 + i), 40)})
                await asyncio.sleep(0.5)  # a short tool call
            return served, hits

        results = await asyncio.gather(*(one(i) for i in range(4)))
        for served, hits in results:
            assert len(set(served)) == 1, served
            assert all(h > 0 for h in hits[1:]), hits


class TestGateway:
    @pytest.mark.parametrize("stream", [False, True])
    async def test_token_ids_come_back_through_the_gateway(
        self, rig: Rig, http: aiohttp.ClientSession, stream: bool
    ) -> None:
        """A client that asks for ``return_token_ids`` gets vLLM's prompt and output ids
        through the gateway, streaming or not, as many as the usage counts."""
        rng = random.Random(5)
        messages = [{"role": "user", "content": text(rng, 90)}]
        answer = await chat(
            http,
            rig.stack.gateway_url,
            messages,
            sid=f"real-ids-{stream}",
            max_tokens=12,
            stream=stream,
            return_token_ids=True,
        )
        prompt_ids = answer["prompt_token_ids"]
        output_ids = answer["token_ids"] if stream else answer["choices"][0]["token_ids"]
        assert len(prompt_ids) == answer["usage"]["prompt_tokens"]
        assert len(output_ids) == answer["usage"]["completion_tokens"] > 0
        assert all(isinstance(t, int) and t >= 0 for t in prompt_ids + output_ids)

    async def test_anthropic_messages_through_the_gateway(
        self, rig: Rig, http: aiohttp.ClientSession
    ) -> None:
        """vLLM serves ``/v1/messages``; the gateway passes an Anthropic request through."""
        body = {
            "model": "tiny",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello there, how are you"}],
        }
        headers = {"X-Session-ID": "real-anthropic", "anthropic-version": "2023-06-01"}
        async with http.post(
            f"{rig.stack.gateway_url}/v1/messages", json=body, headers=headers
        ) as resp:
            assert resp.status == 200, await resp.text()
            doc = await resp.json()
        assert doc["type"] == "message" and doc["role"] == "assistant"
        assert doc["content"][0]["type"] == "text"
        assert doc["usage"]["input_tokens"] > 0 and doc["usage"]["output_tokens"] > 0


class TestRestart:
    async def test_a_killed_and_restarted_engine_is_cleared(
        self, rig: Rig, http: aiohttp.ClientSession
    ) -> None:
        """SIGKILL an engine holding blocks and start it again: telemetry sees the restart
        (the engine's start time changed, or its first event's seq went back) and clears
        the node, so ``tao inspect node`` shows the empty new engine, a new incarnation."""
        rng = random.Random(6)
        node = rig.nodes[1]
        await chat(http, rig.root(node.id), [{"role": "user", "content": text(rng, 400)}])
        await settle()
        before = inspect_node(rig, node.id)
        assert before["blocks"] > 0
        state = json.loads((rig.cfg.state_dir / "engines.json").read_text())["engines"]
        entry = next(e for e in state if e["id"] == node.id)
        os.killpg(entry["pid"], signal.SIGKILL)
        os.waitpid(entry["pid"], 0)
        fresh = start_engine(rig.cfg, 1)
        write_state(rig.cfg.state_dir, [fresh if e["id"] == node.id else e for e in state])

        async def healthy() -> bool:
            try:
                async with http.get(f"{rig.root(node.id)}/health") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(healthy, "the restarted engine's health", timeout_s=400.0)

        async def cleared() -> dict[str, Any] | None:
            doc = inspect_node(rig, node.id)
            return (
                doc if doc["blocks"] == 0 and doc["incarnation"] > before["incarnation"] else None
            )

        after = await wait_for(cleared, "the restarted node cleared in telemetry's index")
        assert after["healthy"] is True
