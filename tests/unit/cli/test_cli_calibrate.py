"""`tao engines calibrate`'s fits (shared/cli/calibrate.py) recover known step-time terms."""

from __future__ import annotations

import random

import pytest

from shared.cli.calibrate import fit_decode, fit_prefill
from shared.cli.ops import OpsError


class TestFits:
    """Least squares on the engine's own per-request clocks, nonnegative."""

    def test_prefill_terms_recovered(self) -> None:
        a, b, f = 0.004, 70e-6, 8e-9
        rng = random.Random(3)
        samples = []
        for n, c in [
            (128, 0),
            (512, 0),
            (1024, 0),
            (2048, 0),
            (3072, 0),
            (256, 1024),
            (1024, 1024),
        ]:
            t = a + b * n + f * n * (c + n / 2)
            samples.append((n, c, t * (1 + rng.uniform(-0.01, 0.01))))
        got = fit_prefill(samples)
        assert got.terms["prefill_a"] == pytest.approx(a, rel=0.5, abs=1e-3)
        assert got.terms["prefill_b"] == pytest.approx(b, rel=0.1)
        assert got.terms["prefill_f"] == pytest.approx(f, rel=0.1)
        assert got.rel_err < 0.02 and got.samples == 7

    def test_decode_terms_recovered_and_never_negative(self) -> None:
        c, d, e = 0.010, 0.0, 2e-8  # no per-sequence term at all
        samples = [(b, b * ctx, c + d * b + e * b * ctx) for b in (1, 4, 8) for ctx in (300, 2100)]
        got = fit_decode(samples)
        assert got.terms["decode_c"] == pytest.approx(c, rel=0.01)
        assert got.terms["decode_d"] == pytest.approx(0.0, abs=1e-9)
        assert got.terms["decode_e"] == pytest.approx(e, rel=0.01)
        noisy = [(b, x, t - 0.009 * b) for b, x, t in samples]  # would need d < 0
        assert min(fit_decode(noisy).terms.values()) >= 0.0

    def test_too_few_samples_is_one_line(self) -> None:
        with pytest.raises(OpsError, match="fewer than 3 prefill samples"):
            fit_prefill([(1, 0, 0.1)])
