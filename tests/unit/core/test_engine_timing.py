"""Engine timing model: the step-cost formulas and the times a request observes."""

from __future__ import annotations

import dataclasses

import pytest

from shared.core.engine import (
    DEFAULT_PROFILE,
    PROFILES,
    Engine,
    EngineRequest,
    Profile,
    decode_step_time,
    prefill_time,
    step_time,
)

QWEN = PROFILES["qwen3-32b-tp2"]


class TestProfiles:
    """The built-in profiles exist, cite sources and hold whole blocks."""

    def test_names_and_default(self) -> None:
        """The named deployments are registered (the paper's DeepSeek as its fitted profile)
        and the default is one of them."""
        assert set(PROFILES) == {
            "qwen3-32b-tp2",
            "moe-tp8",
            "deepseek-4xh100",
            "paper-deepseek",
            "vllm-cpu-tiny",
        }
        assert DEFAULT_PROFILE in PROFILES

    @pytest.mark.parametrize("name", sorted(PROFILES))
    def test_profile_is_sane(self, name: str) -> None:
        """Capacity is whole blocks and the source names where the numbers come from: the
        hardware, or the calibration that measured them."""
        p = PROFILES[name]
        assert p.kv_tokens % p.block_size == 0
        assert p.num_gpu_blocks * p.block_size == p.kv_tokens
        assert "H100" in p.source or "tao engines calibrate" in p.source

    def test_capacities(self) -> None:
        """Qwen3-32B TP2 holds ~262k tokens and the TP8 MoE ~0.5M."""
        assert PROFILES["qwen3-32b-tp2"].kv_tokens == 262_144
        assert PROFILES["moe-tp8"].kv_tokens == 524_288

    def test_bad_profile_rejected(self) -> None:
        """A negative coefficient is refused with its field name."""
        with pytest.raises(ValueError, match="decode_e"):
            dataclasses.replace(QWEN, decode_e=-1.0)


class TestFormulas:
    """prefill_time and decode_step_time follow their formulas."""

    def test_prefill_hand_computed(self) -> None:
        """1000 new tokens after 500 cached: a + b*T + f*T*(P + T/2)."""
        expected = 15e-3 + 50e-6 * 1000 + 2.3e-9 * 1000 * (500 + 500)
        assert prefill_time(QWEN, 1000, 500) == pytest.approx(expected, rel=1e-12)
        assert prefill_time(QWEN, 1000, 500) == pytest.approx(0.0673, rel=1e-9)

    def test_decode_hand_computed(self) -> None:
        """64 sequences over 640k context tokens: c + d*B + e*S = 15 + 1.28 + 35.2 ms."""
        assert decode_step_time(QWEN, 64, 640_000) == pytest.approx(0.05148, rel=1e-9)

    def test_mixed_step_pays_one_fixed_cost(self) -> None:
        """A step with prefill and decode pays max(a, c) once, plus both variable parts."""
        p = dataclasses.replace(QWEN, prefill_a=0.010, decode_c=0.020)
        t = step_time(p, ((100, 0),), 2, 300)
        assert t == pytest.approx(0.020 + 50e-6 * 100 + 2.3e-9 * 100 * 50 + 20e-6 * 2 + 55e-9 * 300)

    def test_empty_step_costs_nothing(self) -> None:
        """No work, no time."""
        assert step_time(QWEN, (), 0, 0) == 0.0


class TestObservedTimes:
    """A lone request's TTFT is its prefill step and each further token one decode step."""

    def test_single_request(self) -> None:
        """Prompt 100, 3 tokens: first token after one prefill, then decodes over 101, 102."""
        e = Engine("n", QWEN)
        e.submit(EngineRequest("r", "s", list(range(100)), 3), 1.0)
        (c,) = e.advance(10.0)
        t1 = 1.0 + prefill_time(QWEN, 100, 0)
        t2 = t1 + decode_step_time(QWEN, 1, 101)
        t3 = t2 + decode_step_time(QWEN, 1, 102)
        assert c.arrived_at == 1.0
        assert c.first_token_at == pytest.approx(t1, rel=1e-12)
        assert c.finished_at == pytest.approx(t3, rel=1e-12)
        assert c.first_token_at == pytest.approx(1.0200115, rel=1e-9)

    def test_chunked_prefill(self) -> None:
        """A prompt longer than the token budget is prefilled in budget-sized chunks."""
        p: Profile = dataclasses.replace(QWEN, max_batched_tokens=64)
        e = Engine("n", p)
        e.submit(EngineRequest("r", "s", list(range(150)), 1), 0.0)
        (c,) = e.advance(10.0)
        expected = prefill_time(p, 64, 0) + prefill_time(p, 64, 64) + prefill_time(p, 22, 128)
        assert c.finished_at == pytest.approx(expected, rel=1e-12)
        assert e.steps == 3

    def test_late_arrival_waits_for_step_in_flight(self) -> None:
        """A request arriving mid-step joins the next step, not the one in flight."""
        e = Engine("n", QWEN)
        e.submit(EngineRequest("a", "s", list(range(100)), 1), 0.0)
        e.advance(0.0)
        e.submit(EngineRequest("b", "t", list(range(1000, 1100)), 1), 0.005)
        done = e.advance(10.0)
        t_a = prefill_time(QWEN, 100, 0)
        assert [c.request_id for c in done] == ["a", "b"]
        assert done[1].finished_at == pytest.approx(t_a + prefill_time(QWEN, 100, 0), rel=1e-12)
