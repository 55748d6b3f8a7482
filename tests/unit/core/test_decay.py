"""Cache credit decay: k = round_to(U, k0 * 2 ** (-(now - t_obs) / h))."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.decay import (
    confirmed_t_obs,
    decay_factor,
    decayed_credit,
    decayed_credits,
    round_to,
    with_evidence,
)


class TestRoundTo:
    """round_to gives the nearest multiple of the unit, ties half up, exactly."""

    @pytest.mark.parametrize(
        ("unit", "x", "expected"),
        [
            (1, 0.0, 0),
            (1, 0.4, 0),
            (1, 0.5, 1),
            (1, 1.5, 2),
            (1, 2.5, 3),
            (1, 0.49999999999999994, 0),
            (4, 6.0, 8),
            (4, 5.999, 4),
            (4, 2.0, 4),
            (4, 1.999, 0),
            (256, 383.9, 256),
            (256, 384.0, 512),
            (512, 10_000_000.0, 9_999_872),
            (3, 7.0, 6),
            (1, 12345, 12345),
        ],
    )
    def test_table(self, unit: int, x: float, expected: int) -> None:
        """Each row rounds to the expected multiple."""
        assert round_to(unit, x) == expected

    @pytest.mark.parametrize("unit", [0, -1])
    def test_unit_below_one_rejected(self, unit: int) -> None:
        """A unit below 1 is an error."""
        with pytest.raises(ValueError, match="unit"):
            round_to(unit, 1.0)

    @given(st.integers(1, 4096), st.floats(0, 1e9, allow_nan=False))
    def test_nearest_multiple(self, unit: int, x: float) -> None:
        """The result is a multiple of the unit within half a unit of x."""
        y = round_to(unit, x)
        assert y % unit == 0
        assert abs(y - x) <= unit / 2


class TestDecayedCredit:
    """The credit halves every half-life, is rounded to the unit and never grows with age."""

    @pytest.mark.parametrize(
        ("k0", "t_obs", "now", "unit", "expected"),
        [
            (1000, 0.0, 0.0, 1, 1000),  # age 0
            (1000, 0.0, 10.0, 1, 500),  # one half-life halves
            (1000, 0.0, 20.0, 1, 250),  # two quarter
            (1000, 0.0, 5.0, 1, 707),  # 1000 / sqrt(2) = 707.1
            (1000, 0.0, 10.0, 1000, 1000),  # 500 is a tie: half up
            (1000, 0.0, 20.0, 1000, 0),  # 250 rounds down
            (1000, 0.0, 10.0, 300, 600),  # 500 → nearest multiple of 300 is 600
            (768, 0.0, 10.0, 256, 512),  # 384 = 1.5 units: tie, half up
            (1000, 50.0, 40.0, 1, 1000),  # negative age (skew) counts as 0
            (0, 0.0, 0.0, 1, 0),  # nothing resident
            (-5, 0.0, 0.0, 1, 0),  # nonsense k0 gives 0
            (10**7, 0.0, 10.0, 1, 5_000_000),  # large
            (10**7, 0.0, 0.0, 512, 9_999_872),  # 19531.25 units → 19531 units
            (1000, 0.0, 10_000.0, 1, 0),  # very old
            (1000, float("-inf"), 0.0, 1, 0),  # infinitely old
            (2**60 + 1, 0.0, 0.0, 1, 2**60 + 1),  # exact beyond float precision at age 0
        ],
    )
    def test_table(self, k0: int, t_obs: float, now: float, unit: int, expected: int) -> None:
        """Each row decays and rounds to the expected credit."""
        got = decayed_credit(k0, t_obs, now, unit=unit)
        assert got == expected
        assert isinstance(got, int)

    def test_custom_half_life(self) -> None:
        """A 5 s half-life halves twice in 10 s."""
        assert decayed_credit(1000, 0.0, 10.0, half_life_s=5.0, unit=1) == 250

    @pytest.mark.parametrize("half_life", [0.0, -1.0, float("inf"), float("nan")])
    def test_bad_half_life_rejected(self, half_life: float) -> None:
        """A non-positive or non-finite half-life is an error."""
        with pytest.raises(ValueError, match="half_life_s"):
            decayed_credit(1000, 0.0, 1.0, half_life_s=half_life, unit=1)

    def test_nan_time_rejected(self) -> None:
        """A NaN timestamp is an error, not a silent zero."""
        with pytest.raises(ValueError, match="NaN"):
            decayed_credit(1000, float("nan"), 1.0, unit=1)

    @given(
        k0=st.integers(0, 10**8),
        age1=st.floats(-100, 1000, allow_nan=False),
        age2=st.floats(-100, 1000, allow_nan=False),
        unit=st.integers(1, 1024),
        h=st.floats(0.1, 100),
    )
    def test_monotone_in_age(self, k0: int, age1: float, age2: float, unit: int, h: float) -> None:
        """An older observation never gives more credit than a newer one of the same size."""
        lo, hi = sorted((age1, age2))
        young = decayed_credit(k0, 0.0, lo, half_life_s=h, unit=unit)
        old = decayed_credit(k0, 0.0, hi, half_life_s=h, unit=unit)
        assert 0 <= old <= young
        assert young <= round_to(unit, k0)

    def test_factor_clamps_negative_age(self) -> None:
        """The factor is 1 for a negative age."""
        assert decay_factor(-3.0) == 1.0


class TestDecayedCredits:
    """Per-node credits drop nodes whose credit rounds to zero."""

    def test_map(self) -> None:
        """Each node's observation decays on its own age."""
        residency = {"b": (1000, 0.0), "a": (4000, 10.0), "c": (100, -100.0)}
        assert decayed_credits(residency, 20.0, unit=1) == {"a": 2000, "b": 250}


class TestEvidence:
    """An observation ages from the latest time a complete KV-event stream confirms it."""

    @pytest.mark.parametrize(
        ("t_obs", "evidence", "confirmed"),
        [
            (100.0, (50.0, 200.0), 200.0),  # healthy since before it: confirmed up to 200
            (50.0, (50.0, 200.0), 200.0),  # observed as the stretch began
            (40.0, (50.0, 200.0), 40.0),  # before a gap/clear at 50: its own time
            (250.0, (50.0, 200.0), 250.0),  # newer than the stream's latest batch
            (100.0, None, 100.0),  # no KV events (usage-based)
        ],
    )
    def test_confirmed_t_obs(
        self, t_obs: float, evidence: tuple[float, float] | None, confirmed: float
    ) -> None:
        assert confirmed_t_obs(t_obs, evidence) == confirmed

    def test_with_evidence(self) -> None:
        """Only the pairs on nodes with evidence move; maps with nothing moved are the same
        objects, and nothing is changed in place."""
        untouched = {"n2": (512, 100.0)}
        residency = {"a": {"n1": (1024, 100.0), "n2": (512, 100.0)}, "b": untouched}
        out = with_evidence(residency, {"n1": (50.0, 300.0)})
        assert out == {"a": {"n1": (1024, 300.0), "n2": (512, 100.0)}, "b": untouched}
        assert out["b"] is untouched and residency["a"]["n1"] == (1024, 100.0)
        assert with_evidence(residency, {}) is residency
        now = 300.0
        assert decayed_credits(out["a"], now, unit=256) == {"n1": 1024}
        assert decayed_credits(residency["a"], now, unit=256) == {}
