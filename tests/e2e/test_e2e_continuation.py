"""Session continuation by content through the whole stack, with a stock ``openai`` client.

100 conversations run at once, each sending no session id at all; all of them start with the
same system prompt and the same first user message, so their first requests are identical and
only the answers (the sim node's output differs per request) tell them apart. Each runs three
turns, re-sending its whole conversation as an agent does. The gateway must give each
conversation one session of its own: every turn of a conversation in one session (read from
the ``X-TAO-Session-Id`` answer header), no two conversations in one session, and the
scheduler must see 100 sessions of three requests each.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest

from shared.contracts import SessionRequest, decode_session_event, subjects
from shared.infra import Delivery
from tests.e2e.conftest import E2E, StartStack, text

CONVERSATIONS = 100
TURNS = 3
SCRIPT = {"output_tokens": 6, "tool_call": None}


async def _conversation(api: Any, model: str, system: str, first: str, seed: int) -> list[str]:
    """Three turns of one conversation that names no session; the session of each turn."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": first},
    ]
    sessions: list[str] = []
    for turn in range(TURNS):
        raw = await api.chat.completions.with_raw_response.create(
            model=model, messages=messages, stream=turn % 2 == 1, extra_body={"tao_script": SCRIPT}
        )
        sessions.append(raw.headers["x-tao-session-id"])
        reply = raw.parse()
        if turn % 2 == 1:  # a stream: put the answer together as a client does
            content = ""
            async for chunk in reply:
                if chunk.choices and chunk.choices[0].delta.content:
                    content += chunk.choices[0].delta.content
        else:
            content = reply.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": content})
        messages.append({"role": "user", "content": text(rng, 4)})
    return sessions


@pytest.fixture(scope="module")
def roomy(e2e_factory: StartStack) -> E2E:
    """Two sim nodes with room for all 100 conversations at once (what is tested is identity,
    not contention)."""
    return e2e_factory(
        sim_nodes=2, kv_tokens=262_144, extra_env={"TAO_HOLD_TIMEOUT_S": "60", "TAO_TICK_S": "0.25"}
    )


async def test_no_false_merge_among_100_conversations_with_one_first_turn(roomy: E2E) -> None:
    e2e = roomy
    rng = random.Random(30)
    system, first = text(rng, 40), text(rng, 8)
    seen: list[SessionRequest] = []

    async with e2e.clients() as c:

        async def keep(msg: Any, delivery: Delivery) -> None:
            if isinstance(msg, SessionRequest):
                seen.append(msg)

        sub = await c.bus.subscribe(subjects.session_events(), "e2e", decode_session_event, keep)
        runs: list[list[str]] = []
        try:
            async with asyncio.timeout(240):
                runs = await asyncio.gather(
                    *(_conversation(c.api, c.model, system, first, n) for n in range(CONVERSATIONS))
                )
        finally:
            # The sessions stay open for a continuation: end them, so the stack's later tests
            # do not share the nodes with 100 idle sessions until the idle timeout.
            for sid in {s for run in runs for s in run}:
                await c.api.delete(f"/sessions/{sid}", cast_to=object)
            await sub.stop()
    per_conversation = [set(run) for run in runs]
    assert all(len(s) == 1 for s in per_conversation), "a conversation was split"
    owners = Counter(next(iter(s)) for s in per_conversation)
    assert len(owners) == CONVERSATIONS, "two conversations were merged into one session"
    mine = Counter(r.session_id for r in seen if r.session_id in owners)
    assert sorted(mine.values()) == [TURNS] * CONVERSATIONS
