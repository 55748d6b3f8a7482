"""tools → valuation → planner end to end on real NATS (JetStream) and real Redis.

Each service runs through the real runner (``run_service_async``) with its own NATS connection,
in a fresh namespace and Redis domain per test. The test plays the gateway: it publishes
session and tool events and watches placements on its own subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import anyio
import pytest
import redis.asyncio as aioredis

from services.planner import app as planner_app
from services.tools import app as tools_app
from services.valuation import app as valuation_app
from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.deadletter import DeadLetter
from shared.contracts.plan import Placement
from shared.contracts.session import SessionRequest, SessionResponse, Usage
from shared.contracts.tool import ToolEnd, ToolStart
from shared.contracts.valuation import ValuationSnapshot
from shared.contracts.wake import Wake
from shared.core.blockkeys import chain_keys
from shared.infra import Bus, Delivery, Settings
from shared.infra.runner import Main, run_service_async
from shared.infra.store import Store
from shared.infra.store_types import NodeUpdate

GW = "gw1"
TIMEOUT_S = 60.0


@dataclass
class Watch:
    """Collects decoded messages and lets a test await a condition on them."""

    items: list[object] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def __call__(self, value: object, d: Delivery) -> None:
        self.items.append(value)
        self.changed.set()

    async def until(self, cond: Callable[[list[object]], bool]) -> None:
        with anyio.fail_after(TIMEOUT_S):
            while not cond(self.items):
                await self.changed.wait()
                self.changed = anyio.Event()


@dataclass
class Stack:
    settings: Settings
    bus: Bus
    store: Store
    tasks: dict[str, asyncio.Task[int]] = field(default_factory=dict)

    def start(self, name: str, main: Main) -> None:
        """Run service ``name`` through the real runner until :meth:`stop`."""
        self.tasks[name] = asyncio.create_task(
            run_service_async(name, main, settings=self.settings, needs_redis=True)
        )

    async def stop(self, name: str) -> None:
        """Cancel the service as a signal would: the runner drains its bus and closes Redis."""
        task = self.tasks.pop(name)
        assert not task.done(), f"{name} ended early with {task.result()}"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def request(self, sid: str, rid: str = "r1", tokens: int = 1000) -> None:
        await self.bus.publish_msg(
            SessionRequest(
                session_id=sid,
                request_id=rid,
                model="m",
                arrived_at=1.0,
                gateway_id=GW,
                prompt_tokens_estimate=tokens,
            )
        )

    async def watch_placements(self) -> Watch:
        w = Watch()
        await self.bus.consume(
            subjects.STREAM_PLACEMENT,
            "gateway",
            lambda b: decode(b, Placement),
            w,
            filter_subject=subjects.placement(GW),
            ephemeral=True,
        )
        return w


@pytest.fixture
async def stack(nats_url: str, redis_url: str, namespace: str) -> AsyncIterator[Stack]:
    settings = Settings(
        nats_url=nats_url,
        redis_url=redis_url,
        namespace=namespace,
        domain="d" + uuid.uuid4().hex[:12],
        tick_s=0.05,
        ack_wait_s=2.0,
        retry_backoff_s=0.01,
        max_deliver=3,
        log_level="warning",
    )
    bus = await Bus.connect(nats_url, name="test", namespace=namespace)
    await bus.ensure_streams()
    client = aioredis.Redis.from_url(redis_url)
    store = Store(client, settings.domain)
    await store.put_node_status(
        "n1",
        NodeUpdate(capacity_tokens=1_000_000, target_utilisation=0.9, healthy=True, models=None),
    )
    st = Stack(settings, bus, store)
    try:
        yield st
        for name in list(st.tasks):
            await st.stop(name)
    finally:
        await bus.delete_streams()
        await bus.drain()
        await store.clear()
        await client.aclose()


def admitted_ids(items: list[object]) -> list[str]:
    return [p.session_id for p in items if isinstance(p, Placement) and p.kind == "admit"]


async def until_all_admitted(w: Watch, ids: set[str]) -> None:
    await w.until(lambda items: ids <= set(admitted_ids(items)))


async def check_exactly_once(stack: Stack, w: Watch, ids: set[str]) -> None:
    """Every session was admitted once: its request applied once (version 1, then 2 by the one
    admission), every admit placement for it names that one admission (a restarted planner
    re-publishes current admissions, which a gateway de-duplicates by version), and the node
    reserves exactly one weight per session."""
    seen: dict[str, set[tuple[int, str | None]]] = {}
    for p in w.items:
        assert isinstance(p, Placement) and p.kind == "admit"
        seen.setdefault(p.session_id, set()).add((p.version, p.node_id))
    assert set(seen) == ids
    for s in await stack.store.sessions(sorted(ids)):
        assert (s.version, s.node, s.activity) == (2, "n1", "running"), s
        assert seen[s.id] == {(2, "n1")}
    node = await stack.store.get_node("n1")
    assert node is not None and node.reserved == sum(1000 + 512 for _ in ids)


class TestChain:
    async def test_new_session_request_gets_admit_placement(self, stack: Stack) -> None:
        """A SessionRequest for a new session ends in an admit Placement on its gateway."""
        w = await stack.watch_placements()
        for name, main in (
            ("tools", tools_app.main),
            ("valuation", valuation_app.main),
            ("planner", planner_app.main),
        ):
            stack.start(name, main)
        await stack.request("alice@example.com")
        await until_all_admitted(w, {"alice@example.com"})
        (p,) = w.items
        assert isinstance(p, Placement)
        assert (p.kind, p.node_id, p.gateway_id) == ("admit", "n1", GW)
        rec = await stack.store.get_session("alice@example.com")
        assert rec is not None and rec.version == p.version and rec.node == "n1"

    async def test_malformed_tool_message_dead_lettered_and_tools_goes_on(
        self, stack: Stack
    ) -> None:
        """A malformed message on the tool stream goes to the tools DLQ; later events apply."""
        dlq = Watch()
        await stack.bus.consume(
            subjects.STREAM_DLQ,
            "test",
            lambda b: decode(b, DeadLetter),
            dlq,
            filter_subject=subjects.dead_letter("tools"),
            ephemeral=True,
        )
        wakes = Watch()
        await stack.bus.subscribe(subjects.wake(), "test", lambda b: decode(b, Wake), wakes)
        stack.start("tools", tools_app.main)
        await stack.bus.publish(subjects.tool_event("s1"), b'{"type":"ToolEnd","call_id":7}')
        await stack.request("s1")
        await wakes.until(lambda items: len(items) >= 1)  # the request is recorded
        await stack.bus.publish_msg(
            ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=2.0)
        )
        await stack.bus.publish_msg(
            ToolEnd(session_id="s1", call_id="h1", ended_at=5.0, tool="Bash", duration_s=3.0)
        )
        await wakes.until(
            lambda items: any(isinstance(x, Wake) and x.reason == "tool_end" for x in items)
        )
        await dlq.until(lambda items: len(items) >= 1)
        (letter,) = dlq.items
        assert isinstance(letter, DeadLetter) and letter.subject == subjects.tool_event("s1")
        rec = await stack.store.get_session("s1")
        assert rec is not None and rec.tool is not None and rec.tool.completed_at == 5.0
        assert (await stack.store.history()).of("Bash").count == 1

    async def test_shared_prefix_leaves_weights_and_counts_once_per_node(
        self, stack: Stack
    ) -> None:
        """Two admitted sessions answer with the same 1,024-token system prompt: the tools
        service weighs both ``tokens − shared + reserve`` (the first rewritten when the second
        answers), the node's reserved total follows, and the valuation's next snapshot takes
        the prefix off the node's free room once."""
        w = await stack.watch_placements()
        snaps = Watch()
        await stack.bus.subscribe(
            subjects.valuation_snapshot(), "test", lambda b: decode(b, ValuationSnapshot), snaps
        )
        for name, main in (
            ("tools", tools_app.main),
            ("valuation", valuation_app.main),
            ("planner", planner_app.main),
        ):
            stack.start(name, main)
        await stack.request("a")
        await stack.request("b")
        await until_all_admitted(w, {"a", "b"})
        system = [1000 + i for i in range(1024)]
        for i, sid in enumerate(("a", "b")):
            prompt = system + [50_000 + 100 * i + j for j in range(900)]
            reply = SessionResponse(
                session_id=sid, request_id="r1", node_id="n1", gateway_id=GW,
                finished_at=2.0 + i, usage=Usage(total_tokens=2000), block_size=16,
                block_keys=chain_keys(prompt, 16), model="m",
            )  # fmt: skip
            await stack.bus.publish_msg(reply)
        weight = 2000 - 1024 + 512
        with anyio.fail_after(TIMEOUT_S):
            while True:
                recs = await stack.store.sessions(["a", "b"])
                if [(s.shared, s.weight) for s in recs] == [(1024, weight)] * 2:
                    break
                await anyio.sleep(0.02)
        node = await stack.store.get_node("n1")
        assert node is not None and node.reserved == 2 * weight
        await anyio.sleep(0.3)  # a few valuation ticks: the shared wake-up's names are read
        await stack.request("c")
        free = 900_000 - 2 * weight - 1024

        def seen(items: list[object]) -> bool:
            return any(
                isinstance(x, ValuationSnapshot)
                and any(c.id == "c" for c in x.candidates)
                and x.nodes[0].free == free
                for x in items
            )

        await snaps.until(seen)


class TestRestart:
    async def _outage(self, stack: Stack, victim: str, mains: dict[str, Main]) -> None:
        w = await stack.watch_placements()
        for name, main in mains.items():
            stack.start(name, main)
        before = {f"a{i:03d}" for i in range(100)}
        during = {f"b{i:03d}" for i in range(100)}
        for sid in sorted(before):
            await stack.request(sid)
        await w.until(lambda items: len(admitted_ids(items)) >= 3)
        await stack.stop(victim)  # mid-run: some of `before` are not processed yet
        for sid in sorted(during):
            await stack.request(sid)
        stack.start(victim, mains[victim])
        await until_all_admitted(w, before | during)
        await check_exactly_once(stack, w, before | during)

    async def test_tools_restart_loses_nothing(self, stack: Stack) -> None:
        """Requests published before and during a tools outage are each admitted once."""
        await self._outage(stack, "tools", _mains())

    async def test_planner_restart_loses_nothing(self, stack: Stack) -> None:
        """Requests published before and during a planner outage are each admitted once."""
        await self._outage(stack, "planner", _mains())

    async def test_tools_crash_redelivers_unacked(self, stack: Stack) -> None:
        """A tools process whose NATS connection dies without draining (a crash) loses
        nothing: unacknowledged events are redelivered to the restarted service and applied
        once."""
        w = await stack.watch_placements()
        stack.start("valuation", valuation_app.main)
        stack.start("planner", planner_app.main)
        crash_bus = await Bus.connect(
            stack.settings.nats_url or "",
            name="tools-crashing",
            namespace=stack.settings.namespace,
            ack_wait_s=stack.settings.ack_wait_s,
        )
        await tools_app.start(stack.store, crash_bus)
        ids = {f"c{i:03d}" for i in range(150)}
        for sid in sorted(ids):
            await stack.request(sid)
        await w.until(lambda items: len(admitted_ids(items)) >= 3)
        await crash_bus.nc.close()  # no drain: in-flight and queued events are never acked
        stack.start("tools", tools_app.main)
        await until_all_admitted(w, ids)
        await check_exactly_once(stack, w, ids)


def _mains() -> dict[str, Main]:
    return {
        "tools": tools_app.main,
        "valuation": valuation_app.main,
        "planner": planner_app.main,
    }
