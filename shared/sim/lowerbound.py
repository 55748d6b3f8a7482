"""The ``lower-bound`` reference: every turn hits the cache and nothing queues.

Computed analytically from the engine's timing model (:mod:`shared.core.engine.profiles`) as if
each request ran alone on an empty, uncontended node whose cache still holds the session's whole
previous context:

* cached tokens of a turn = the previous context whose KV was computed (prompt + output − 1: the
  last sampled token is never fed back), in whole blocks and never the prompt's last token (vLLM
  recomputes at least one); turn 0 hits the family's shared prefix (also a bound: the very first
  session on a node finds nothing cached);
* prefill of the rest in ``max_batched_tokens`` chunks, one step each
  (:func:`~shared.core.engine.profiles.prefill_time` with the chunk's context); the step that
  completes the prompt samples the first token (as the engine does);
* ``output − 1`` decode steps of batch 1 whose context grows by one token each
  (:func:`~shared.core.engine.profiles.decode_step_time`, linear in the context, so the sum is
  exact from its two ends);
* tool calls take their true durations (cut at their timeout).

Task latency = Σ turns + Σ tools. Makespan: closed loop = the tasks' bound durations list-
scheduled on the workers in task order (the first free worker takes the next task); open loop =
the latest arrival + bound. Decode throughput is then an upper bound: Σ output / that makespan.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from shared.core.engine import PROFILES, Profile, decode_step_time, prefill_time
from shared.sim.des import SimConfig
from shared.sim.metrics import METRICS, mean, pct
from shared.sim.workloads import Task

__all__ = ["lower_bound_metrics", "request_bound", "task_bound"]


def request_bound(p: Profile, prompt: int, cached: int, output: int) -> tuple[float, float]:
    """(time to first token, total time) of one request alone on an empty node."""
    bs = p.block_size
    cached = min(cached, (prompt - 1) // bs * bs)
    cached = max(0, cached // bs * bs)
    ttft = 0.0
    done = cached
    while done < prompt:
        n = min(prompt - done, p.max_batched_tokens)
        ttft += prefill_time(p, n, done)
        done += n
    steps = output - 1
    total = ttft
    if steps > 0:
        first = decode_step_time(p, 1, prompt + 1)
        last = decode_step_time(p, 1, prompt + steps)
        total += steps * (first + last) / 2
    return ttft, total


def task_bound(p: Profile, task: Task) -> tuple[float, list[tuple[float, bool]], int, int]:
    """(latency, [(ttft, after_tool)], Σ cached, Σ prompt) of a task under the bound."""
    ctx = task.shared_prefix
    cached_prev = task.shared_prefix
    lat = 0.0
    firsts: list[tuple[float, bool]] = []
    cached_sum = prompt_sum = 0
    for j, turn in enumerate(task.turns):
        prompt = ctx + turn.added
        bs = p.block_size
        cached = max(0, min(cached_prev, (prompt - 1) // bs * bs) // bs * bs)
        ttft, total = request_bound(p, prompt, cached, turn.output)
        firsts.append((ttft, j > 0))
        cached_sum += cached
        prompt_sum += prompt
        lat += total
        ctx = prompt + turn.output
        cached_prev = ctx - 1  # the last sampled token's KV is never computed
        if turn.tool is not None:
            lat += min(turn.duration, turn.timeout) if turn.timeout else turn.duration
    return lat, firsts, cached_sum, prompt_sum


def lower_bound_metrics(tasks: Sequence[Task], config: SimConfig) -> dict[str, float | int | None]:
    """The metrics of :data:`shared.sim.metrics.METRICS` under the bound (None where the bound
    says nothing: running requests, planner figures)."""
    p = PROFILES[config.profile]
    lats: list[float] = []
    ttft: list[float] = []
    after: list[float] = []
    cached = prompt = out = 0
    for task in tasks:
        lat, firsts, c, pr = task_bound(p, task)
        lats.append(lat)
        ttft.extend(f for f, _ in firsts)
        after.extend(f for f, a in firsts if a)
        cached += c
        prompt += pr
        out += sum(t.output for t in task.turns)
    if config.workers is None:
        makespan = max((t.arrival or 0.0) + lat for t, lat in zip(tasks, lats, strict=True))
        makespan -= min((t.arrival or 0.0) for t in tasks) if tasks else 0.0
    else:
        free = [0.0] * min(config.workers, len(tasks))
        heapq.heapify(free)
        makespan = 0.0
        for lat in lats:
            start = heapq.heappop(free)
            makespan = max(makespan, start + lat)
            heapq.heappush(free, start + lat)
    out_metrics: dict[str, float | int | None] = dict.fromkeys(METRICS)
    out_metrics.update(
        {
            "latency_mean": mean(lats),
            "latency_p50": pct(lats, 50),
            "latency_p99": pct(lats, 99),
            "ttft_mean": mean(ttft),
            "ttft_p99": pct(ttft, 99),
            "decode_tps": out / makespan if makespan > 0 else None,
            "prefix_hit_rate": cached / prompt if prompt else None,
            "tool_to_first_mean": mean(after),
            "tool_to_first_p99": pct(after, 99),
            "pause_wait_mean": 0.0,
            "pause_wait_total": 0.0,
            "makespan": makespan,
            "interrupts": 0,
            "requests": len(ttft),
            "tasks": len(tasks),
            "completion_tokens": out,
        }
    )
    return out_metrics
