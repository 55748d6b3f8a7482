"""``tao sim --host-kv``: every node gets vLLM's host KV tier (:mod:`shared.core.engine.host`),
every policy runs on the same tiered engine, and with no tier nothing changes."""

from __future__ import annotations

import pytest

from shared.sim.des import SimConfig
from shared.sim.metrics import recomputed_tokens
from shared.sim.records import SimResult
from shared.sim.runner import simulate
from shared.sim.workloads import generate_tasks, load_workload

TASKS = generate_tasks(load_workload("claude-code"), 8, seed=0)


def _run(policy: str, host_kv: float) -> SimResult:
    config = SimConfig(nodes=2, profile="deepseek-4xh100", workers=8, host_kv=host_kv)
    return simulate(TASKS, config, policy, 0)


@pytest.mark.parametrize("policy", ["tao", "thunderagent", "kv-aware", "kv-aware-tiered"])
def test_every_policy_finishes_on_the_tiered_engine_and_loads_from_the_host(policy: str) -> None:
    """Long tool calls push prefixes out of the GPU; with a tier of 4 x the GPU KV some come
    back from the host, counted as cached (not recomputed) tokens."""
    res = _run(policy, 4.0)
    assert len({r.session for r in res.requests}) == len(TASKS)
    assert res.counters["host_stored_blocks"] > 0
    assert res.counters["host_hit_tokens"] > 0
    assert recomputed_tokens(res) < recomputed_tokens(_run(policy, 0.0))


def test_no_tier_is_no_tier() -> None:
    """--host-kv 0 is the engine without a host tier: no host counters, the same run."""
    a, b = _run("tao", 0.0), _run("tao", 0.0)
    assert "host_hit_tokens" not in a.counters
    assert [(r.session, r.turn, r.cached, r.finished) for r in a.requests] == [
        (r.session, r.turn, r.cached, r.finished) for r in b.requests
    ]
