"""One cost model per node (shared/core/nodecost.py): prices from a profile, and the live
estimator that measures a node from its own prefill counters."""

from __future__ import annotations

import math

import pytest

from shared.core.engine.profiles import DEFAULT_PROFILE, PROFILES
from shared.core.nodecost import (
    DEFAULT_COST,
    ControlLatency,
    NodeCost,
    PrefillEstimator,
    PrefillSample,
    from_profile,
)

PRIOR = NodeCost(prefill_s=50e-6, attn_s=2.3e-9, requeue_s=0.014)


def counters(seconds: float, requests: int, prompt: int, cached: int) -> PrefillSample:
    return PrefillSample(seconds, requests, prompt, cached)


def predicted(cost: NodeCost, requests: int, computed: int, prompt: int) -> float:
    n = computed / requests
    c = (prompt - computed) / requests
    return requests * (cost.prefill_s * n + cost.attn_s * n * (c + n / 2))


class TestFromProfile:
    """A node's prices come from the thing they price: its profile and its control loop."""

    def test_default_is_the_default_profiles(self) -> None:
        p = PROFILES[DEFAULT_PROFILE]
        assert (DEFAULT_COST.prefill_s, DEFAULT_COST.attn_s) == (p.prefill_b, p.prefill_f)
        assert DEFAULT_COST.requeue_s == pytest.approx(ControlLatency().round_trip_s)
        assert DEFAULT_COST.source == "profile" and DEFAULT_COST.load_s == 0.0

    @pytest.mark.parametrize("name", sorted(PROFILES))
    def test_every_profile(self, name: str) -> None:
        p = PROFILES[name]
        instant = ControlLatency(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        c = from_profile(p, instant, 1e-7)
        assert (c.prefill_s, c.attn_s, c.requeue_s, c.load_s) == (p.prefill_b, p.prefill_f, 0, 1e-7)

    @pytest.mark.parametrize("field", ["prefill_s", "attn_s", "requeue_s", "load_s"])
    @pytest.mark.parametrize("bad", [-1e-9, math.inf, math.nan])
    def test_bad_price_is_refused(self, field: str, bad: float) -> None:
        values = {"prefill_s": 1e-5, "attn_s": 1e-9, "requeue_s": 0.01, field: bad}
        with pytest.raises(ValueError, match=f"NodeCost.{field}"):
            NodeCost(**values)


class TestPrices:
    """Recompute, release and readmission prices in seconds, as derived in docs/internals.md."""

    def test_recompute_attends_to_what_is_kept(self) -> None:
        assert PRIOR.recompute_s(1000, 0) == pytest.approx(1000 * (50e-6 + 2.3e-9 * 500))
        assert PRIOR.recompute_s(1000, 4000) == pytest.approx(1000 * (50e-6 + 2.3e-9 * 4500))
        assert PRIOR.recompute_s(-5, 10) == 0.0

    def test_release_delays_the_running_batch(self) -> None:
        one = PRIOR.release_s(10_000, 0) - PRIOR.requeue_s
        assert PRIOR.release_s(10_000, 3) == pytest.approx(4 * one + PRIOR.requeue_s)

    def test_host_tier_loads_what_it_holds(self) -> None:
        tiered = NodeCost(50e-6, 2.3e-9, 0.014, load_s=1e-6)
        rec, load = tiered.refill_s(10_000, 0, 6_000)
        assert load == pytest.approx(6_000 * 1e-6)
        assert rec == pytest.approx(tiered.recompute_s(4_000, 6_000))
        assert tiered.refill_s(10_000, 0, 6_000, tier=False) == (PRIOR.recompute_s(10_000, 0), 0.0)


class TestEstimator:
    """The node's factor over its prior profile, from its per-request prefill counters."""

    def test_starts_at_the_prior(self) -> None:
        est = PrefillEstimator(PRIOR)
        assert est.cost() == PRIOR
        est.observe(counters(0.0, 0, 0, 0))
        assert est.cost() == PRIOR  # one scrape is no interval

    def test_converges_on_what_the_node_measures(self) -> None:
        """A node 3.5x slower than its profile: the estimate moves from 1 toward 3.5 as it
        computes, never past it, and the price is the prior's terms times the factor."""
        est = PrefillEstimator(PRIOR, prior_s=2.0, half_life_s=1e9)
        total = counters(0.0, 0, 0, 0)
        est.observe(total)
        factors = []
        for _ in range(40):
            step_pred = predicted(PRIOR, 10, 20_000, 30_000)
            total = counters(
                total.prefill_s + 3.5 * step_pred,
                total.requests + 10,
                total.prompt_tokens + 30_000,
                total.cached_tokens + 10_000,
            )
            est.observe(total)
            factors.append(est.factor)
        assert factors == sorted(factors) and 1.0 < factors[0] < factors[-1] < 3.5
        assert factors[-1] == pytest.approx(3.5, rel=0.05)  # (2 + 3.5·43.7) / (2 + 43.7)
        cost = est.cost()
        assert cost.source == "measured" and cost.observed_tokens == 40 * 20_000
        assert cost.prefill_s == pytest.approx(PRIOR.prefill_s * est.factor)
        assert cost.attn_s == pytest.approx(PRIOR.attn_s * est.factor)
        assert cost.requeue_s == PRIOR.requeue_s

    def test_exact_without_a_prior(self) -> None:
        est = PrefillEstimator(PRIOR, prior_s=0.0)
        est.observe(counters(1.0, 3, 100, 0))
        est.observe(counters(1.0 + 0.9, 3 + 4, 100 + 8_000, 2_000))
        assert est.factor == pytest.approx(0.9 / predicted(PRIOR, 4, 6_000, 8_000))

    def test_restart_starts_a_new_interval(self) -> None:
        """Counters that go back (an engine restart) count nothing and start over from there."""
        est = PrefillEstimator(PRIOR, prior_s=0.0)
        est.observe(counters(5.0, 10, 10_000, 0))
        est.observe(counters(0.5, 1, 1_000, 0))  # restarted
        assert est.observed_tokens == 0
        est.observe(counters(1.5, 2, 2_000, 0))
        assert est.observed_tokens == 1_000
        assert est.factor == pytest.approx(1.0 / predicted(PRIOR, 1, 1_000, 1_000))

    def test_idle_intervals_change_nothing(self) -> None:
        est = PrefillEstimator(PRIOR)
        est.observe(counters(1.0, 2, 100, 0))
        est.observe(counters(1.0, 2, 100, 0))
        est.observe(counters(1.2, 3, 150, 50))  # all cached: nothing computed to price
        assert est.observed_tokens == 0 and est.cost() == PRIOR

    def test_old_evidence_fades(self) -> None:
        """With a half-life, a node that becomes faster is followed."""
        est = PrefillEstimator(PRIOR, prior_s=0.0, half_life_s=1.0)
        pred = predicted(PRIOR, 10, 20_000, 20_000)
        total = counters(0.0, 0, 0, 0)
        est.observe(total)
        for factor in [4.0] * 5 + [1.0] * 20:
            total = counters(
                total.prefill_s + factor * pred,
                total.requests + 10,
                total.prompt_tokens + 20_000,
                total.cached_tokens,
            )
            est.observe(total)
        assert est.factor == pytest.approx(1.0, rel=0.05)
