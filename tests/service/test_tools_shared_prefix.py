"""The tools service learns sessions' shared prefixes from responses' block keys and weighs
admitted sessions without them (``weight = tokens − shared + reserve``)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

import pytest

from services.tools.app import start
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.session import SessionEnd, SessionRequest, SessionResponse, Usage
from shared.contracts.wake import WAKE_SHARED, Wake
from shared.core.blockkeys import chain_keys
from shared.core.problem import ZERO, PlanResult
from shared.core.session import Session
from shared.core.sharedprefix import SharedPrefixes
from shared.core.tick import Decision, Move
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.shard import Shard
from shared.infra.store_types import NodeUpdate

BS = 16
SYSTEM = [1000 + i for i in range(64 * BS)]  # 1,024 tokens: the harness's prompt and tools
SHARED = 64 * BS
RESERVE = 512


def _tokens(sid: str, n: int) -> list[int]:
    own = [zlib.crc32(f"{sid}/{i}".encode()) & 0xFFFF for i in range(n)]
    return SYSTEM + own


def request(sid: str, rid: str = "r1", at: float = 10.0) -> SessionRequest:
    return SessionRequest(
        session_id=sid, request_id=rid, model="m", arrived_at=at, gateway_id="gw1",
        prompt_tokens_estimate=1500,
    )  # fmt: skip


def response(
    sid: str, rid: str = "r1", at: float = 12.0, total: int = 2000, model: str | None = "m"
) -> SessionResponse:
    prompt = _tokens(sid, 900)
    return SessionResponse(
        session_id=sid,
        request_id=rid,
        node_id="n1",
        gateway_id="gw1",
        finished_at=at,
        usage=Usage(prompt_tokens=total - 100, completion_tokens=100, total_tokens=total),
        block_size=BS,
        block_keys=chain_keys(prompt, BS),
        model=model,
    )


class Env:
    def __init__(self, bus: FakeBus, store: FakeStore) -> None:
        self.bus, self.store = bus, store

    async def send(self, *msgs: object) -> None:
        for m in msgs:
            await self.bus.publish_msg(m)  # type: ignore[arg-type]
        await self.bus.settle()

    async def admit(self, sid: str, weight: int = 3000) -> None:
        s = await self.store.get_session(sid)
        assert s is not None
        result = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")
        move = Move(sid, "n1", weight, s.version)
        d = Decision(tick=1, interrupts=(), admits=(move,), result=result)
        assert not (await self.store.apply(d, 11.0)).discarded

    async def get(self, sid: str) -> Session:
        s = await self.store.get_session(sid)
        assert s is not None
        return s

    def shared_wakes(self) -> list[frozenset[str] | None]:
        wakes = [decode(d, Wake) for s, d, _ in self.bus.published if s == subjects.wake()]
        return [w.names() for w in wakes if w.reason == WAKE_SHARED]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    bus, store = FakeBus(), FakeStore()
    await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
    await start(store, bus, reserve=RESERVE)
    yield Env(bus, store)
    await bus.drain()


class TestWeights:
    async def test_second_session_shares_and_the_first_follows(self, env: Env) -> None:
        """a alone: weight = tokens + reserve. b with the same system prompt: both weigh
        tokens − shared + reserve, a rewritten after b's response; the node's reserved total
        follows; one ``shared`` wake-up names both."""
        await env.send(request("a"), request("b"))
        await env.admit("a")
        await env.admit("b")
        await env.send(response("a", total=2000))
        a = await env.get("a")
        assert (a.shared, a.weight) == (0, 2000 + RESERVE)
        assert env.shared_wakes() == []
        await env.send(response("b", total=2500))
        a, b = await env.get("a"), await env.get("b")
        assert (b.shared, b.weight) == (SHARED, 2500 - SHARED + RESERVE)
        assert (a.shared, a.weight) == (SHARED, 2000 - SHARED + RESERVE)
        node = await env.store.get_node("n1")
        assert node is not None and node.reserved == a.weight + b.weight
        assert env.shared_wakes() == [frozenset({"a", "b"})]

    async def test_pooled_session_records_it_for_its_admission(self, env: Env) -> None:
        """A session not admitted records its shared prefix (its next admission's weight
        leaves it out: ``value_snapshot``); its weight stays 0."""
        await env.send(request("a"), response("a"), request("b"), response("b"))
        a, b = await env.get("a"), await env.get("b")
        assert (a.shared, b.shared, a.weight, b.weight) == (SHARED, SHARED, 0, 0)

    async def test_other_model_and_end(self, env: Env) -> None:
        """A session of another model shares nothing; after its peer ends, a session's next
        response brings its weight back to its whole context."""
        await env.send(request("a"), request("b"), request("c"))
        for sid in "abc":
            await env.admit(sid)
        await env.send(response("a"), response("c", model="other"), response("b"))
        assert [(await env.get(s)).shared for s in "abc"] == [SHARED, SHARED, 0]
        await env.send(SessionEnd(session_id="b", ended_at=20.0))
        await env.send(request("a", "r2", 21.0), response("a", "r2", 22.0, total=3000))
        a = await env.get("a")
        assert (a.shared, a.weight) == (0, 3000 + RESERVE)

    async def test_error_or_no_keys_change_nothing(self, env: Env) -> None:
        await env.send(request("a"), response("a"), request("b"))
        await env.admit("b")
        bare = SessionResponse(
            session_id="b", request_id="r1", node_id="n1", gateway_id="gw1", finished_at=12.0,
            usage=Usage(total_tokens=2000),
        )  # fmt: skip
        await env.send(bare)
        b = await env.get("b")
        assert (b.shared, b.weight) == (0, 2000 + RESERVE)


async def test_every_shard_counts_every_session() -> None:
    """Two tools shards: each session's shared prefix is counted against the other shard's
    sessions too (each registry sees every response), and written once, by its owner."""
    bus, store = FakeBus(), FakeStore()
    await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
    shards = [(await start(store, bus, reserve=RESERVE, shard=Shard(i, 2)))[0] for i in range(2)]
    sids = [f"s{i}" for i in range(8)]
    assert {Shard(0, 2).owns(s) for s in sids} == {True, False}
    for sid in sids:
        await bus.publish_msg(request(sid))
        await bus.publish_msg(response(sid))
    await bus.settle()
    for sid in sids:
        s = await store.get_session(sid)
        assert s is not None and s.shared == SHARED, sid
        assert s.version == 3 if sid == sids[0] else s.version == 2, sid  # the first rewritten
    for h in shards:
        assert h.prefixes is not None and len(h.prefixes) == len(sids)
    await bus.drain()


async def test_a_restarted_process_restores_the_stored_chains() -> None:
    """The chains the telemetry stored are registered under each record's model: the first
    response after a restart still shares with the sessions that answered before it."""
    bus, store = FakeBus(), FakeStore()
    await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
    await start(store, bus, reserve=RESERVE)
    await bus.publish_msg(request("a"))
    await bus.publish_msg(response("a"))
    await bus.settle()
    await bus.drain()
    a = response("a")
    assert a.block_keys is not None
    await store.put_chains([("a", BS, a.block_keys, a.finished_at)])
    bus = FakeBus()
    handlers, _ = await start(store, bus, reserve=RESERVE)
    reg = handlers.prefixes
    assert isinstance(reg, SharedPrefixes) and "a" in reg
    await bus.publish_msg(request("b"))
    await bus.publish_msg(response("b"))
    await bus.settle()
    assert [(await store.get_session(s)) is not None for s in "ab"] == [True, True]
    b = await store.get_session("b")
    assert b is not None and b.shared == SHARED
    await bus.drain()
