"""``tao demo``: bring the stack up and drive agent sessions through it, once per policy.

For each policy (``tao``, ``thunderagent`` and ``thunderagent-ideal`` by default: TAO against
ThunderAgent's router as its code runs and against its idealised variant, both driven by the
planner through :mod:`shared.core.thunder`) the demo starts a fresh stack
(:mod:`shared.cli.stack`: embedded NATS + Valkey unless ``TAO_NATS_URL`` / ``TAO_REDIS_URL``
are set, two simulated vLLM nodes, the five services) and runs ``--sessions`` agent sessions
concurrently with the unmodified ``openai`` client through the gateway. Each session is a
coding-agent task: a system prompt and a task, then ``--turns`` model calls; every call but the
last asks (through the simnode's scripted replies) for a tool call, the session "runs" the tool
by sleeping for a duration drawn from a realistic mix, and reports the tool start and end on
NATS exactly as a harness hook would (``ToolStart`` / ``ToolEnd``, ``source="hook"``). The tool
result is appended to the conversation, so each turn's prompt extends the previous one and the
node's prefix cache can serve it — if the session comes back to the node that holds it.

Tool calls: drawn from a measured family's mix (``--workload``, default ``claude-code``: TraceLab's
Claude Code/Codex tool times — Read, Edit, Grep, Glob, Bash, ``Bash:test`` and ``Task``, p50
0.3 s, p99 3.6 min, the calls over a minute holding most tool time; :mod:`shared.sim.workloads`
cites every figure), the durations divided by ``--tool-scale`` (10) so that a run fits a few
minutes on two cores: the shape, and so what a tool-aware scheduler can win, is kept; only the
clock is faster. ``--workload short`` is the earlier demos' mix: lognormal with median 0.4 s and
p90 0.7 s plus a 5 % tail of 5 s calls, one tool named ``bash``, under which the policies come
out level (the tools are too short to be worth releasing). Output lengths 50–300 tokens per
turn; tool outputs 200–1,500 tokens. The nodes' KV capacity is deliberately small
(``--kv-tokens``) so that the sessions contend for it, which is when a scheduler matters.

With ``--trace FILE`` the sessions are a recorded session trace instead (docs/evaluation.md,
"Session-trace JSONL"; ``tao trace import`` makes one from mini-swe-agent, Claude Code or
OpenCode logs): each session starts at its recorded arrival, turn 0 sends its recorded prompt
(the family's shared prefix as the system message, then turn 0's growth), every call asks for
its recorded output length and tool, the tool "runs" for its recorded duration, and the tool
result (or, after a turn without a tool, a user message) adds the next turn's recorded prompt
growth. Arrivals and tool durations are divided by ``--time-scale``, as the simnodes' engine
time is; ``--sessions`` / ``--turns`` cap the sessions replayed and the turns per session.

No policy is timed on a cold stack: before its timed sessions, each run warms its stack
(:func:`_warm_up`, whose requests are neither timed nor counted). Its stack was already ready
when it started (the planner's kernels loaded and planning: ``/readyz``); the warm-up then sends
short one-turn requests, a round at a time, until every node has served one (the simnodes'
block-pool kernels load at a node's first request), so each request was also admitted by a
plan round. The planner counters are read after the warm-up and reported as the difference.
It prints one line per run (``warmed up: N requests, nodes ..., X s, not timed``) and the JSON
rows carry ``warmup_requests`` / ``warmup_nodes`` / ``warmup_s``; so the first column is never
penalised for running first.

Measured per policy (all from the client side, except the planner counters, read from Redis,
and the releases, read from the planner's round log): tasks done, makespan (the timed run's
wall time), task latency mean / p99, TTFT mean / p50 / p99 (first streamed chunk) and the TTFT
p50 of later turns whose prompt was over 80 % cached, tool end → first
token mean (the time from reporting the tool's end to the next call's first token), prefix cache
hit rate (Σ cached / Σ prompt tokens from ``usage``), interrupts per tool call (the planner's
``sessions_interrupted`` over the tool calls the sessions ran), node moves per session (turns
served by another node than the session's previous turn, read from the gateway's
``X-TAO-Node`` answer header, else from the completion id a simnode gives,
``chatcmpl-<node>-<n>``; ``-`` when neither names the node), plans applied / discarded, and
the releases the planner's rounds applied with how many of them recomputed more seconds than
holding the room would have cost (:func:`shared.core.explain.audit_releases`: the session's
next request's uncached tokens at the node's price, against the time until it was sent).

With ``--identity none`` the sessions send no session id at all (no ``X-Session-ID``, no
``user``), as a stock ``openai`` client does: the gateway keeps each session together by its
conversation (services.gateway.continuation) and names it in each answer's
``X-TAO-Session-Id``, under which the demo reports its tool events and ends it.

The clients send ``TAO_GATEWAY_KEY`` (or ``TAO_GATEWAY_KEY_FILE``'s content) as their key, for
a gateway that asks for one (``--against`` a compose gateway, which listens beyond loopback).

With ``--nodes-file FILE`` (``tao engines up`` writes one) the stacks front those real nodes
instead of simnodes, and each policy's run first empties their prefix caches (vLLM's
``POST /reset_prefix_cache``). A real model ignores the scripted replies: it writes
``max_tokens`` of its own text and calls no tool, so the session runs the planned tool itself
and sends its result as a user message.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import numpy as np
import orjson

from shared.cli.ops import OpsError
from shared.cli.stack import Stack, StackConfig, StackError
from shared.contracts import ToolEnd, ToolStart
from shared.core.engine import DEFAULT_PROFILE, PROFILES
from shared.core.explain import (
    ExplainError,
    ReleaseAudit,
    TurnSeen,
    audit_releases,
    rounds_from_lines,
)
from shared.core.policies import POLICY_NAMES
from shared.infra.access import Access, write_access_dir
from shared.infra.embedded import EmbeddedServers
from shared.sim.workloads import BUILTIN, ToolSpec, load_workload
from shared.tables import render, signed

if TYPE_CHECKING:
    from shared.infra.settings import NodeSpec
    from shared.sim.workloads import Task

__all__ = ["DemoResult", "add_demo_parser", "demo_table", "filler_text"]

_NODE_HEADER = "X-TAO-Node"  # the gateway names the serving node (services.gateway.proxy)
_SESSION_HEADER = "X-TAO-Session-Id"  # ... and the session it served the turn in

_WORDS = [
    "the",
    "file",
    "test",
    "module",
    "function",
    "error",
    "value",
    "return",
    "import",
    "class",
    "self",
    "data",
    "path",
    "line",
    "config",
    "build",
    "run",
    "check",
    "patch",
    "diff",
    "repo",
    "issue",
    "fix",
    "assert",
    "output",
    "result",
    "call",
    "args",
]
TOOL_MEDIAN_S = 0.4
TOOL_P90_S = 0.7
TOOL_TAIL_P = 0.05
TOOL_TAIL_S = 5.0


DEMO_WORKLOAD = "claude-code"
"""The family whose measured tool mix the built-in sessions run by default."""
DEMO_TOOL_SCALE = 10.0
"""Its tool times are divided by this, so that a demo fits a few minutes on two cores."""


class DemoError(OpsError):
    """The demo could not run: one line, exit 2."""


@dataclass
class DemoResult:
    """What one policy's run measured."""

    policy: str
    sessions: int
    tasks_done: int = 0
    latencies: list[float] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    tool_to_token: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tool_calls: int = 0
    node_moves: int = 0
    served_known: bool = False
    """Some completion named the node that served it (simnode ids): node moves are known."""
    errors: list[str] = field(default_factory=list)
    planner: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    repeat: int = 0
    """Which of ``--repeat`` runs this is (0-based; its workload seed is ``--seed`` + it)."""
    warmup_requests: int = 0
    """Untimed requests sent before the timed sessions (:func:`_warm_up`)."""
    warmup_nodes: list[str] = field(default_factory=list)
    """The nodes that served a warm-up request (by the gateway's node header)."""
    warmup_s: float = 0.0
    seen: list[TurnSeen] = field(default_factory=list)
    """Every timed request: its session, when it was sent (epoch s), prompt and cached tokens."""
    hit_ttfts: list[float] = field(default_factory=list)
    """TTFT of later turns (not a session's first) whose prompt was mostly cached (> 80 %)."""
    audit: ReleaseAudit | None = None
    """The planner's releases judged against the sessions' next requests (its round log)."""

    def row(self) -> dict[str, Any]:
        """The table row / JSON object of this run."""
        return {
            "policy": self.policy,
            "tasks_done": self.tasks_done,
            "sessions": self.sessions,
            "turns": len(self.ttfts),
            "latency_mean_s": _mean(self.latencies),
            "latency_p99_s": _p99(self.latencies),
            "ttft_mean_s": _mean(self.ttfts),
            "ttft_p50_s": _pct(self.ttfts, 0.5),
            "ttft_p99_s": _p99(self.ttfts),
            "hit_ttft_p50_s": _pct(self.hit_ttfts, 0.5),
            "tool_end_to_first_token_mean_s": _mean(self.tool_to_token),
            "cache_hit_rate": self.cached_tokens / self.prompt_tokens
            if self.prompt_tokens
            else None,
            "interrupts_per_tool_call": _ratio(
                self.planner.get("sessions_interrupted"), self.tool_calls
            ),
            "releases_applied": None if self.audit is None else self.audit.applied,
            "releases_costly": None if self.audit is None else self.audit.costly,
            "node_moves_per_session": self.node_moves / self.sessions
            if self.served_known and self.sessions
            else None,
            "plans_applied": self.planner.get("plans_applied"),
            "plans_discarded": self.planner.get("plans_discarded"),
            "errors": len(self.errors),
            "wall_s": self.wall_s,
            "repeat": self.repeat,
            "warmup_requests": self.warmup_requests,
            "warmup_nodes": self.warmup_nodes,
            "warmup_s": self.warmup_s,
        }


def _ratio(num: object, den: int) -> float | None:
    return float(num) / den if isinstance(num, int) and den > 0 else None


def served_by(completion_id: str | None) -> str | None:
    """The node named by a simnode's completion id ``chatcmpl-<node>-<n>``, else ``None``."""
    if not completion_id or not completion_id.startswith("chatcmpl-"):
        return None
    node, sep, seq = completion_id[len("chatcmpl-") :].rpartition("-")
    return node if sep and node and seq.isdigit() else None


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _p99(xs: Sequence[float]) -> float | None:
    return _pct(xs, 0.99)


def _pct(xs: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile."""
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def tool_duration(rng: random.Random) -> float:
    """A tool duration: the lognormal body (median 0.4 s, p90 0.7 s) or the 5 s tail (the
    demo's load before it followed a measured family: ``--workload short``)."""
    if rng.random() < TOOL_TAIL_P:
        return TOOL_TAIL_S
    sigma = math.log(TOOL_P90_S / TOOL_MEDIAN_S) / 1.2816
    return rng.lognormvariate(math.log(TOOL_MEDIAN_S), sigma)


def family_tool(tools: Sequence[ToolSpec], scale: float, rng: random.Random) -> tuple[str, float]:
    """A tool call drawn from a workload family's measured mix (:mod:`shared.sim.workloads`):
    its name, and its duration divided by ``scale``."""
    spec = rng.choices(tools, weights=[t.weight for t in tools])[0]
    draw = spec.duration.sample(np.random.default_rng(rng.getrandbits(64)))
    if spec.timeout is not None:
        draw = min(draw, spec.timeout)
    return spec.name, max(0.0, draw) / scale


def filler_text(rng: random.Random, tokens: int) -> str:
    """``tokens`` words of filler (one token each for the tiny model and the simnodes)."""
    return " ".join(rng.choice(_WORDS) for _ in range(tokens))


# -- what a session sends --------------------------------------------------------------------------


class _Script(Protocol):
    """One session's content: opening messages, then per turn the output length, the tool (name,
    seconds to run; None for no tool) and the text the tool result (or next prompt) adds."""

    @property
    def turns(self) -> int: ...

    @property
    def delay_s(self) -> float: ...

    def opening(self, rng: random.Random) -> list[dict[str, Any]]: ...

    def output_tokens(self, turn: int, rng: random.Random) -> int: ...

    def tool(self, turn: int, rng: random.Random) -> tuple[str, float] | None: ...

    def observation(self, turn: int, rng: random.Random) -> str: ...


@dataclass(frozen=True)
class _RandomScript:
    """The built-in coding-agent task of the module docstring."""

    index: int
    turns: int
    delay_s: float = 0.0
    tools: tuple[ToolSpec, ...] = ()
    """The family whose measured tool mix the session draws from (empty: the short mix of
    :func:`tool_duration`, one tool named ``bash``)."""
    tool_scale: float = 1.0

    def opening(self, rng: random.Random) -> list[dict[str, Any]]:
        return [
            {
                "role": "system",
                "content": f"You are coding agent {self.index}. " + filler_text(rng, 1500),
            },
            {"role": "user", "content": "Fix the failing test. " + filler_text(rng, 300)},
        ]

    def output_tokens(self, turn: int, rng: random.Random) -> int:
        return rng.randint(50, 300)

    def tool(self, turn: int, rng: random.Random) -> tuple[str, float] | None:
        if self.tools:
            return family_tool(self.tools, self.tool_scale, rng)
        return "bash", tool_duration(rng)

    def observation(self, turn: int, rng: random.Random) -> str:
        return filler_text(rng, rng.randint(200, 1500))


@dataclass(frozen=True)
class _TraceScript:
    """One recorded session (``--trace``); arrival and tool times divided by ``time_scale``."""

    task: Task
    turns: int
    time_scale: float

    @property
    def delay_s(self) -> float:
        return (self.task.arrival or 0.0) / self.time_scale

    def opening(self, rng: random.Random) -> list[dict[str, Any]]:
        msgs: list[dict[str, Any]] = []
        if self.task.shared_prefix:  # the same text for every session of the family
            prefix = filler_text(random.Random(self.task.family), self.task.shared_prefix)
            msgs.append({"role": "system", "content": prefix})
        msgs.append({"role": "user", "content": filler_text(rng, self.task.turns[0].added)})
        return msgs

    def output_tokens(self, turn: int, rng: random.Random) -> int:
        return self.task.turns[turn].output

    def tool(self, turn: int, rng: random.Random) -> tuple[str, float] | None:
        t = self.task.turns[turn]
        return None if t.tool is None else (t.tool, t.duration / self.time_scale)

    def observation(self, turn: int, rng: random.Random) -> str:
        return filler_text(rng, self.task.turns[turn + 1].added)


def _script(index: int, args: argparse.Namespace) -> _Script:
    tasks: list[Task] | None = args.trace_tasks
    if tasks is None:
        return _RandomScript(index, args.turns, tools=args.family_tools, tool_scale=args.tool_scale)
    task = tasks[index]
    turns = min(len(task.turns), args.turns or len(task.turns))
    return _TraceScript(task, turns, args.time_scale)


# -- one session ---------------------------------------------------------------------------------


@dataclass
class _Turn:
    """One streamed model answer as the demo's agent reads it."""

    sent: float
    first: float | None = None
    usage: Any = None
    sent_wall: float = 0.0
    """When it was sent, epoch seconds (the planner's rounds are stamped so)."""
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    content: list[str] = field(default_factory=list)
    served: str | None = None
    session: str | None = None
    """The session the gateway served the turn in (``X-TAO-Session-Id``)."""

    def message(self) -> dict[str, Any]:
        """The assistant message for the next request's history."""
        assistant: dict[str, Any] = {"role": "assistant", "content": "".join(self.content) or None}
        if self.tool_calls:
            assistant["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["args"]},
                }
                for c in self.tool_calls.values()
            ]
        return assistant


async def _stream_turn(
    client: Any, args: argparse.Namespace, sid: str, messages: list[Any], reply: dict[str, Any]
) -> _Turn:
    """Send one chat request of session ``sid`` (scripted by ``reply``) and read its stream."""
    turn = _Turn(sent=time.monotonic(), sent_wall=time.time())
    named = getattr(args, "identity", "header") == "header"
    raw = await client.chat.completions.with_raw_response.create(
        model=args.model,
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=reply["output_tokens"],
        extra_headers={"X-Session-ID": sid} if named else {},
        extra_body={"tao_script": reply},
    )
    turn.served = raw.headers.get(_NODE_HEADER)
    turn.session = raw.headers.get(_SESSION_HEADER)
    stream = raw.parse()
    async for chunk in stream:
        turn.served = turn.served or served_by(getattr(chunk, "id", None))
        if chunk.usage is not None:
            turn.usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if turn.first is None and (delta.content or delta.tool_calls):
                turn.first = time.monotonic()
            if delta.content:
                turn.content.append(delta.content)
            for tc in delta.tool_calls or ():
                slot = turn.tool_calls.setdefault(tc.index, {"id": "", "name": "", "args": ""})
                slot["id"] = tc.id or slot["id"]
                if tc.function is not None:
                    slot["name"] = tc.function.name or slot["name"]
                    slot["args"] += tc.function.arguments or ""
    return turn


def _count_turn(
    result: DemoResult,
    turn: _Turn,
    node: str | None,
    tool_end_at: float | None,
    sid: str = "",
    later: bool = False,
) -> str | None:
    """Add ``turn``'s TTFT, node move and prompt tokens to ``result``; the node it ran on.
    ``later``: not the session's first turn (its TTFT counts as a cache hit's when most of
    its prompt was cached)."""
    if turn.served is not None:
        result.served_known = True
        if node is not None and turn.served != node:
            result.node_moves += 1
        node = turn.served
    if turn.first is not None:
        result.ttfts.append(turn.first - turn.sent)
        if tool_end_at is not None:
            result.tool_to_token.append(turn.first - tool_end_at)
    if turn.usage is not None:
        prompt = turn.usage.prompt_tokens
        details = getattr(turn.usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", 0) or 0
        result.prompt_tokens += prompt
        result.cached_tokens += cached
        result.seen.append(TurnSeen(sid, turn.sent_wall, prompt, cached))
        if later and turn.first is not None and prompt and cached > 0.8 * prompt:
            result.hit_ttfts.append(turn.first - turn.sent)
    return node


async def _run_tool(bus: Any, sid: str, call_id: str, name: str, duration: float) -> None:
    """Run the tool (a sleep), telling TAO its start and end as a harness hook would."""
    began = time.time()
    await bus.publish_msg(
        ToolStart(
            session_id=sid,
            call_id=call_id,
            tool=name,
            started_at=began,
            source="hook",
            harness="tao-demo",
        )
    )
    await asyncio.sleep(duration)
    await bus.publish_msg(
        ToolEnd(
            session_id=sid,
            call_id=call_id,
            ended_at=time.time(),
            tool=name,
            source="hook",
            duration_s=duration,
        )
    )


async def _session(
    index: int,
    args: argparse.Namespace,
    client: Any,
    bus: Any,
    http: Any,
    gateway: str,
    result: DemoResult,
) -> None:
    rng = random.Random(args.seed * 100_003 + index)
    script = _script(index, args)
    sid = f"demo-{index}-{uuid.uuid4().hex[:8]}"
    if script.delay_s > 0:
        await asyncio.sleep(script.delay_s)
    messages = script.opening(rng)
    started = time.monotonic()
    tool_end_at: float | None = None
    node: str | None = None
    for turn in range(script.turns):
        last = turn == script.turns - 1
        reply: dict[str, Any] = {
            "output_tokens": script.output_tokens(turn, rng),
            "tool_call": None,
        }
        planned = None if last else script.tool(turn, rng)
        if planned is not None:
            reply["tool_call"] = {
                "name": planned[0],
                "arguments": {"command": f"pytest -k t{turn}"},
            }
        answer = await _stream_turn(client, args, sid, messages, reply)
        if getattr(args, "identity", "header") == "none" and answer.session:
            sid = answer.session  # the gateway found the session by the conversation
        node = _count_turn(result, answer, node, tool_end_at, sid, later=turn > 0)
        messages.append(answer.message())
        if last:
            break
        if planned is None:  # a recorded turn without a tool: the next prompt is a user message
            messages.append({"role": "user", "content": script.observation(turn, rng)})
            tool_end_at = None
            continue
        if answer.tool_calls:
            call_id = next(iter(answer.tool_calls.values()))["id"]
        else:  # a real model ignores the script: the agent runs the planned tool anyway
            call_id = f"call-{turn}"
        result.tool_calls += 1
        await _run_tool(bus, sid, call_id, *planned)
        tool_end_at = time.monotonic()
        observation = script.observation(turn, rng)
        if answer.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
        else:
            messages.append({"role": "user", "content": observation})
    async with http.delete(f"{gateway}/v1/sessions/{sid}") as resp:
        resp.raise_for_status()
    result.latencies.append(time.monotonic() - started)
    result.tasks_done += 1


@dataclass(frozen=True)
class Target:
    """Where the load goes: a gateway, and the NATS / Redis of its stack (either may be
    unknown when driving a deployed gateway: tool events and planner counters are skipped)."""

    gateway_url: str
    nats_url: str | None
    redis_url: str | None
    namespace: str = ""
    domain: str = "default"
    nodes: int = 0
    """How many nodes the warm-up should see serve (0: unknown, one round)."""


class _NoBus:
    """Stands in for the bus when no NATS URL is known: tool events are then inferred by the
    gateway from the next request, as for a harness without hooks."""

    async def publish_msg(self, msg: object) -> None:
        return None

    async def drain(self) -> None:
        return None


async def _drive(target: Target, args: argparse.Namespace, policy: str) -> DemoResult:
    import aiohttp
    import openai

    from shared.infra.bus import Bus

    result = DemoResult(policy=policy, sessions=args.sessions)
    key = gateway_key(os.environ)
    bus: Any = _NoBus()
    if target.nats_url:
        bus = await Bus.connect(target.nats_url, name="tao-demo", namespace=target.namespace)
    client = openai.AsyncOpenAI(
        base_url=f"{target.gateway_url}/v1", api_key=key, max_retries=2, timeout=300.0
    )
    timeout = aiohttp.ClientTimeout(total=30.0)
    auth = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(timeout=timeout, headers=auth) as http:
        models = await _wait_for_models(client, args.model)
        args.model = args.model or models[0]
        await _warm_up(client, args, http, target, result)
        before: dict[str, Any] = {}
        if target.redis_url:
            before = await _planner_stats(target.redis_url, target.domain)
        if not args.json:
            nodes = ", ".join(result.warmup_nodes) or "not named"
            sys.stderr.write(
                f"tao demo: {policy}: warmed up: {result.warmup_requests} requests, nodes "
                f"{nodes}, {result.warmup_s:.1f} s, not timed\n"
            )
        began = time.monotonic()
        ticker = asyncio.create_task(_progress(result, began, args))
        try:
            outcomes = await asyncio.gather(
                *(
                    _session(i, args, client, bus, http, target.gateway_url, result)
                    for i in range(args.sessions)
                ),
                return_exceptions=True,
            )
        finally:
            ticker.cancel()
    result.wall_s = time.monotonic() - began
    result.errors = [f"{type(e).__name__}: {e}" for e in outcomes if isinstance(e, BaseException)]
    await client.close()
    await bus.drain()
    if target.redis_url:
        result.planner = counted_since(
            await _planner_stats(target.redis_url, target.domain), before
        )
    return result


def gateway_key(env: Mapping[str, str]) -> str:
    """The key the demo's clients send: ``TAO_GATEWAY_KEY``, else the content of
    ``TAO_GATEWAY_KEY_FILE`` (a gateway beyond loopback asks for it, as compose's does), else
    a placeholder (a gateway on loopback asks for none)."""
    key = env.get("TAO_GATEWAY_KEY", "").strip()
    path = env.get("TAO_GATEWAY_KEY_FILE", "").strip()
    if not key and path:
        try:
            key = Path(path).expanduser().read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise DemoError(f"TAO_GATEWAY_KEY_FILE: cannot read {path} ({exc})") from None
    return key or "tao-demo"


WARMUP_ROUNDS = 6
"""Rounds of warm-up requests at most (:func:`_warm_up`)."""


async def _warm_up(
    client: Any, args: argparse.Namespace, http: Any, target: Target, result: DemoResult
) -> None:
    """Warm the stack before the timed sessions: rounds of concurrent one-turn requests (two
    per node not yet seen), each its own session, ended at once, until every node has served
    one (at most :data:`WARMUP_ROUNDS`; one round when the node count is unknown). Recorded in
    ``result.warmup_*``; nothing of it is timed or counted in the results."""
    t0 = time.monotonic()
    served: set[str] = set()
    tag = uuid.uuid4().hex[:8]
    for rnd in range(WARMUP_ROUNDS):
        want = max(1, target.nodes - len(served))
        sids = [f"warmup-{tag}-{rnd}-{i}" for i in range(2 * want)]
        reply = {"output_tokens": 4, "tool_call": None}
        turns = await asyncio.gather(
            *(
                _stream_turn(client, args, sid, [{"role": "user", "content": "warm up"}], reply)
                for sid in sids
            )
        )
        for sid in sids:
            async with http.delete(f"{target.gateway_url}/v1/sessions/{sid}") as resp:
                resp.raise_for_status()
        result.warmup_requests += len(sids)
        served.update(t.served for t in turns if t.served is not None)
        if target.nodes <= 0 or len(served) >= target.nodes:
            break
    result.warmup_nodes = sorted(served)
    result.warmup_s = time.monotonic() - t0


def counted_since(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The planner counters of ``after`` less those of ``before`` (the warm-up's); other
    values (methods, solve-time percentiles) as ``after`` has them."""
    return {
        k: v - before[k] if isinstance(v, int) and isinstance(before.get(k), int) else v
        for k, v in after.items()
    }


PROGRESS_S = 5.0
"""How often a run reports its progress on stderr."""


async def _progress(result: DemoResult, began: float, args: argparse.Namespace) -> None:
    """Every :data:`PROGRESS_S`, one line on stderr: tasks done, turns, tool calls, elapsed
    (a run of 16 sessions takes ~30 s that would otherwise be silent). Not with ``--json``."""
    if args.json:
        return
    while True:
        await asyncio.sleep(PROGRESS_S)
        sys.stderr.write(
            f"tao demo: {result.policy}: {result.tasks_done}/{result.sessions} tasks done, "
            f"{len(result.ttfts)} turns, {result.tool_calls} tool calls, "
            f"{time.monotonic() - began:.0f} s\n"
        )
        sys.stderr.flush()


async def _wait_for_models(client: Any, wanted: str | None) -> list[str]:
    """Wait (up to 30 s) until telemetry has reported the nodes' models to the gateway."""
    deadline = time.monotonic() + 30.0
    while True:
        models = [m.id for m in (await client.models.list()).data]
        if models and (wanted is None or wanted in models):
            return models
        if time.monotonic() > deadline:
            raise DemoError(f"the gateway lists no model{'' if wanted is None else ' ' + wanted}")
        await asyncio.sleep(0.2)  # telemetry scrapes once a second


async def _planner_stats(url: str, domain: str) -> dict[str, Any]:
    from shared.infra.redisconn import open_redis
    from shared.infra.store import Store

    client = open_redis(url)
    try:
        return dict(await Store(client, domain).planner_stats())
    finally:
        await client.aclose()


def _forget_run(namespace: str, domain: str) -> None:
    """Delete what one policy's run left on servers the demo did not start (``TAO_NATS_URL``
    and ``TAO_REDIS_URL`` given): its namespace's streams and lease bucket, its domain's keys.
    Each run has a namespace and a domain of its own, so nothing else is touched; without this
    every run left seven streams and six keys behind on the operator's servers. A failure is
    said on stderr, and the run's result stands."""
    from shared.infra.bus import Bus
    from shared.infra.redisconn import open_redis
    from shared.infra.store import Store

    async def forget() -> None:
        bus = await Bus.connect(os.environ["TAO_NATS_URL"], name="tao-demo", namespace=namespace)
        try:
            await bus.delete_streams()
        finally:
            await bus.drain()
        client = open_redis(os.environ["TAO_REDIS_URL"])
        try:
            await Store(client, domain).clear()
        finally:
            await client.aclose()

    try:
        asyncio.run(forget())
    except Exception as exc:  # the servers went away: nothing more to clean, say so
        sys.stderr.write(f"tao demo: could not delete run {namespace}'s streams and keys: {exc}\n")


# -- command -------------------------------------------------------------------------------------


def add_demo_parser(sub: Any) -> None:
    """Register ``tao demo``."""
    p = sub.add_parser(
        "demo",
        help="bring the stack up and compare tao with ThunderAgent on live agent sessions",
        description="Drive agent sessions through the gateway, once per policy, and compare.",
    )
    p.add_argument(
        "--sessions",
        type=int,
        help="concurrent sessions (default 16; --trace: all, or the first N)",
    )
    p.add_argument(
        "--turns", type=int, help="model calls per session (default 6; --trace: all, or at most N)"
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="replay a session trace (tao trace import output) instead of the built-in task",
    )
    p.add_argument(
        "--policies",
        default="tao,thunderagent,thunderagent-ideal",
        help="comma-separated policies (default tao,thunderagent,thunderagent-ideal)",
    )
    p.add_argument("--sim-nodes", type=int, default=2, help="simulated nodes (default 2)")
    p.add_argument(
        "--nodes-file",
        metavar="FILE",
        help="real nodes instead of simnodes (e.g. tao engines up's); each run resets their "
        "prefix caches first",
    )
    p.add_argument("--kv-tokens", type=int, default=49_152, help="KV tokens per simnode")
    p.add_argument(
        "--host-kv", type=float, default=0.0, metavar="F",
        help="each simnode's host KV tier, F x its GPU KV, as vLLM's OffloadingConnector "
        "(default 0: none); the hit rate then counts host-loaded tokens, as vLLM's does",
    )  # fmt: skip
    p.add_argument("--time-scale", type=float, default=1.0, help="simnode speed-up (default 1)")
    p.add_argument(
        "--workload", default=DEMO_WORKLOAD, metavar="NAME",
        help=f"whose measured tool mix the built-in sessions run: a tao sim family with tools "
        f"(default {DEMO_WORKLOAD}: TraceLab's Claude Code/Codex times), or 'short' for the "
        "0.4 s mix of earlier demos",
    )  # fmt: skip
    p.add_argument(
        "--tool-scale", type=float, default=DEMO_TOOL_SCALE, metavar="F",
        help=f"divide the family's tool times by F (default {DEMO_TOOL_SCALE:g}: its p99 of "
        "~4.5 min becomes ~27 s, so a run fits a few minutes)",
    )  # fmt: skip
    p.add_argument("--model", help="model name sent (default: the first the gateway lists)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    p.add_argument(
        "--repeat", type=int, default=1, metavar="N",
        help="run every policy N times, interleaved, repeat r on workload seed --seed + r; "
        "the table shows mean ± sd and each policy's paired difference to the first",
    )  # fmt: skip
    p.add_argument(
        "--identity", choices=("header", "none"), default="header",
        help="how each session names itself: header (X-Session-ID, the default) or none (no "
        "id at all, as a stock openai client sends: the gateway keeps the session by the "
        "conversation's content; tool events go under the session id its answers name)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--log-dir", metavar="DIR",
        help="keep the services' logs here, one folder per policy (default: a temporary "
        "folder, removed when every run succeeded and named on stderr when one did not)",
    )  # fmt: skip
    p.add_argument(
        "--against",
        metavar="URL",
        help="drive this running gateway instead of starting stacks (one run; compose demo)",
    )
    p.set_defaults(run=_cmd_demo)


def _check(args: argparse.Namespace) -> list[str]:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name in policies:
        if name not in POLICY_NAMES:
            raise DemoError(
                f"--policies: unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}"
            )
    if not policies:
        raise DemoError("--policies: give at least one policy")
    for opt in ("sessions", "turns", "sim_nodes", "kv_tokens", "repeat"):
        value = getattr(args, opt)
        if value is not None and value < 1:
            raise DemoError(f"--{opt.replace('_', '-')}: must be >= 1")
    if not args.time_scale > 0:
        raise DemoError("--time-scale: must be > 0")
    if args.host_kv != 0.0:
        try:
            PROFILES[DEFAULT_PROFILE].host_link(args.host_kv)
        except ValueError as exc:
            raise DemoError(f"--host-kv: {exc}") from None
    if not args.tool_scale > 0:
        raise DemoError("--tool-scale: must be > 0")
    args.family_tools = ()
    if args.workload != "short":
        if args.workload not in BUILTIN:
            raise DemoError(
                f"--workload: unknown {args.workload!r}; known: short, {', '.join(BUILTIN)}"
            )
        spec = load_workload(args.workload)
        if not spec.tools:
            raise DemoError(f"--workload: {args.workload!r} has no tools")
        args.family_tools = spec.tools
    args.trace_tasks = None
    if args.trace is None:
        args.sessions = 16 if args.sessions is None else args.sessions
        args.turns = 6 if args.turns is None else args.turns
    else:
        from shared.sim.trace import load_trace  # bad file: WorkloadError, one line, exit 2

        args.trace_tasks = load_trace(args.trace)[: args.sessions]
        args.sessions = len(args.trace_tasks)
    return policies


def _shape(args: argparse.Namespace) -> str:
    if args.trace_tasks is None:
        return f"{args.sessions} sessions x {args.turns} turns"
    return f"{args.sessions} sessions replayed from {args.trace}"


def _cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    policies = _check(args)
    if args.against:
        if args.repeat > 1:
            raise DemoError("--repeat: not with --against (it drives one deployed policy once)")
        return _demo_against(args, out)
    need_servers = not (os.environ.get("TAO_NATS_URL") and os.environ.get("TAO_REDIS_URL"))
    run_id = uuid.uuid4().hex[:8]
    results: list[DemoResult] = []
    real = _real_nodes(args.nodes_file)
    logs = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="tao-demo-"))
    runs = list(itertools.product(range(args.repeat), enumerate(policies)))
    spaces = [f"demo{run_id}r{rep}p{i}" for rep, (i, _) in runs]
    access = logs / "access" if need_servers else None
    if access is not None:  # one user per role, as `tao up` runs them
        write_access_dir(Access.new(namespaces=spaces), access)
    servers = EmbeddedServers(access_dir=access).start() if need_servers else None
    ok = False
    base_seed = args.seed
    try:
        # repeats interleave the policies, so a drift of the machine's load hits them all alike
        for ns, (rep, (i, policy)) in zip(spaces, runs, strict=True):
            args.seed = base_seed + rep  # each repeat is another workload draw, the same for all
            domain = f"demo-{run_id}-{rep}-{i}"
            config = StackConfig(
                sim_nodes=0 if real else args.sim_nodes,
                policy=policy,
                time_scale=args.time_scale,
                kv_tokens=args.kv_tokens,
                host_kv=args.host_kv,
                namespace=ns,
                domain=domain,
                extra_env={"TAO_NODES_FILE": args.nodes_file} if real else {},
                log_dir=str(logs / (policy if args.repeat == 1 else f"{policy}-{rep}")),
            )
            for node in real:
                _reset_prefix_cache(node)
            try:
                with Stack(config, servers=servers, access_dir=access) as stack:
                    if not args.json:
                        which = "" if args.repeat == 1 else f" (run {rep + 1}/{args.repeat})"
                        out.write(
                            f"tao demo: {policy}{which}: {_shape(args)} via {stack.gateway_url}\n"
                        )
                        out.flush()
                    target = Target(
                        stack.gateway_url,
                        stack.nats_for("ops"),
                        stack.redis_for("ops"),
                        ns,
                        domain,
                        nodes=len(stack.node_urls) or len(real),
                    )
                    result = asyncio.run(_drive(target, args, policy))
                    result.repeat = rep
                    result.audit = _audit(stack.log_dir / "planner.log", result.seen)
                    results.append(result)
            except StackError as exc:
                raise DemoError(str(exc)) from None
            finally:
                if servers is None:  # the operator's servers: leave them as they were
                    _forget_run(ns, domain)
        ok = all(r.tasks_done == r.sessions and not r.errors for r in results)
    finally:
        if servers is not None:
            servers.stop()
        if ok and not args.log_dir:  # the services' logs matter only when something failed
            shutil.rmtree(logs, ignore_errors=True)
        elif not args.json:
            sys.stderr.write(f"tao demo: the services' logs are in {logs}\n")
    _print_results(results, args, out)
    return 0 if all(r.tasks_done == r.sessions for r in results) else 1


def _audit(planner_log: Path, seen: Sequence[TurnSeen]) -> ReleaseAudit | None:
    """The planner's applied releases judged by the sessions' next requests
    (:func:`shared.core.explain.audit_releases`); ``None`` when its log has no round record."""
    try:
        with open(planner_log, encoding="utf-8", errors="replace") as f:
            rounds = rounds_from_lines(f)
    except (OSError, ExplainError):
        return None
    return audit_releases(rounds, seen) if rounds else None


def _real_nodes(path: str | None) -> tuple[NodeSpec, ...]:
    """The nodes of ``--nodes-file`` (none without it)."""
    if path is None:
        return ()
    from shared.infra.nodesfile import NodesFileError, load_nodes_file

    try:
        return load_nodes_file(path)
    except NodesFileError as exc:
        raise DemoError(f"--nodes-file: {exc}") from None


def _reset_prefix_cache(node: NodeSpec) -> None:
    """Empty a real node's prefix cache, so that each policy starts cold (vLLM's
    ``POST /reset_prefix_cache``, served when the engine runs with ``VLLM_SERVER_DEV_MODE=1``,
    as ``tao engines up`` starts it)."""
    import urllib.error
    import urllib.request

    url = f"{node.root}/reset_prefix_cache"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30):
            pass
    except (urllib.error.URLError, OSError) as exc:
        raise DemoError(
            f"--nodes-file: cannot reset the prefix cache of {node.id} at {url} ({exc}); "
            "start vLLM with VLLM_SERVER_DEV_MODE=1"
        ) from None


def _demo_against(args: argparse.Namespace, out: TextIO) -> int:
    """Drive an already running gateway (``docker compose --profile demo up``): one run, with
    whatever policy the deployment's planner uses. NATS / Redis come from ``TAO_NATS_URL`` /
    ``TAO_REDIS_URL`` when set (hook-style tool events, planner counters), else are skipped."""
    from shared.infra.settings import Settings

    settings = Settings.from_env()
    target = Target(
        args.against.rstrip("/"),
        settings.nats_url,
        settings.redis_url,
        settings.namespace,
        settings.domain,
    )
    label = f"deployed ({settings.policy})"
    if not args.json:
        out.write(f"tao demo: {_shape(args)} via {target.gateway_url}\n")
        out.flush()
    result = asyncio.run(_drive(target, args, label))
    _print_results([result], args, out)
    return 0 if result.tasks_done == result.sessions else 1


def _print_results(results: Sequence[DemoResult], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        out.write(orjson.dumps({"runs": [r.row() for r in results]}).decode() + "\n")
    else:
        out.write(demo_table(results) + "\n")
    out.flush()


def _fmt(v: object, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v * 100:.1f}%" if unit == "%" else f"{v:.2f}{unit}"
    return str(v)


_TABLE: tuple[tuple[str, str, str], ...] = (
    ("tasks done", "tasks_done", ""),
    ("makespan", "wall_s", " s"),
    ("task latency mean", "latency_mean_s", " s"),
    ("task latency p99", "latency_p99_s", " s"),
    ("TTFT mean", "ttft_mean_s", " s"),
    ("TTFT p50", "ttft_p50_s", " s"),
    ("TTFT p99", "ttft_p99_s", " s"),
    ("TTFT p50, later cache hits", "hit_ttft_p50_s", " s"),
    ("tool end -> first token", "tool_end_to_first_token_mean_s", " s"),
    ("prefix cache hit rate", "cache_hit_rate", "%"),
    ("interrupts / tool call", "interrupts_per_tool_call", ""),
    ("releases applied", "releases_applied", ""),
    ("releases costlier than the hold", "releases_costly", ""),
    ("node moves / session", "node_moves_per_session", ""),
    ("plans applied", "plans_applied", ""),
    ("plans discarded", "plans_discarded", ""),
    ("errors", "errors", ""),
)
_PAIRED: tuple[tuple[str, str], ...] = (
    ("makespan", "wall_s"),
    ("task latency mean", "latency_mean_s"),
    ("TTFT mean", "ttft_mean_s"),
    ("prefix cache hit rate", "cache_hit_rate"),
)


def _cell(values: Sequence[object], unit: str) -> str:
    """One run's value, or the mean ± sd over repeated runs (``-`` when none has one)."""
    nums = [float(v) for v in values if isinstance(v, int | float)]
    if len(values) == 1 or not nums:
        return _fmt(values[0] if len(values) == 1 else None, unit)
    mean = statistics.fmean(nums)
    sd = statistics.stdev(nums) if len(nums) > 1 else 0.0
    if unit == "%":
        return f"{mean * 100:.1f} ± {sd * 100:.1f}%"
    if all(isinstance(v, int) for v in values) and not unit:
        return f"{mean:.1f} ± {sd:.1f}"
    return f"{mean:.2f} ± {sd:.2f}{unit}"


def paired_lines(results: Sequence[DemoResult]) -> list[str]:
    """With repeated runs: each other policy against the first, per metric of
    :data:`_PAIRED`, as the mean over repeats of the paired % difference ± the 95 %
    Student-t half-width (``*``: the interval excludes 0), repeat by repeat."""
    from shared.sim.metrics import t_quantile

    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r.policy, {})[r.repeat] = r.row()
    policies = list(by)
    if len(policies) < 2 or max(len(v) for v in by.values()) < 2:
        return []
    ref = policies[0]
    lines = [f"paired vs {ref} (mean % difference over repeats ± 95 % interval, * excludes 0):"]
    for p in policies[1:]:
        cells = []
        for label, key in _PAIRED:
            ds = [
                (row[key] - by[ref][rep][key]) / by[ref][rep][key] * 100
                for rep, row in by[p].items()
                if rep in by[ref] and row[key] is not None and by[ref][rep][key]
            ]
            if len(ds) < 2:
                cells.append(f"{label} -")
                continue
            mean = statistics.fmean(ds)
            half = t_quantile(0.975, len(ds) - 1) * statistics.stdev(ds) / math.sqrt(len(ds))
            star = "*" if abs(mean) > half else ""
            cells.append(f"{label} {signed(mean)} ± {half:.1f}%{star}")
        lines.append(f"  {p} vs {ref}: " + ", ".join(cells))
    return lines


def demo_table(results: Sequence[DemoResult]) -> str:
    """Policies side by side, one metric per row; with ``--repeat`` each cell is the mean ± sd
    over the repeats, followed by the paired differences (:func:`paired_lines`)."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r.policy, []).append(r.row())
    header = ["metric", *by]
    rows = [[label, *(_cell([row[key] for row in runs], unit) for runs in by.values())]
            for label, key, unit in _TABLE]  # fmt: skip
    lines = [render(header, rows)]
    lines += paired_lines(results)
    errors = [e for r in results for e in r.errors[:3]]
    if errors:
        lines.append("first errors: " + "; ".join(errors))
    return "\n".join(lines)
