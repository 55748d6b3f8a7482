"""The gateway's prompt-size estimate, calibrated per model from the nodes' usage."""

from __future__ import annotations

import pytest

from services.gateway.calibration import HIGH, LOW, PromptCalibration


def test_uncalibrated_is_the_raw_estimate() -> None:
    c = PromptCalibration()
    assert c.scale("m", 1000) == 1000 and c.scale(None, 0) == 0 and c.factor("m") == 1.0


def test_first_observation_sets_then_averages() -> None:
    """The simnode's ~5-character pieces: 800 tokens where chars / 4 said 1,000."""
    c = PromptCalibration(alpha=0.5)
    c.observe("m", 1000, 800)
    assert c.scale("m", 2000) == 1600
    c.observe("m", 1000, 1000)
    assert c.factor("m") == pytest.approx(0.9)
    assert c.scale("other", 2000) == 2000  # per model


@pytest.mark.parametrize(("actual", "factor"), [(10, LOW), (100_000, HIGH)])
def test_clipped(actual: int, factor: float) -> None:
    c = PromptCalibration()
    c.observe("m", 1000, actual)
    assert c.factor("m") == factor


def test_no_usage_learns_nothing() -> None:
    c = PromptCalibration()
    c.observe("m", 1000, 0)
    c.observe("m", 0, 500)
    assert c.factor("m") == 1.0
