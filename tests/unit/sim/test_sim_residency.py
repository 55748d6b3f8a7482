"""The simulator's incremental residency queries equal the engines' ground truth."""

from __future__ import annotations

import pytest

from shared.sim.cluster import scheduler
from shared.sim.des import SimConfig, Simulator
from shared.sim.workloads import generate_tasks, load_workload


class _Compared(Simulator):
    """At every sample, each live session's incremental answer on each node is compared with
    a full ``resident_prefix`` walk over its tokens."""

    checks = 0
    evicted = 0

    def _sample(self) -> None:
        bs = self.profile.block_size
        for agent in self.agents.values():
            for nblocks in (agent.ctx // bs, agent.prompt_len // bs):
                toks = agent.tokens.take(0, nblocks * bs)
                for node, eng in self.engines.items():
                    got = self._resident_blocks(agent, node, nblocks)
                    assert got * bs == eng.resident_prefix(toks)
                    _Compared.checks += 1
        _Compared.evicted = max(
            _Compared.evicted, max(e.evicted_blocks for e in self.engines.values())
        )
        super()._sample()


class TestResidency:
    """Residency stays exact while engines evict (small KV, many workers)."""

    @pytest.mark.parametrize("policy", ["tao", "cache-aware"])
    def test_incremental_equals_ground_truth(self, policy: str) -> None:
        """Every sampled query matches the full walk, and the run did evict blocks."""
        tasks = generate_tasks(load_workload("swe-lite"), 10, 3)
        cfg = SimConfig(nodes=2, workers=10, kv_tokens=60_000, sample_s=2.0)
        cls = scheduler(policy)
        _Compared.checks = _Compared.evicted = 0
        sim = _Compared(tasks, cfg, lambda s: cls(s, policy), policy=policy, seed=3)
        sim.run()
        assert _Compared.checks > 100
        assert _Compared.evicted > 0
