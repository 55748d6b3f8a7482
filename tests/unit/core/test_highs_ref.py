"""The HiGHS staged reference and the brute-force oracle agree on tiny generated instances."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.highs_ref import solve
from shared.core.brute import brute_force
from shared.core.generate import Family
from shared.core.problem import Dense, Objective, densify, is_feasible, objective_of


def tiny_cases() -> list[tuple[int, Family, int]]:
    """30 (seed, family, quantum) triples: 1–3 nodes, 3–7 candidates (two edge cases with
    0–1), loads 0.5–3, every credit mode, both node kinds, a coarse quantum for more ties."""
    rng = np.random.default_rng(2024)
    out = []
    for seed in range(30):
        fam = Family(
            nodes=int(rng.integers(1, 4)),
            candidates=int(rng.integers(3, 8)) if seed % 15 != 14 else seed % 2,
            load=float(rng.choice([0.5, 1.0, 1.5, 2.0, 3.0])),
            credit=("one", "several", "none")[seed % 3],
            interchangeable=bool(seed % 4 == 3),
        )
        out.append((seed, fam, 2048 if seed % 5 == 0 else 512))
    return out


def dense(seed: int, fam: Family, quantum: int) -> Dense:
    return densify(fam.problem(seed, quantum=quantum))


class TestBruteForce:
    """The oracle finds the lexicographic optimum on a hand-checked example."""

    def test_credit_beats_count(self) -> None:
        d = Dense(
            w=np.array([3, 2, 2], dtype=np.int64),
            cap=np.array([4], dtype=np.int64),
            k=np.array([[5], [0], [0]], dtype=np.int64),
            r=np.array([0, 1, 1], dtype=np.int64),
            t=np.array([10, 20, 30], dtype=np.int64),
            elig=np.ones((3, 1), dtype=np.bool_),
            load=np.zeros(1, dtype=np.int64),
            node_ids=("n0",),
            cand_ids=("s0", "s1", "s2"),
        )
        choice, obj = brute_force(d)
        assert choice == (0, -1, -1)
        assert obj == Objective(5, 0, 10, 1)

    def test_refuses_large(self) -> None:
        with pytest.raises(ValueError, match="brute_force"):
            brute_force(dense(0, Family(4, 8, 1.0), 512))


class TestHighsMatchesBruteForce:
    """HiGHS, stage by stage, reaches the brute-force optimum with a feasible choice."""

    @pytest.mark.parametrize(("seed", "fam", "quantum"), tiny_cases(), ids=lambda x: str(x))
    def test_same_optimum(self, seed: int, fam: Family, quantum: int) -> None:
        d = dense(seed, fam, quantum)
        _, want = brute_force(d)
        got = solve(d, time_limit=10.0)
        assert got.optimal
        assert is_feasible(d, got.choice)
        assert objective_of(d, got.choice) == got.objective
        assert got.objective == want


class TestHighsTimeLimit:
    """With no time left it returns the empty plan, flagged as not optimal."""

    def test_zero_budget(self) -> None:
        d = dense(1, Family(4, 64, 3.0), 512)
        got = solve(d, time_limit=0.0)
        assert not got.optimal
        assert got.choice == (-1,) * 64
        assert got.statuses == ("not-run",) * 4
