"""A trace-replay agent client that names no session, against the gateway (issue 40, part 5).

Replay benchmarks of multi-turn agents (agentic-bench 0.2.0; AIPerf's messages mode) send each
turn's whole history as the trace recorded it: the assistant text and tool calls of the trace,
not the answer the model served, then the trace's tool result, after a tool gap. Sent with no
session header, the gateway can keep such a client's turns together only by content
(:mod:`services.gateway.continuation`, the loose match), and a session it splits off must not
hold room others wait for (``services.tools.steps``, ``AWAITING_CLIENT``).

:func:`replay` runs ``conversations`` such traces, ``concurrency`` at a time, each ``turns``
turns with ``gap_s`` seconds of tool time between them, with or without ``X-Session-ID``,
and reports every turn (status, the session the gateway put it in, prompt and cached tokens,
latency). The traces are seeded: the header run and the no-header run send the same
conversations. Every conversation shares one system prompt (an agent's instructions) and
starts with its own task.

Run against a gateway (simnodes or real engines)::

    python -m benchmarks.replay_client --url http://127.0.0.1:8000 --model tiny \\
        --conversations 20 --turns 5 --concurrency 10 --gap-s 2 --identity both

and it prints a row per identity mode (each on its own seed: no run finds another's
conversations cached): wall time, turns answered, sessions, split conversations, the prefix
hit rate (cached / prompt tokens over turns after the first), mean and max turn latency.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

__all__ = [
    "COLUMNS",
    "WORDS",
    "ReplayRun",
    "TurnResult",
    "add_load_arguments",
    "load_of",
    "main",
    "print_header",
    "replay",
    "row",
    "trace",
]

WORDS: Final = (
    "def",
    "class",
    "return",
    "import",
    "value",
    "error",
    "test",
    "file",
    "module",
    "data",
    "self",
    "None",
    "True",
    "False",
    "for",
    "in",
    "while",
    "with",
    "open",
    "read",
    "write",
    "print",
    "list",
    "dict",
    "set",
    "tuple",
    "int",
    "str",
    "float",
    "async",
    "await",
    "yield",
)
SESSION_ANSWER_HEADER: Final = "X-TAO-Session-Id"


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass(frozen=True, slots=True)
class Step:
    """One recorded turn: the user's (or tool's) message that opens it, and the assistant's
    recorded reply (text and, but for the last turn, one tool call)."""

    opening: dict[str, Any]
    reply: dict[str, Any]


def trace(seed: int, conversation: int, turns: int, *, system_words: int = 300) -> list[Step]:
    """The recorded turns of one conversation (seeded; the system prompt is the same for
    every conversation of a seed)."""
    shared = random.Random(seed)
    system = _text(shared, system_words)
    rng = random.Random(f"{seed}:{conversation}")
    steps: list[Step] = []
    for t in range(turns):
        if t == 0:
            opening: dict[str, Any] = {"role": "user", "content": _text(rng, 40)}
        else:
            opening = {"role": "tool", "tool_call_id": f"call-{t - 1}", "content": _text(rng, 60)}
        reply: dict[str, Any] = {"role": "assistant", "content": _text(rng, 12)}
        if t < turns - 1:
            args = json.dumps({"cmd": _text(rng, 4)})
            reply["tool_calls"] = [
                {
                    "id": f"call-{t}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": args},
                }
            ]
        steps.append(Step(opening, reply))
    return [Step({"role": "system", "content": system}, {}), *steps]


@dataclass(frozen=True, slots=True)
class TurnResult:
    conversation: int
    turn: int
    status: int
    session: str | None
    prompt_tokens: int
    cached_tokens: int
    latency_s: float


@dataclass(slots=True)
class ReplayRun:
    """Every turn of one replay, and its wall time."""

    identity: str
    wall_s: float = 0.0
    turns: list[TurnResult] = field(default_factory=list)

    def sessions_per_conversation(self) -> dict[int, set[str | None]]:
        out: dict[int, set[str | None]] = {}
        for t in self.turns:
            out.setdefault(t.conversation, set()).add(t.session)
        return out

    def hit_rate(self) -> float:
        """Cached / prompt tokens over the turns after each conversation's first."""
        later = [t for t in self.turns if t.turn > 0 and t.status == 200]
        prompt = sum(t.prompt_tokens for t in later)
        return sum(t.cached_tokens for t in later) / prompt if prompt else 0.0

    def ok(self) -> int:
        return sum(t.status == 200 for t in self.turns)


def _usage(body: Mapping[str, Any]) -> tuple[int, int]:
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return int(usage.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0)


async def _conversation(
    http: aiohttp.ClientSession,
    url: str,
    model: str,
    n: int,
    steps: Sequence[Step],
    *,
    header: bool,
    gap_s: float,
    max_tokens: int,
    extra: Mapping[str, Any],
    tag: str,
) -> list[TurnResult]:
    messages: list[dict[str, Any]] = [steps[0].opening]
    out: list[TurnResult] = []
    headers = {"X-Session-ID": f"{tag}-conv-{n}"} if header else {}
    for t, step in enumerate(steps[1:]):
        if t > 0:
            await asyncio.sleep(gap_s)  # the tool runs
        messages.append(step.opening)
        body = {"model": model, "messages": messages, "max_tokens": max_tokens, **extra}
        started = time.perf_counter()
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
            data = await resp.json(content_type=None)
            status = resp.status
            session = resp.headers.get(SESSION_ANSWER_HEADER)
        prompt, cached = _usage(data if isinstance(data, dict) else {})
        latency = time.perf_counter() - started
        out.append(TurnResult(n, t, status, session, prompt, cached, latency))
        if status != 200:
            break
        messages.append(step.reply)  # the trace's reply, not the served one
    return out


async def replay(
    url: str,
    model: str,
    *,
    conversations: int,
    turns: int,
    concurrency: int,
    header: bool,
    gap_s: float = 1.0,
    seed: int = 0,
    max_tokens: int = 8,
    extra: Mapping[str, Any] | None = None,
    api_key: str | None = None,
    system_words: int = 300,
    tag: str = "replay",
) -> ReplayRun:
    """Replay ``conversations`` traces (module docstring); ``extra``: body fields added to
    every request (a simnode's ``tao_script``)."""
    run = ReplayRun("header" if header else "none")
    gate = asyncio.Semaphore(concurrency)
    auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)

    async with aiohttp.ClientSession(timeout=timeout, headers=auth) as http:

        async def one(n: int) -> list[TurnResult]:
            async with gate:
                steps = trace(seed, n, turns, system_words=system_words)
                return await _conversation(
                    http,
                    url.rstrip("/"),
                    model,
                    n,
                    steps,
                    header=header,
                    gap_s=gap_s,
                    max_tokens=max_tokens,
                    extra=extra or {},
                    tag=tag,
                )

        started = time.perf_counter()
        for turns_of in await asyncio.gather(*(one(n) for n in range(conversations))):
            run.turns.extend(turns_of)
        run.wall_s = time.perf_counter() - started
    return run


COLUMNS: Final = (
    "identity",
    "seed",
    "wall s",
    "turns ok",
    "sessions",
    "split conversations",
    "hit rate",
    "mean latency s",
    "max latency s",
)
"""The columns of :func:`row`."""


def row(run: ReplayRun, seed: int) -> str:
    """One run as a Markdown table row of :data:`COLUMNS`."""
    per = run.sessions_per_conversation()
    sessions = len({s for ss in per.values() for s in ss if s is not None})
    split = sum(len(s) > 1 for s in per.values())
    lat = [t.latency_s for t in run.turns] or [0.0]
    return (
        f"| {run.identity} | {seed} | {run.wall_s:.1f} | {run.ok()}/{len(run.turns)} | "
        f"{sessions} | {split} | {100 * run.hit_rate():.1f} % | "
        f"{sum(lat) / len(lat):.2f} | {max(lat):.2f} |"
    )


def print_header() -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))


def add_load_arguments(p: argparse.ArgumentParser) -> None:
    """The replay load's options (:func:`load_of` reads them)."""
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=10)
    p.add_argument("--gap-s", type=float, default=2.0)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--system-words", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)


def load_of(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of :func:`replay` that :func:`add_load_arguments` sets (not the
    seed)."""
    return {
        "conversations": args.conversations,
        "turns": args.turns,
        "concurrency": args.concurrency,
        "gap_s": args.gap_s,
        "max_tokens": args.max_tokens,
        "system_words": args.system_words,
    }


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--model", required=True)
    add_load_arguments(p)
    p.add_argument("--identity", choices=("header", "none", "both"), default="both")
    p.add_argument("--api-key", default=None)
    p.add_argument("--json", action="store_true", help="print every turn as JSON lines too")
    args = p.parse_args(argv)
    modes = {"header": [True], "none": [False], "both": [True, False]}[args.identity]
    print_header()
    for k, header in enumerate(modes):
        seed = args.seed + k  # each run its own conversations: none finds another's cached
        run = asyncio.run(
            replay(
                args.url,
                args.model,
                **load_of(args),
                header=header,
                seed=seed,
                api_key=args.api_key,
                tag=f"replay-{seed}-{int(time.time())}",
            )
        )
        print(row(run, seed), flush=True)
        if args.json:
            for t in run.turns:
                print(json.dumps({"identity": run.identity, **t.__dict__}))


if __name__ == "__main__":
    main()
