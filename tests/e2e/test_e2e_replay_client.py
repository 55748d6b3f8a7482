"""A trace-replay client that names no session, through the whole stack (issue 40, part 5).

The client (``benchmarks.replay_client``) re-sends each conversation's history as its trace
recorded it: the trace's assistant text and tool calls, not the answers the sim node served,
then the trace's tool result after a tool gap, with no session header. The served answers
carry no tool call (as a model not given the trace's tools answers), so after each turn a
session waits on its client. One sim node with room for about two such sessions.

Checked: each conversation keeps one session of its own without a header, as with one; and
sessions whose client left after one turn (abandoned, or split off) do not keep the room the
replay needs: without their release every replay turn would wait out the hold timeout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.replay_client import ReplayRun, replay
from tests.e2e.conftest import E2E, StartStack

SCRIPT = {"tao_script": {"output_tokens": 6, "tool_call": None}}
SYSTEM_WORDS = 900
"""Each conversation's prompt: about 1,000 tokens, 1,500 with the reserve (one per word)."""
HOLD_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def small(e2e_factory: StartStack) -> E2E:
    """One sim node of 4,096 tokens: two abandoned sessions leave too little for a third."""
    return e2e_factory(
        sim_nodes=1,
        kv_tokens=4096,
        extra_env={
            "TAO_HOLD_TIMEOUT_S": str(HOLD_TIMEOUT_S),
            "TAO_TICK_S": "0.25",
            "TAO_IDLE_TIMEOUT_S": "900",
        },
    )


async def _replay(e2e: E2E, *, seed: int, conversations: int, turns: int, header: bool) -> Any:
    return await replay(
        e2e.gateway,
        "tao-sim",
        conversations=conversations,
        turns=turns,
        concurrency=conversations,
        header=header,
        gap_s=0.5,
        seed=seed,
        extra=SCRIPT,
        system_words=SYSTEM_WORDS,
        tag=f"e2e-{seed}",
    )


def _one_session_each(run: ReplayRun, conversations: int) -> None:
    per = run.sessions_per_conversation()
    assert len(per) == conversations
    assert all(len(s) == 1 and None not in s for s in per.values()), per
    assert len({next(iter(s)) for s in per.values()}) == conversations, "conversations merged"


async def test_abandoned_sessions_do_not_keep_the_room(small: E2E) -> None:
    """Two one-turn replays whose client then leaves hold most of the node; a three-turn
    replay of two conversations after them is served, every turn, each conversation in one
    session; the abandoned sessions were released (not ended: their idle timeout is 900 s)."""
    async with asyncio.timeout(4 * HOLD_TIMEOUT_S):
        left = [
            await _replay(small, seed=100 + n, conversations=1, turns=1, header=False)
            for n in range(2)
        ]
        abandoned = {t.session for run in left for t in run.turns}
        assert all(run.ok() == 1 for run in left) and len(abandoned) == 2
        run = await _replay(small, seed=7, conversations=2, turns=3, header=False)
    assert run.ok() == 6, [(t.conversation, t.turn, t.status) for t in run.turns]
    _one_session_each(run, 2)
    async with small.clients() as c:
        snap = await c.snapshot()
        for sid in abandoned:
            s = snap.sessions.get(str(sid))
            assert s is not None and not s.ended and s.node is None, s
            await c.api.delete(f"/sessions/{sid}", cast_to=object)
        for sid in {t.session for t in run.turns}:
            await c.api.delete(f"/sessions/{sid}", cast_to=object)


async def test_a_replay_without_header_keeps_its_sessions_as_with_one(small: E2E) -> None:
    """The same load with and without ``X-Session-ID``: every turn answered, one session per
    conversation, and later turns reuse their prefix in both."""
    runs: list[ReplayRun] = []
    async with asyncio.timeout(4 * HOLD_TIMEOUT_S):
        for n, header in enumerate((True, False)):
            runs.append(await _replay(small, seed=20 + n, conversations=2, turns=3, header=header))
    async with small.clients() as c:
        for sid in {t.session for run in runs for t in run.turns}:
            await c.api.delete(f"/sessions/{sid}", cast_to=object)
    for run in runs:
        assert run.ok() == 6, (run.identity, [(t.turn, t.status) for t in run.turns])
        _one_session_each(run, 2)
        assert run.hit_rate() > 0.5, (run.identity, run.hit_rate())
