"""Session continuation by content: the gateway's lookup at many live sessions.

Each live session has a conversation of ``--turns`` turns (a shared system prompt of
``--system-chars`` characters, then user messages, assistant answers, tool calls and results
of ``--turn-chars`` characters each) and one remembered tip. A lookup is what the gateway does
for a request that names no session: read the body's items (:func:`chat_items`), hash its exact
and loose chains (:func:`~services.gateway.continuation.conversation`) and claim a tip
(:meth:`Continuations.claim`: exact positions, then loose ones); after the answer it records the
new tip (:meth:`Continuations.answered`, timed with the lookup). Half the lookups
continue a live session, half are new conversations sharing only the system prompt (no tip:
the worst case, every position is looked up).

    .venv/bin/python -m benchmarks.continuation --sessions 10000 --lookups 20000

Prints p50 / p99 / max per lookup (µs), by the wall clock and by the thread's CPU time (which
leaves out the time the process waited for a core on a loaded machine), and the index's size.
Target: p99 < 1 ms at 10,000 live sessions (issue 30).
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from typing import Any

from services.gateway.continuation import Continuations, answer_items, chat_items
from services.gateway.continuation import conversation as chains


def _text(rng: random.Random, chars: int) -> str:
    return "".join(rng.choice("abcdefghij klmnop\n") for _ in range(chars))


def conversation(rng: random.Random, system: str, turns: int, chars: int) -> list[dict[str, Any]]:
    """A chat body's messages: system, then turns of user / assistant tool call / tool result."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": _text(rng, chars)},
    ]
    for n in range(turns - 1):
        call = {"id": f"c{n}", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
        messages.append(
            {"role": "assistant", "content": _text(rng, chars // 4), "tool_calls": [call]}
        )
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": _text(rng, chars)})
    return messages


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--turn-chars", type=int, default=400)
    parser.add_argument("--system-chars", type=int, default=8_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    system = _text(rng, args.system_chars)
    bodies = [
        conversation(rng, system, rng.randint(1, args.turns), args.turn_chars)
        for _ in range(args.sessions)
    ]
    tracemalloc.start()
    index = Continuations(ttl_s=1e9, max_sessions=args.sessions * 2)
    for s, messages in enumerate(bodies):
        index.begin(None, f"s{s}", 0.0)
        asked = chains(None, chat_items({"messages": messages}))
        assert asked is not None
        answer = _text(rng, args.turn_chars // 4)
        index.answered(f"s{s}", asked.tip(answer_items(answer, [])), 0.0)
        messages.append({"role": "assistant", "content": answer})
    memory = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    # The bodies are this script's own data (a gateway holds none of them): out of the
    # collector's way, so its pauses over them do not count as lookup time.
    gc.collect()
    gc.freeze()
    times: list[float] = []
    cpu: list[float] = []
    found = 0
    for n in range(args.lookups):
        s = rng.randrange(args.sessions)
        if n % 2 == 0:
            body = {"messages": [*bodies[s], {"role": "user", "content": "continue"}]}
        else:
            body = {"messages": conversation(rng, system, rng.randint(1, args.turns), 64)}
        t0, c0 = time.perf_counter(), time.thread_time()
        asked = chains(None, chat_items(body))
        assert asked is not None
        got = index.claim(None, asked.exact, 1.0, asked.loose)
        if got is not None:
            index.answered(got, asked.tip(answer_items("ok", [])), 1.0)
        cpu.append(time.thread_time() - c0)
        times.append(time.perf_counter() - t0)
        if got is not None:
            found += 1
            bodies[int(got[1:])] = [*body["messages"], {"role": "assistant", "content": "ok"}]
    times.sort()
    cpu.sort()

    def pct(p: float, of: list[float] | None = None) -> float:
        data = times if of is None else of
        return data[min(len(data) - 1, int(p * len(data)))] * 1e6

    print(
        f"sessions={args.sessions} lookups={args.lookups} turns<={args.turns} "
        f"system={args.system_chars} chars turn={args.turn_chars} chars"
    )
    print(f"found {found} of {args.lookups} (half continue a live session)")
    print(
        f"lookup + record, wall: p50 {pct(0.5):.0f} us, p99 {pct(0.99):.0f} us, "
        f"max {pct(1.0):.0f} us"
    )
    print(
        f"lookup + record, CPU (thread time, not counting preemption): p50 {pct(0.5, cpu):.0f} us, "
        f"p99 {pct(0.99, cpu):.0f} us, max {pct(1.0, cpu):.0f} us"
    )
    print(f"index memory (tracemalloc, while filling): {memory / args.sessions:.0f} B/session")


if __name__ == "__main__":
    main()
