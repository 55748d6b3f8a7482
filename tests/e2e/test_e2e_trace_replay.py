"""``tao demo --trace``: an imported trace replayed through the whole stack.

Two mini-swe-agent trajectories (small prompts, so they fit the e2e stack's 10,240-token nodes)
are imported with ``tao trace import`` and replayed by the demo's session driver against the
``e2e`` stack: the recorded prompt growth reaches the engines, the recorded tools are reported
as hook events under their recorded names, and every session finishes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from typing import Any

import pytest

from shared.cli.demo import DemoResult, Target, _drive
from shared.cli.trace import import_files
from shared.sim.trace import load_trace

TIME_SCALE = 20.0  # the e2e stack's


def trajectory(tool: str, t0: float, calls: list[tuple[int, int, float]]) -> dict[str, Any]:
    """A tool-calling mini-swe-agent trajectory: (prompt, output, tool seconds) per call."""
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "t"},
    ]
    t = t0
    for i, (prompt, out, secs) in enumerate(calls):
        t += 1.0
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": "{}"}}],
            "extra": {"timestamp": t, "response": {"usage": {
                "prompt_tokens": prompt, "completion_tokens": out}}}})  # fmt: skip
        if i < len(calls) - 1:
            t += secs
            msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "ok",
                         "extra": {"returncode": 0, "timestamp": t}})  # fmt: skip
    return {"info": {}, "messages": msgs, "trajectory_format": "mini-swe-agent-1.1"}


A = [(1200, 60, 2.0), (1700, 80, 1.0), (2300, 100, 0.0)]
B = [(900, 50, 4.0), (1400, 70, 0.0)]


@pytest.fixture(scope="module")
def replay(e2e: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, int]:
    """Import the two trajectories, replay them once; (result, tool samples recorded)."""
    tool = f"bash-{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("trace")
    paths = []
    for name, t0, calls in (("a", 100.0, A), ("b", 103.0, B)):
        p = folder / f"{name}.traj.json"
        p.write_text(json.dumps(trajectory(tool, t0, calls)))
        paths.append(str(p))
    trace = folder / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in import_files("mini-swe-agent", paths)))
    tasks = load_trace(str(trace))
    args = argparse.Namespace(trace_tasks=tasks, trace=str(trace), sessions=len(tasks),
                              turns=None, time_scale=TIME_SCALE, seed=0, model=None,
                              json=True)  # fmt: skip
    stack = e2e.stack
    target = Target(e2e.gateway, stack.nats_url, stack.redis_url, e2e.namespace, e2e.domain)

    async def run() -> tuple[DemoResult, int]:
        result = await _drive(target, args, "tao")
        async with e2e.clients() as c:
            for _ in range(100):  # the tools service applies ToolEnd asynchronously
                count = (await c.store().history()).of(tool).count
                if count >= 3:
                    break
                await asyncio.sleep(0.1)  # polling an external system with a deadline
        return result, count

    return asyncio.run(run())


class TestTraceReplay:
    def test_every_session_finishes(self, replay: tuple[DemoResult, int]) -> None:
        """Both recorded sessions run to their last turn without an error."""
        result, _ = replay
        assert result.errors == [] and result.tasks_done == 2

    def test_recorded_prompts_reach_the_engine(self, replay: tuple[DemoResult, int]) -> None:
        """Σ usage.prompt_tokens is the recorded prompts plus the chat template's few tokens
        per message (one word is one simnode token)."""
        result, _ = replay
        recorded = sum(p for p, _, _ in A + B)
        assert recorded <= result.prompt_tokens <= recorded + 20 * len(A + B)
        assert result.cached_tokens > 0  # later turns found their prefix

    def test_recorded_tools_reported(self, replay: tuple[DemoResult, int]) -> None:
        """The three recorded tool calls became ToolEnd samples under the recorded name, and
        each was followed by the session's next call."""
        result, count = replay
        assert count == 3 and len(result.tool_to_token) == 3
