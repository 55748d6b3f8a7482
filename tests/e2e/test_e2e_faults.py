"""Faults on the whole stack: a malformed tool event, and the tools service crashing mid-run.

Both on the main stack (see conftest): agent sessions through the gateway with the real
``openai`` client, tool events reported on NATS as harness hooks would.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from shared.contracts import SessionRequest, decode, decode_session_event, subjects
from shared.contracts.deadletter import DeadLetter
from shared.infra import Delivery

GARBAGE = b"\x00\xff{not a tool event"
DEADLINE_S = 30.0
RUN_DEADLINE_S = 90.0


class TestDeadLetter:
    async def test_malformed_tool_event_dead_lettered_and_stack_goes_on(self, e2e: Any) -> None:
        """Garbage on a tool subject lands on the tools DLQ with its bytes; the tools service
        keeps running and a later session's hook events still apply end to end."""
        tag = uuid.uuid4().hex[:8]
        subject = subjects.tool_event(f"x{tag}")
        letters: asyncio.Queue[DeadLetter] = asyncio.Queue()

        async def on_letter(letter: DeadLetter, d: Delivery) -> None:
            if letter.subject == subject:
                await letters.put(letter)

        async with e2e.clients() as c:
            await c.bus.consume(
                subjects.STREAM_DLQ,
                "e2e-dlq",
                lambda b: decode(b, DeadLetter),
                on_letter,
                filter_subject=subjects.dead_letter("tools"),
                ephemeral=True,
            )
            await c.bus.publish(subject, GARBAGE)
            letter = await asyncio.wait_for(letters.get(), DEADLINE_S)
            assert (letter.service, letter.payload) == ("tools", GARBAGE)
            assert letter.reason

            tool = f"after-dlq-{tag}"
            sid = f"after-{tag}"
            turns = await c.agent(sid, turns=2, stream=False, tool=tool, seed=7)
            assert [t.finish_reason for t in turns] == ["tool_calls", "stop"]
            await c.await_session(sid, lambda s: s is None, "deleted after its end")
            assert (await c.store().history()).of(tool).count == 1
        assert e2e.proc("tools").poll() is None, f"tools exited (log: {e2e.log_dir})"


class TestToolsCrash:
    async def test_tools_killed_mid_run_loses_no_event(self, e2e: Any) -> None:
        """SIGKILL the tools service while sessions run and new ones arrive; after a restart
        every request is answered (the newcomers are admitted), every hook ToolEnd is recorded
        once, and every session end is applied."""
        tag = uuid.uuid4().hex[:8]
        tool = f"outage-{tag}"
        running = [f"run-{tag}-{i}" for i in range(3)]
        late = [f"late-{tag}-{i}" for i in range(3)]
        first_turn = {sid: asyncio.Event() for sid in running}
        requested: asyncio.Queue[str] = asyncio.Queue()

        async def on_event(ev: Any, d: Delivery) -> None:
            if isinstance(ev, SessionRequest) and ev.session_id in late:
                await requested.put(ev.session_id)

        def mark(sid: str) -> Any:
            return lambda turn: first_turn[sid].set() if turn == 0 else None

        async with e2e.clients() as c:
            await c.bus.subscribe(
                subjects.session_events(), "e2e-watch", decode_session_event, on_event
            )
            tasks = [
                asyncio.create_task(
                    c.agent(
                        sid,
                        turns=3,
                        stream=i % 2 == 0,
                        tool=tool,
                        seed=100 + i,
                        after_turn=mark(sid),
                    )
                )
                for i, sid in enumerate(running)
            ]
            async with asyncio.timeout(DEADLINE_S):
                await asyncio.gather(*(ev.wait() for ev in first_turn.values()))
            e2e.kill("tools")  # mid-run: the sessions go on with their tools and next turns
            tasks += [
                asyncio.create_task(
                    c.agent(sid, turns=2, stream=i % 2 == 1, tool=tool, seed=200 + i)
                )
                for i, sid in enumerate(late)
            ]
            async with asyncio.timeout(DEADLINE_S):
                seen = {await requested.get() for _ in late}
            assert seen == set(late)
            for sid in late:  # registered on the bus, but nobody has processed it yet
                assert await c.store().get_session(sid) is None
            assert not any(t.done() for t in tasks[len(running) :])
            e2e.respawn("tools")
            async with asyncio.timeout(RUN_DEADLINE_S):
                results = await asyncio.gather(*tasks)
            for sid, turns in zip(running + late, results, strict=True):
                want = 3 if sid in running else 2
                assert [t.finish_reason for t in turns] == ["tool_calls"] * (want - 1) + ["stop"]
            for sid in running + late:
                await c.await_session(sid, lambda s: s is None, "deleted after its end")
            recorded = (await c.store().history()).of(tool).count
            assert recorded == len(running) * 2 + len(late) * 1
        assert e2e.proc("tools").poll() is None, f"restarted tools exited (log: {e2e.log_dir})"
