"""The tools service on FakeBus + FakeStore: session and tool events → session records."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from services.tools.app import start
from services.tools.handlers import ToolsHandlers
from services.tools.steps import AWAITING_CLIENT
from shared.contracts import subjects
from shared.contracts.codec import decode, decode_message
from shared.contracts.deadletter import DeadLetter
from shared.contracts.session import (
    SessionCancel,
    SessionEnd,
    SessionRequest,
    SessionResponse,
    ToolCallInfo,
    Usage,
)
from shared.contracts.tool import SOURCE_HOOK, ToolEnd, ToolProgress, ToolStart
from shared.contracts.wake import Wake
from shared.core.problem import ZERO, PlanResult
from shared.core.session import INFERRED, Session
from shared.core.tick import Decision, Move
from shared.infra.busapi import MSG_ID_HEADER, Delivery
from shared.infra.errors import SettingsError
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.settings import Settings
from shared.infra.shard import Shard
from shared.infra.store_types import NodeUpdate


@dataclass
class Env:
    bus: FakeBus
    store: FakeStore
    handlers: ToolsHandlers

    async def send(self, *msgs: object) -> None:
        """Deliver each of ``msgs`` (one sent twice arrives twice: a JetStream redelivery,
        which the bus's publish-side dedup does not stop)."""
        for m in msgs:
            redelivery = {MSG_ID_HEADER: uuid.uuid4().hex}
            await self.bus.publish_msg(m, headers=redelivery)  # type: ignore[arg-type]
        await self.bus.settle()

    def wakes(self) -> list[Wake]:
        return [decode(d, Wake) for s, d, _ in self.bus.published if s == subjects.wake()]


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    bus = FakeBus()
    store = FakeStore()
    await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
    handlers, _ = await start(store, bus)
    yield Env(bus, store, handlers)
    await bus.drain()


def request(sid: str = "s1", rid: str = "r1", at: float = 10.0, est: int = 0) -> SessionRequest:
    return SessionRequest(
        session_id=sid,
        request_id=rid,
        model="m",
        arrived_at=at,
        gateway_id="gw1",
        prompt_tokens_estimate=est,
    )


def response(
    sid: str = "s1", rid: str = "r1", at: float = 12.0, calls: int = 1, error: str | None = None
) -> SessionResponse:
    return SessionResponse(
        session_id=sid,
        request_id=rid,
        node_id="n1",
        gateway_id="gw1",
        finished_at=at,
        usage=Usage(prompt_tokens=900, completion_tokens=100, total_tokens=1000),
        tool_calls=[ToolCallInfo(id=f"c{i}", name="bash") for i in range(calls)],
        error=error,
    )


async def admitted(env: Env, sid: str, weight: int = 2000) -> Session:
    """Admit ``sid`` on n1 through the store's apply, as the planner would."""
    s = await env.store.get_session(sid)
    assert s is not None
    result = PlanResult(assignments=(), objective=ZERO, exact=True, method="test")
    d = Decision(tick=1, interrupts=(), admits=(Move(sid, "n1", weight, s.version),), result=result)
    applied = await env.store.apply(d, 11.0)
    assert not applied.discarded
    return applied.sessions[sid]


class TestSessionEvents:
    async def test_request_creates_record_and_wakes(self, env: Env) -> None:
        """A request for a new session creates a waiting, pooled record and publishes a wake."""
        await env.send(request(est=300))
        s = await env.store.get_session("s1")
        assert s is not None
        assert (s.activity, s.model, s.gateway_id, s.tokens, s.created_at) == (
            "waiting",
            "m",
            "gw1",
            300,
            10.0,
        )
        assert await env.store.pool_ids() == {"s1"}
        assert [(w.reason, w.session_id) for w in env.wakes()] == [("arrival", "s1")]

    async def test_duplicate_request_is_ignored(self, env: Env) -> None:
        """A redelivered request (same request id, still pending) does not bump the version."""
        await env.send(request(), request())
        s = await env.store.get_session("s1")
        assert s is not None and s.version == 1
        assert len(env.wakes()) == 1

    async def test_response_with_tool_calls_enters_tool(self, env: Env) -> None:
        """A response with tool calls puts the session in an inferred tool with its tokens."""
        await env.send(request(), response())
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None
        assert (s.activity, s.tokens, s.turns) == ("tool", 1000, 1)
        assert (s.tool.call_id, s.tool.tool, s.tool.source, s.tool.started_at) == (
            "c0",
            "bash",
            INFERRED,
            12.0,
        )

    async def test_error_response_goes_idle_keeping_tokens(self, env: Env) -> None:
        """A failed request returns the session to idle without changing tokens or turns."""
        await env.send(request(est=500), response(calls=0, error="upstream 500"))
        s = await env.store.get_session("s1")
        assert s is not None
        assert (s.activity, s.tokens, s.turns, s.request_id) == ("idle", 500, 0, None)

    async def test_stale_response_is_ignored(self, env: Env) -> None:
        """A response for another request id leaves the record alone."""
        await env.send(request(rid="r2"), response(rid="r1"))
        s = await env.store.get_session("s1")
        assert s is not None and (s.activity, s.version) == ("waiting", 1)

    async def test_next_request_ends_inferred_tool(self, env: Env) -> None:
        """The session's next request ends its open inferred tool call and waits again."""
        await env.send(request(), response(), request(rid="r2", at=20.0))
        s = await env.store.get_session("s1")
        assert s is not None
        assert (s.activity, s.tool, s.request_id) == ("waiting", None, "r2")
        assert await env.store.history() == (await FakeStore().history())  # nothing recorded

    async def test_cancel_returns_to_idle(self, env: Env) -> None:
        """A cancel of the pending request leaves the pool."""
        await env.send(request(), SessionCancel(session_id="s1", request_id="r1", cancelled_at=11))
        s = await env.store.get_session("s1")
        assert s is not None and s.activity == "idle"
        assert await env.store.pool_ids() == set()

    async def test_cancel_after_admission_awaits_the_client(self, env: Env) -> None:
        """A cancel of the current request just after admission leaves the running session
        waiting on its client, as a tool of unknown end (releasable, services.tools.steps)."""
        await env.send(request())
        await admitted(env, "s1")
        await env.send(SessionCancel(session_id="s1", request_id="r1", cancelled_at=12))
        s = await env.store.get_session("s1")
        assert s is not None and (s.activity, s.node, s.request_id) == ("tool", "n1", None)
        assert s.tool is not None and s.tool.tool == AWAITING_CLIENT

    async def test_answer_without_tools_awaits_the_client(self, env: Env) -> None:
        """An admitted session answered with no tool call is in the client's inferred call;
        its next request ends it and nothing is recorded in the tool statistics."""
        await env.send(request())
        await admitted(env, "s1")
        await env.send(response(calls=0))
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None
        assert (s.activity, s.tool.tool, s.tool.source, s.tool.started_at) == (
            "tool",
            AWAITING_CLIENT,
            INFERRED,
            12.0,
        )
        await env.send(request(rid="r2", at=30.0))
        s = await env.store.get_session("s1")
        assert s is not None and (s.activity, s.tool) == ("running", None)
        assert await env.store.history() == (await FakeStore().history())

    async def test_end_releases_reservation_and_deletes(self, env: Env) -> None:
        """SessionEnd releases the node reservation and removes the record."""
        await env.send(request())
        await admitted(env, "s1", 2000)
        node = await env.store.get_node("n1")
        assert node is not None and node.reserved == 2000
        await env.send(SessionEnd(session_id="s1", ended_at=30.0))
        node = await env.store.get_node("n1")
        assert node is not None and node.reserved == 0
        assert await env.store.get_session("s1") is None
        assert env.wakes()[-1].reason == "end"

    async def test_response_reweighs_admitted_session(self, env: Env) -> None:
        """A response re-weighs an admitted session to tokens + reserve; the node follows."""
        await env.send(request())
        await admitted(env, "s1", 2000)
        await env.send(response())
        s = await env.store.get_session("s1")
        node = await env.store.get_node("n1")
        assert s is not None and node is not None
        assert (s.weight, node.reserved) == (1000 + 512, 1000 + 512)


class TestToolEvents:
    async def test_hook_start_supersedes_inferred(self, env: Env) -> None:
        """A hook ToolStart replaces the inferred call, with its deadline from timeout_s."""
        await env.send(request(), response())
        start_ev = ToolStart(
            session_id="s1", call_id="h1", tool="Bash", started_at=12.5, timeout_s=60.0
        )
        await env.send(start_ev)
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None
        assert (s.tool.call_id, s.tool.source, s.tool.deadline) == ("h1", SOURCE_HOOK, 72.5)

    async def test_inferred_start_never_replaces_hook(self, env: Env) -> None:
        """A later response's inferred call does not replace an open hook call."""
        await env.send(
            request(), ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=11)
        )
        await env.send(response(at=12.0))
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None
        assert (s.activity, s.tool.call_id, s.tool.source) == ("tool", "h1", SOURCE_HOOK)

    async def test_tool_end_records_duration_and_wakes(self, env: Env) -> None:
        """A hook ToolEnd completes the call, records its reported duration and wakes."""
        await env.send(
            request(), ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=11)
        )
        await env.send(response(at=12.0))
        end = ToolEnd(session_id="s1", call_id="h1", ended_at=15.0, tool="Bash", duration_s=3.5)
        await env.send(end, end)  # the second is a redelivery: recorded once
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None and s.tool.completed_at == 15.0
        h = await env.store.history()
        assert (h.of("Bash").count, h.of("Bash").mean) == (1, 3.5)
        assert [w.reason for w in env.wakes()] == ["arrival", "tool_end"]

    async def test_redelivered_after_the_session_moved_on_is_recorded_once(self, env: Env) -> None:
        """The ToolEnd's ack is lost (NATS down); by its redelivery the next request has
        replaced the call (or the end arrived late the first time): recorded once all the
        same (the record keeps the ids of the ends it recorded). Found by the NATS-restart
        e2e test (a duration recorded twice)."""
        await env.send(
            request(), ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=11)
        )
        await env.send(response(at=12.0))
        end = ToolEnd(session_id="s1", call_id="h1", ended_at=15.0, tool="Bash", duration_s=3.5)
        await env.send(end)
        await env.send(request(rid="r2", at=16.0))  # the next turn: the call is gone
        await env.send(end)  # the redelivery
        late = ToolEnd(session_id="s1", call_id="h0", ended_at=9.0, tool="Bash", duration_s=1.5)
        await env.send(late, late)  # a late end of an earlier call, then its redelivery
        h = await env.store.history()
        assert (h.of("Bash").count, h.of("Bash").mean) == (2, 2.5)
        s = await env.store.get_session("s1")
        assert s is not None and s.ended_calls == ("h1", "h0")

    async def test_kill_after_any_first_write_loses_no_duration(self, env: Env) -> None:
        """The process dies right after the batch's first store write (SIGKILL between two
        writes); the redelivered ToolEnd then finds its call ended, so the duration must have
        landed with that write: recorded exactly once, never zero times."""
        await env.send(
            request(), ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=11)
        )
        await env.send(response(at=12.0))
        end = ToolEnd(session_id="s1", call_id="h1", ended_at=15.0, tool="Bash", duration_s=3.5)
        dying = ToolsHandlers(
            store=_DiesAfterFirstWrite(env.store),  # type: ignore[arg-type]
            bus=env.bus,
            log=env.handlers.log,
        )
        delivery = Delivery(subjects.tool_event("s1"), {}, 1, 1, 15.0)
        with contextlib.suppress(_Killed):  # killed, unless the batch wrote once in all
            await dying.on_tool_batch([(end, delivery)])
        await env.send(end)  # the redelivery, to the restarted service
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None and s.tool.completed_at == 15.0
        assert (await env.store.history()).of("Bash").count == 1

    async def test_censored_end_is_not_a_sample(self, env: Env) -> None:
        """A ToolEnd cut by its timeout is recorded as censored, not as a duration sample."""
        await env.send(
            request(), ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=11)
        )
        await env.send(
            ToolEnd(session_id="s1", call_id="h1", ended_at=71, tool="Bash", censored=True)
        )
        stats = (await env.store.history()).of("Bash")
        assert stats.count == 0
        assert stats.censored_max_s == 60.0

    async def test_progress_refreshes_evidence(self, env: Env) -> None:
        """ToolProgress stores the fraction and expected end with their time."""
        await env.send(request(), response())
        await env.send(
            ToolProgress(session_id="s1", call_id="c0", ts=13.0, fraction=0.5, expected_end=14.0)
        )
        s = await env.store.get_session("s1")
        assert s is not None and s.tool is not None
        assert (s.tool.progress, s.tool.progress_ts, s.tool.expected_end) == (0.5, 13.0, 14.0)

    async def test_tool_event_for_unknown_session_creates_nothing(self, env: Env) -> None:
        """A tool start for a session the store does not know leaves no record behind."""
        await env.send(ToolStart(session_id="ghost", call_id="h", tool="Bash", started_at=1))
        assert await env.store.get_session("ghost") is None
        assert await env.store.pool_ids() == set()

    async def test_malformed_tool_message_is_dead_lettered(self, env: Env) -> None:
        """A payload that does not decode goes to the DLQ and later events still apply."""
        await env.bus.publish(subjects.tool_event("s1"), b'{"type":"ToolStart","session_id":1}')
        await env.send(request())
        dlq = [
            decode_message(d) for s, d, _ in env.bus.published if s == subjects.dead_letter("tools")
        ]
        assert len(dlq) == 1 and isinstance(dlq[0], DeadLetter)
        assert await env.store.get_session("s1") is not None

    async def test_admitted_tool_session_is_interrupt_candidate(self, env: Env) -> None:
        """An admitted session that enters a tool lands in the admitted-in-tool index."""
        await env.send(request())
        await admitted(env, "s1")
        await env.send(response())
        assert await env.store.admitted_tool_ids() == {"s1"}


class TestToolBatch:
    async def test_batch_applies_in_order_and_wakes_once(self, env: Env) -> None:
        """A batch with start and end of one call and a start of another session applies each
        in stream order, records the duration once and publishes one wake-up, which names the
        session whose call ended and the pooled one whose record the batch changed (the
        valuation reads only the sessions its wake-ups name)."""
        await env.send(request("s1"), request("s2"))
        before = len(env.wakes())
        d = Delivery(subjects.tool_event("s1"), {}, 1, None, 0.0)
        await env.handlers.on_tool_batch(
            [
                (ToolStart(session_id="s1", call_id="h1", tool="Bash", started_at=11.0), d),
                (ToolStart(session_id="s2", call_id="h9", tool="Read", started_at=11.0), d),
                (ToolEnd(session_id="s1", call_id="h1", ended_at=13.0, tool="Bash"), d),
            ]
        )
        s1, s2 = await env.store.get_session("s1"), await env.store.get_session("s2")
        assert s1 is not None and s1.tool is not None and s1.tool.completed_at == 13.0
        assert s2 is not None and s2.tool is not None and s2.tool.call_id == "h9"
        assert (await env.store.history()).of("Bash").count == 1
        wakes = env.wakes()[before:]
        assert [(w.reason, w.names()) for w in wakes] == [("tool_end", {"s1", "s2"})]
        assert await env.store.pool_ids() >= {"s2"}


class TestSessionBatch:
    async def test_end_splits_batch_in_order(self, env: Env) -> None:
        """In one batch, requests before a SessionEnd are applied before it and the end
        deletes its session; later events still apply; one wake-up per reason."""
        before = len(env.wakes())
        d = Delivery(subjects.session_event("request", "s1"), {}, 1, None, 0.0)
        await env.handlers.on_session_batch(
            [
                (request("s1"), d),
                (request("s2"), d),
                (SessionEnd(session_id="s1", ended_at=11.0), d),
                (request("s3"), d),
            ]
        )
        assert await env.store.get_session("s1") is None
        assert await env.store.pool_ids() == {"s2", "s3"}
        wakes = sorted((w.reason, w.session_id) for w in env.wakes()[before:])
        assert wakes == [("arrival", None), ("end", "s1")]


class TestDecoding:
    async def test_empty_session_id_is_dead_lettered(self, env: Env) -> None:
        """A tool event with an empty session id is dead-lettered at once, not retried."""
        await env.bus.publish(
            subjects.tool_event("x"),
            b'{"type":"ToolStart","session_id":"","call_id":"c","tool":"t","started_at":1}',
        )
        await env.bus.settle()
        dlq = [d for s, d, _ in env.bus.published if s == subjects.dead_letter("tools")]
        assert len(dlq) == 1
        assert b"session id" in dlq[0]


class _Killed(BaseException):
    """The process died (BaseException: no handler catches it)."""


class _DiesAfterFirstWrite:
    """A store that kills the process at its second write: what a SIGKILL between two store
    calls of one batch does."""

    _WRITES = frozenset(
        {"update_session", "update_session_with", "update_sessions", "update_sessions_with",
         "record_tool", "record_tools", "delete_session"}
    )  # fmt: skip

    def __init__(self, inner: FakeStore) -> None:
        self._inner = inner
        self._writes = 0

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if name not in self._WRITES:
            return attr

        async def write(*args: object, **kwargs: object) -> object:
            self._writes += 1
            if self._writes > 1:
                raise _Killed
            return await attr(*args, **kwargs)

        return write


class TestShards:
    async def test_each_session_is_handled_by_exactly_one_shard_in_order(self) -> None:
        """Three tools processes with TAO_SHARD 0/3, 1/3, 2/3 on one bus and store: every
        session's request, response, tool start and end are applied once, by its shard, in
        order (the records end as one process would leave them); each shard takes only its
        share."""
        bus = FakeBus()
        store = FakeStore()
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=100_000, healthy=True))
        shards = [(await start(store, bus, shard=Shard(i, 3)))[0] for i in range(3)]
        sids = [f"sess-{i}" for i in range(30)]
        for sid in sids:
            await bus.publish_msg(request(sid, "r1", 10.0))
            await bus.publish_msg(response(sid, "r1", 11.0))  # calls c0 (bash)
            await bus.publish_msg(ToolStart(session_id=sid, call_id="c0", tool="bash",
                                            started_at=11.5, source=SOURCE_HOOK))  # fmt: skip
            await bus.publish_msg(ToolEnd(session_id=sid, call_id="c0", ended_at=13.5,
                                          source=SOURCE_HOOK))  # fmt: skip
        await bus.settle()
        for sid in sids:
            s = await store.get_session(sid)
            assert s is not None and s.tool is not None, sid
            assert (s.tool.call_id, s.tool.completed_at, s.ended_calls) == ("c0", 13.5, ("c0",))
            assert s.version == 4  # request, response, start, end: each applied once
        owners = {sid: [i for i in range(3) if Shard(i, 3).owns(sid)] for sid in sids}
        assert all(len(o) == 1 for o in owners.values())
        for i, h in enumerate(shards):
            share = sum(1 for o in owners.values() if o == [i])
            assert h.handled == 4 * share  # its sessions' four events, nothing else
            assert h.foreign == 4 * (len(sids) - share)
        assert min(h.handled for h in shards) > 0  # 30 sessions spread over every shard
        await bus.drain()

    def test_the_shard_setting_and_consumer_names(self) -> None:
        assert Settings.from_env({"TAO_SHARD": "1/4"}).shard == Shard(1, 4)
        with pytest.raises(SettingsError, match="TAO_SHARD"):
            Settings.from_env({"TAO_SHARD": "4/4"})
        assert Shard().member("tools") == "tools"  # unsharded: the durables it always had
        assert Shard(1, 4).member("tools") == "tools-1of4"
