"""The one KV tier model (shared/core/tiers.py) and the node cost that prices with it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shared.core.engine import PROFILES
from shared.core.nodecost import NodeCost, from_profile
from shared.core.tiers import CPU, GPU, HostLink, host_credit, tier_of, tiered_credits

LINK = PROFILES["deepseek-4xh100"].host_link(4.0)
assert LINK is not None
RATE = LINK.load_s_per_token
COST = from_profile(PROFILES["deepseek-4xh100"], load_s=RATE)
"""deepseek-4xh100's prices with its 4x host tier."""


@pytest.mark.parametrize(
    ("medium", "tier"),
    [(None, GPU), ("GPU", GPU), ("CPU", CPU), ("STORAGE", None), ("cpu", None), ("", None)],
)
def test_tier_of_names_vllms_media(medium: str | None, tier: str | None) -> None:
    """vllm/distributed/kv_events.py:51-53@0.32: MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE."""
    assert tier_of(medium) == tier


class TestHostLink:
    def test_load_moves_each_gpus_shard_over_its_own_link(self) -> None:
        link = HostLink(blocks=10, block_size=16, bytes_per_token=1000, h2d_bytes_s=1e6,
                        d2h_bytes_s=2e6)  # fmt: skip
        assert link.load_s(1000) == pytest.approx(1.0)
        assert link.store_s(1000) == pytest.approx(0.5)
        assert link.tokens == 160

    @pytest.mark.parametrize(
        "kw",
        [{"blocks": 0}, {"bytes_per_token": 0}, {"h2d_bytes_s": 0.0},
         {"d2h_bytes_s": math.inf}, {"h2d_bytes_s": math.nan}],
    )  # fmt: skip
    def test_rejects_impossible_links(self, kw: dict[str, float]) -> None:
        base = {"blocks": 1, "block_size": 16, "bytes_per_token": 1, "h2d_bytes_s": 1.0,
                "d2h_bytes_s": 1.0}  # fmt: skip
        with pytest.raises(ValueError, match=next(iter(kw))):
            HostLink(**{**base, **kw})  # type: ignore[arg-type]

    @pytest.mark.parametrize("factor", [-1.0, math.inf, math.nan])
    def test_profile_rejects_bad_factors(self, factor: float) -> None:
        with pytest.raises(ValueError, match="host KV factor"):
            PROFILES["qwen3-32b-tp2"].host_link(factor)

    def test_factor_scales_the_gpu_kv_and_zero_is_no_tier(self) -> None:
        p = PROFILES["qwen3-32b-tp2"]
        assert p.host_link(0.0) is None
        link = p.host_link(4.0)
        assert link is not None and link.blocks == 4 * p.num_gpu_blocks


@pytest.mark.parametrize(
    ("tokens", "load", "recompute", "credit"),
    [(1000, 0.0, 1.0, 1000), (1000, 0.25, 1.0, 750), (1000, 1.0, 1.0, 0), (1000, 2.0, 1.0, 0),
     (0, 0.1, 1.0, 0), (1000, 0.1, 0.0, 0)],
)  # fmt: skip
def test_host_credit_is_the_share_of_the_recompute_the_load_saves(
    tokens: int, load: float, recompute: float, credit: int
) -> None:
    assert host_credit(tokens, load, recompute) == credit


class TestTieredCredits:
    def test_host_beyond_the_gpu_run_adds_its_priced_credit(self) -> None:
        gpu = {"a": (4096, 0.0)}
        out = tiered_credits({"a": 4096}, gpu, {"a": 30_000, "b": 30_000}, {"a": COST, "b": COST},
                             256)  # fmt: skip
        extra = 30_000 - 4096
        priced = host_credit(extra, extra * RATE, COST.recompute_s(extra, 4096))
        assert 0 < priced < extra
        assert out["a"] == 4096 + round(priced / 256) * 256
        alone = host_credit(30_000, 30_000 * RATE, COST.recompute_s(30_000, 0))
        assert out["b"] == round(alone / 256) * 256

    @pytest.mark.parametrize(
        ("host", "rate"),
        [
            ({"a": 2048}, {"a": COST}),
            ({"a": 30_000}, {}),
            ({"a": 30_000}, {"a": replace(COST, load_s=0.0)}),
        ],
    )
    def test_nothing_added_without_a_tier_or_beyond_the_gpu(
        self, host: dict[str, int], rate: dict[str, NodeCost]
    ) -> None:
        """A host run no longer than the GPU's, or a node without a host link, adds nothing."""
        assert tiered_credits({"a": 4096}, {"a": (4096, 0.0)}, host, rate, 256) == {"a": 4096}


class TestTierPricing:
    """A host-held prefix costs its load, not its recompute, to release and to readmit."""

    def test_release_of_a_host_held_session_costs_its_load(self) -> None:
        tokens = 30_000
        blind = COST.release_s(tokens, 8)
        tiered = COST.release_s(tokens, 8, tokens)
        assert tiered == pytest.approx(tokens * RATE + COST.requeue_s)
        assert tiered < blind / 10
        assert COST.release_s(tokens, 8, tokens, tier=False) == blind

    def test_only_the_part_the_host_holds_is_loaded(self) -> None:
        tokens, held = 30_000, 10_000
        cost = COST.release_s(tokens, 0, held)
        expect = held * RATE + COST.recompute_s(tokens - held, held) + COST.requeue_s
        assert cost == pytest.approx(expect)

    @pytest.mark.parametrize(("remaining", "worth"), [(0.05, False), (0.5, True), (30.0, True)])
    def test_a_short_remaining_call_is_worth_releasing_only_with_the_tier(
        self, remaining: float, worth: bool
    ) -> None:
        assert (COST.release_net_s(remaining, 30_000, 8, 30_000) > 0) is worth
        assert (COST.release_net_s(remaining, 30_000, 8, 30_000, tier=False) > 0) is (
            remaining > COST.release_s(30_000, 8)
        )

    def test_readmission_horizon_is_the_loop_plus_the_load(self) -> None:
        h = COST.readmit_s(30_000, 30_000)
        assert h == pytest.approx(COST.requeue_s + 30_000 * RATE)
        assert h < COST.readmit_s(30_000)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_can_have_a_host_tier(name: str) -> None:
    """tao sim --host-kv works with every built-in profile: each knows its KV bytes per GPU per
    token, and a load is far cheaper than the prefill it replaces."""
    p = PROFILES[name]
    link = p.host_link(1.0)
    assert link is not None and link.blocks == p.num_gpu_blocks
    assert link.load_s_per_token < p.prefill_b / 5
