"""A trace-replay client that names no session, against two real vLLM engines (issue 40).

The client (``benchmarks.replay_client``) re-sends each conversation's history as its trace
recorded it (the trace's assistant text and tool calls, not what the tiny model answered),
then the trace's tool result after a tool gap, with no session header, as agentic-bench and
AIPerf's messages mode do. The tiny model is given no tools, so its answers carry no tool
call and each session waits on its client between turns.

Checked, with every number from vLLM: every turn is answered; without a header each
conversation keeps one session of its own, as with ``X-Session-ID``; and later turns find
their prefix cached in the engine (``usage.prompt_tokens_details.cached_tokens``) in both
modes. How close the two modes come in time and hit rate is measured, not asserted
(docs/harnesses.md, "Replay clients").
"""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.replay_client import ReplayRun, replay
from tests.real.conftest import Rig

pytestmark = pytest.mark.real

CONVERSATIONS = 4
TURNS = 3


async def _run(rig: Rig, *, header: bool, seed: int) -> ReplayRun:
    return await replay(
        rig.stack.gateway_url,
        "tiny",
        conversations=CONVERSATIONS,
        turns=TURNS,
        concurrency=CONVERSATIONS,
        header=header,
        gap_s=1.0,
        seed=seed,
        max_tokens=8,
        system_words=200,
        tag=f"real-{seed}",
    )


class TestReplayClient:
    """A no-header replay keeps one session per conversation and its cache, as with one."""

    async def test_no_header_replay_keeps_its_sessions(self, rig: Rig) -> None:
        async with asyncio.timeout(600):
            runs = [await _run(rig, header=h, seed=40 + n) for n, h in enumerate((True, False))]
        for run in runs:
            assert run.ok() == CONVERSATIONS * TURNS, (run.identity, run.turns)
            per = run.sessions_per_conversation()
            assert all(len(s) == 1 and None not in s for s in per.values()), per
            assert len({next(iter(s)) for s in per.values()}) == CONVERSATIONS
            assert run.hit_rate() > 0.3, (run.identity, run.hit_rate())
