"""A node's price from its own vLLM metrics (shared/core/nodecost.py, telemetry's estimate).

The estimator reads three per-request counters of a real engine; here they are checked against
the engine's own per-request usage, and the price telemetry writes for each node is checked to
come from them: measured, not the profile's literal.
"""

from __future__ import annotations

import random

import aiohttp
import pytest

from services.telemetry.prom import parse
from services.telemetry.vllm_metrics import VllmMetrics, from_samples
from shared.core.nodecost import PrefillEstimator
from shared.infra.store import Store
from tests.real.conftest import Rig
from tests.real.test_vllm import cached, chat, http, store, text, wait_for

pytestmark = pytest.mark.real

__all__ = ["http", "store"]  # the fixtures, for pytest


async def metrics(http: aiohttp.ClientSession, url: str) -> VllmMetrics:
    async with http.get(url) as resp:
        assert resp.status == 200
        return from_samples(parse(await resp.text()))


class TestNodeCost:
    """Each node's prefill price is measured from the engine's own counters."""

    async def test_counters_agree_with_the_engines_usage(
        self, rig: Rig, http: aiohttp.ClientSession
    ) -> None:
        """Between two scrapes, the counters' computed tokens are the prompts' tokens less the
        cached ones the engine reported per request, and the estimate without a prior is the
        engine's prefill seconds over the profile's prediction for exactly those requests."""
        node = rig.nodes[1]
        rng = random.Random(7)
        url = f"{rig.root(node.id)}/metrics"
        before = await metrics(http, url)
        assert before.prefill is not None, "vLLM 0.32's prefill counters are on /metrics"
        computed = requests = 0
        for words in (200, 600, 1200):
            answer = await chat(
                http, rig.root(node.id), [{"role": "user", "content": text(rng, words)}],
                max_tokens=1,
            )  # fmt: skip
            computed += answer["usage"]["prompt_tokens"] - cached(answer)
            requests += 1
        after = await wait_for(
            lambda: _finished(http, url, before, requests), "the requests counted"
        )
        assert after.prefill is not None
        prior = node.prior_cost()
        est = PrefillEstimator(prior, prior_s=0.0)
        est.observe(before.prefill)
        est.observe(after.prefill)
        assert est.observed_tokens == computed
        d = after.prefill
        n = computed / requests
        prompt = d.prompt_tokens - before.prefill.prompt_tokens
        c = (prompt - computed) / requests
        predicted = requests * (prior.prefill_s * n + prior.attn_s * n * (c + n / 2))
        measured = d.prefill_s - before.prefill.prefill_s
        assert measured > 0
        assert est.factor == pytest.approx(measured / predicted)
        cost = est.cost()
        assert cost.source == "measured"
        assert cost.prefill_s == pytest.approx(prior.prefill_s * measured / predicted)

    async def test_telemetry_writes_each_nodes_measured_price(
        self, rig: Rig, http: aiohttp.ClientSession, store: Store
    ) -> None:
        """After a prompt on each engine, its node record carries a measured price resting on
        the tokens it computed, and the valuation's view of the node prices with it."""
        rng = random.Random(11)
        for node in rig.nodes:
            await chat(http, rig.root(node.id), [{"role": "user", "content": text(rng, 400)}],
                       max_tokens=1)  # fmt: skip

        async def measured() -> bool:
            recs = [await store.get_node(n.id) for n in rig.nodes]
            return all(r is not None and r.cost_source == "measured" for r in recs)

        await wait_for(measured, "both nodes' prices measured")
        for node in rig.nodes:
            rec = await store.get_node(node.id)
            assert rec is not None and rec.cost_tokens and rec.cost_tokens > 0
            view = rec.view()
            assert view.cost is not None and view.cost.source == "measured"
            assert view.cost.prefill_s == rec.prefill_s != node.prior_cost().prefill_s


async def _finished(
    http: aiohttp.ClientSession, url: str, before: VllmMetrics, requests: int
) -> VllmMetrics | None:
    m = await metrics(http, url)
    assert m.prefill is not None and before.prefill is not None
    return m if m.prefill.requests - before.prefill.requests >= requests else None


class TestCalibrate:
    """`tao engines calibrate` reads its samples from the engines' own per-request clocks."""

    async def test_quick_probe_samples_what_it_sent(self, rig: Rig) -> None:
        from shared.cli.calibrate import run_calibrate

        roots = [rig.root(n.id) for n in rig.nodes]
        doc = await run_calibrate(roots, quick=True, reps=1)
        pre = doc["prefill_samples"]
        cold = [s for s in pre if s[1] == 0]
        warm = [s for s in pre if s[1] > 0]
        assert len(cold) == 3 * len(roots) and len(warm) == 2 * len(roots)
        assert all(new > 0 and t > 0 for new, _, t in pre)
        assert all(ctx >= 1024 - 32 for _, ctx, _ in warm)  # the prefix, in whole blocks
        assert sorted(new for new, _, _ in cold[:3]) == [new for new, _, _ in cold[:3]]
        assert doc["decode_samples"] and all(b >= 1 and t > 0 for b, _, t in doc["decode_samples"])
        assert doc["prefill"]["terms"]["prefill_b"] >= 0.0
