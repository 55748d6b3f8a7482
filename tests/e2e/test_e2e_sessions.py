"""Agent sessions end to end through the whole stack, and capacity never over-committed.

One workload runs once for the module: fourteen concurrent coding-agent sessions of four turns
each, half of them streaming, with the real ``openai`` client through the gateway to two
simnodes whose KV capacity cannot hold all sessions at once; tool calls are scripted and
reported on NATS as harness hooks would. While it runs, a watcher reads every node and session
record of the domain atomically, and each simnode's ``/metrics``, over and over. The tests then
check what the clients got, what ``tao status --json`` shows, and every observation.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

SESSIONS = 14
TURNS = 4
WITNESSES = 2
_KV_USAGE = re.compile(r"^vllm:kv_cache_usage_perc\{[^}]*\} (\S+)$", re.M)


@dataclass
class Observation:
    """One atomic look at the store: per node (reserved, usable, Σ admitted weights), and how
    many sessions wanted admission but were not admitted."""

    nodes: dict[str, tuple[int, int, int]]
    pooled: int
    detail: dict[str, list[tuple[str, int, int, str, int]]] = field(default_factory=dict)
    """Per node, its admitted sessions' (id, weight, tokens, activity, turns)."""
    t: float = 0.0
    """``time.monotonic()`` when it was taken."""


@dataclass
class Workload:
    tool: str
    turns: dict[str, list[Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    kv_usage: list[tuple[str, float]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    tool_count: int = -1
    exited: list[tuple[str, int | None]] = field(default_factory=list)
    metrics: str = ""
    """The gateway's /metrics page after the run."""


async def _watch(c: Any, nodes: dict[str, str], out: Workload, done: asyncio.Event) -> None:
    """Read the store atomically and scrape the nodes until ``done`` (then once more)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while True:
            last = done.is_set()
            snap = await c.snapshot()
            out.observations.append(
                Observation(
                    nodes={
                        n: (rec.reserved, rec.usable, snap.admitted_weight(n))
                        for n, rec in snap.nodes.items()
                    },
                    pooled=sum(1 for s in snap.sessions.values() if s.pooled),
                    t=time.monotonic(),
                    detail={
                        n: [
                            (s.id, s.weight, s.tokens, s.activity, s.turns)
                            for s in snap.sessions.values()
                            if s.node == n
                        ]
                        for n in snap.nodes
                    },
                )
            )
            for node, url in nodes.items():
                async with http.get(f"{url}/metrics") as resp:
                    match = _KV_USAGE.search(await resp.text())
                    assert match is not None, f"{node}: no vllm:kv_cache_usage_perc on /metrics"
                    out.kv_usage.append((node, float(match.group(1))))
            if last:
                return
            await asyncio.sleep(0.02)  # sampling period of the watcher, not synchronisation


async def _run(e2e: Any) -> Workload:
    """Run the sessions; the two witnesses (one streaming, one not) keep their sessions open
    after their last turn until ``tao status`` has been read, the others end at once."""
    tag = uuid.uuid4().hex[:8]
    out = Workload(tool=f"bash-{tag}")
    ids = [f"wl-{tag}-{i}" for i in range(SESSIONS)]
    witnesses = ids[:WITNESSES]
    finished = {sid: asyncio.Event() for sid in witnesses}
    status_read = asyncio.Event()

    def after_turn(sid: str) -> Any:
        return lambda turn: finished[sid].set() if turn == TURNS - 1 else None

    async def hold() -> None:
        await status_read.wait()

    async with e2e.clients() as c:
        done = asyncio.Event()
        watcher = asyncio.create_task(_watch(c, e2e.stack.node_urls, out, done))
        tasks = [
            asyncio.create_task(
                c.agent(
                    sid,
                    turns=TURNS,
                    stream=i % 2 == 0,
                    tool=out.tool,
                    seed=i,
                    after_turn=after_turn(sid) if sid in finished else None,
                    before_end=hold if sid in finished else None,
                )
            )
            for i, sid in enumerate(ids)
        ]
        try:
            others = await asyncio.gather(*tasks[WITNESSES:], return_exceptions=True)
            async with asyncio.timeout(60):
                await asyncio.gather(*(ev.wait() for ev in finished.values()))
            for sid in witnesses:  # the last response is applied by the tools service
                await c.await_session(sid, lambda s: s is not None and s.turns == TURNS, "done")
            for sid in ids[WITNESSES:]:  # a DELETEd session's record is removed
                await c.await_session(sid, lambda s: s is None, "deleted")
            out.status = await asyncio.to_thread(e2e.status_cli)
        finally:
            status_read.set()
            mine = await asyncio.gather(*tasks[:WITNESSES], return_exceptions=True)
            done.set()
            await watcher
        for sid, res in zip(ids, [*mine, *others], strict=True):
            if isinstance(res, BaseException):
                out.errors.append(f"{sid}: {type(res).__name__}: {res}")
            else:
                out.turns[sid] = res
        out.tool_count = (await c.store().history()).of(out.tool).count
    async with aiohttp.ClientSession() as http, http.get(f"{e2e.gateway}/metrics") as resp:
        out.metrics = await resp.text()
    out.exited = e2e.exited()
    return out


@pytest.fixture(scope="module")
def workload(e2e: Any) -> Workload:
    """The module's workload, run once (module docstring)."""
    return asyncio.run(_run(e2e))


class TestAgentSessions:
    def test_every_request_completes(self, workload: Workload) -> None:
        """Every turn of every session gets its answer: tool calls on all but the last turn."""
        assert workload.errors == []
        assert len(workload.turns) == SESSIONS
        for sid, turns in workload.turns.items():
            reasons = [t.finish_reason for t in turns]
            assert reasons == ["tool_calls"] * (TURNS - 1) + ["stop"], (sid, reasons)
            assert all(t.tool_call_id for t in turns[:-1]), sid

    def test_no_child_exited(self, workload: Workload) -> None:
        """Every service and simnode of the stack is still running after the workload."""
        assert workload.exited == []

    def test_streaming_and_unary_both_used(self, workload: Workload) -> None:
        """Half the sessions streamed (with a usage chunk), half did not."""
        streamed = [sid for sid, turns in workload.turns.items() if all(t.streamed for t in turns)]
        unary = [sid for sid, turns in workload.turns.items() if not any(t.streamed for t in turns)]
        assert len(streamed) == len(unary) == SESSIONS // 2
        assert all(t.prompt_tokens > 0 for turns in workload.turns.values() for t in turns)

    def test_later_turns_hit_the_prefix_cache(self, workload: Workload) -> None:
        """Later turns come back to the node holding their prefix: cached_tokens > 0."""
        later = [t for turns in workload.turns.values() for t in turns[1:]]
        hits = [t for t in later if t.cached_tokens > 0]
        assert all(t.cached_tokens == 0 for turns in workload.turns.values() for t in turns[:1])
        assert len(hits) * 2 >= len(later), f"only {len(hits)}/{len(later)} later turns hit"
        assert all(t.cached_tokens < t.prompt_tokens for t in later)

    def test_hook_tool_events_recorded(self, workload: Workload) -> None:
        """Every ToolEnd reported on NATS became one sample of the tool's duration history."""
        assert workload.tool_count == SESSIONS * (TURNS - 1)

    def test_status_cli_shows_sessions_and_plans(self, workload: Workload) -> None:
        """``tao status --json`` lists the open sessions with their turns, not the ended ones,
        and counts applied plans. After its last answer (no tool call) a session waits on its
        client, in the inferred ``(client)`` call (services.tools.steps)."""
        status = workload.status
        ours = {s["id"]: s for s in status["sessions"] if s["id"] in workload.turns}
        witnesses = sorted(workload.turns)[:WITNESSES]
        assert sorted(ours) == witnesses
        for row in ours.values():
            assert (row["turns"], row["ended"], row["activity"]) == (TURNS, False, "tool"), row
            assert row["node"] in ("sim0", "sim1") and row["weight"] > row["tokens"] > 0, row
        planner = status["planner"]
        assert planner["plans_applied"] > 0
        assert planner["sessions_admitted"] >= SESSIONS
        assert {n["id"] for n in status["nodes"]} == {"sim0", "sim1"}


class TestSignedPlacements:
    def test_the_gateway_acted_only_on_signed_placements(self, workload: Workload) -> None:
        """The stack signs placements by default (``tao up``'s own key pair): the gateway
        admitted sessions from placements and rejected none as unsigned, forged or expired."""
        counts = {
            m.group(1): float(m.group(2))
            for m in re.finditer(
                r'^tao_gateway_placements_total\{kind="admit",result="([a-z_]+)"\} (\S+)$',
                workload.metrics,
                re.M,
            )
        }
        assert counts.get("admitted", 0) > 0, counts
        assert not {"unsigned", "unknown_key", "forged", "expired"} & set(counts), counts


class TestCapacity:
    def test_capacity_binds_in_this_workload(self, workload: Workload) -> None:
        """The workload is a real test of capacity: sessions had to wait for it."""
        assert len(workload.observations) >= 10
        assert max(o.pooled for o in workload.observations) > 0

    def test_over_commit_from_growth_is_released(self, workload: Workload) -> None:
        """The planner never admits past capacity × target, but admitted reservations grow with
        their sessions' context (DESIGN 3.2: weights are re-valued every tick), so a node can
        go over between ticks; then the planner releases tool-running sessions there. Every
        over-committed stretch ends within 3 s unless nothing on the node was interruptible."""
        obs = workload.observations
        for node in obs[0].nodes:
            start: int | None = None
            for i, o in enumerate(obs):
                reserved, usable, _ = o.nodes[node]
                if reserved > usable and start is None:
                    start = i
                elif reserved <= usable:
                    start = None
                if start is None or o.t - obs[start].t <= 3.0:
                    continue
                stretch = obs[start : i + 1]
                interruptible = any(
                    act == "tool" for ob in stretch for (_, _, _, act, _) in ob.detail[node]
                )
                assert not interruptible, (
                    f"{node} over-committed for {o.t - obs[start].t:.1f} s with tool-running "
                    f"sessions it could release: {o.detail[node]} ({reserved} > {usable})"
                )

    def test_reserved_equals_admitted_weights(self, workload: Workload) -> None:
        """At every observation a node's reserved total is the sum of its sessions' weights."""
        bad = [
            (i, n, reserved, weights)
            for i, o in enumerate(workload.observations)
            for n, (reserved, _, weights) in o.nodes.items()
            if reserved != weights
        ]
        assert bad == [], f"{len(bad)} mismatches, first: {bad[:3]}"

    def test_simnode_kv_usage_within_one(self, workload: Workload) -> None:
        """No simnode ever reports KV usage above 100 %, and the KV cache was in use."""
        assert workload.kv_usage
        assert all(0.0 <= u <= 1.0 for _, u in workload.kv_usage)
        assert max(u for _, u in workload.kv_usage) > 0.0
