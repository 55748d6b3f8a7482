"""The seeded snapshot generator: deterministic, calibrated, well-formed."""

from __future__ import annotations

import numpy as np
import pytest

from shared.core.generate import Family, families, generate
from shared.core.problem import Problem, densify

CASES = [
    Family(2, 8, 0.5, "one"),
    Family(4, 64, 3.0, "one"),
    Family(8, 32, 1.0, "several"),
    Family(16, 160, 5.0, "none"),
    Family(4, 64, 2.0, "one", True),
    Family(8, 128, 1.0, "several", True),
]


def make(seed: int, case: Family) -> Problem:
    return case.problem(seed)


class TestDeterminism:
    """The same seed and arguments give the same problem; another seed gives another."""

    @pytest.mark.parametrize("case", CASES)
    def test_same_seed_same_problem(self, case: Family) -> None:
        assert make(7, case) == make(7, case)

    def test_other_seed_other_problem(self) -> None:
        assert make(1, CASES[1]) != make(2, CASES[1])

    def test_global_random_state_untouched(self) -> None:
        np.random.seed(123)
        first = np.random.random_sample()
        np.random.seed(123)
        make(3, CASES[1])
        assert np.random.random_sample() == first


class TestShape:
    """Ids are s0.. and n0..; weights, tokens and credits follow the documented ranges."""

    @pytest.mark.parametrize("case", CASES)
    def test_ids(self, case: Family) -> None:
        p = make(0, case)
        assert [nd.id for nd in p.nodes] == [f"n{b}" for b in range(case.nodes)]
        assert [c.id for c in p.candidates] == [f"s{i}" for i in range(case.candidates)]
        assert p.quantum == 512

    @pytest.mark.parametrize("case", CASES)
    def test_ranges(self, case: Family) -> None:
        p = make(11, case)
        ids = {nd.id for nd in p.nodes}
        for c in p.candidates:
            assert 4_000 <= c.tokens <= 120_000
            assert c.tokens - 2048 + 512 <= c.weight <= c.tokens + 512
            assert c.ready in (0, 1)
            for node, amount in c.credit.items():
                assert node in ids
                assert 0 < amount <= c.tokens + 256 and amount % 256 == 0
                assert c.eligible is None or node in c.eligible
            if c.eligible is not None:
                assert 0 < len(c.eligible) < len(p.nodes) and c.eligible <= ids
        assert all(nd.free > 0 and nd.load >= 0 for nd in p.nodes)

    def test_credit_modes(self) -> None:
        one = Family(8, 400, 2.0, "one").problem(5)
        several = Family(8, 400, 2.0, "several").problem(5)
        none = Family(8, 400, 2.0, "none").problem(5)
        assert all(len(c.credit) <= 1 for c in one.candidates)
        share = sum(1 for c in one.candidates if c.credit) / 400
        assert 0.45 < share < 0.7
        assert all(len(c.credit) <= 3 for c in several.candidates)
        assert any(len(c.credit) > 1 for c in several.candidates)
        for c in several.candidates:
            assert len(set(c.credit.values())) == len(c.credit)
        assert all(not c.credit for c in none.candidates)
        ready = sum(c.ready for c in one.candidates) / 400
        assert 0.3 < ready < 0.5

    def test_bad_arguments(self) -> None:
        with pytest.raises(ValueError, match="nodes"):
            generate(0, nodes=0, candidates=4, load=1, credit="one", interchangeable=False)
        with pytest.raises(ValueError, match="load"):
            generate(0, nodes=2, candidates=4, load=0, credit="one", interchangeable=False)


class TestLoad:
    """Σ weights / Σ free equals the requested load within rounding."""

    @pytest.mark.parametrize("case", CASES)
    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_ratio(self, case: Family, seed: int) -> None:
        p = make(seed, case)
        ratio = sum(c.weight for c in p.candidates) / sum(nd.free for nd in p.nodes)
        assert ratio == pytest.approx(case.load, rel=1e-3)

    def test_heterogeneous_by_default(self) -> None:
        p = make(4, CASES[1])
        assert len({nd.free for nd in p.nodes}) == len(p.nodes)


class TestInterchangeable:
    """With interchangeable=True all nodes share one free capacity and the last
    max(2, m // 2) nodes have identical dense columns (no credit, same eligibility, load)."""

    @pytest.mark.parametrize("m", [2, 4, 8, 16])
    @pytest.mark.parametrize("seed", [0, 1, 2, 3])
    def test_block_is_identical(self, m: int, seed: int) -> None:
        p = generate(
            seed, nodes=m, candidates=200, load=2.0, credit="several", interchangeable=True
        )
        assert len({nd.free for nd in p.nodes}) == 1
        d = densify(p)
        size = max(2, m // 2)
        block = list(range(m - size, m))
        for b in block:
            assert not d.k[:, b].any()
            assert (d.elig[:, b] == d.elig[:, block[0]]).all()
            assert d.load[b] == d.load[block[0]]
            assert d.cap[b] == d.cap[block[0]]
        for c in p.candidates:
            if c.eligible is not None:
                inside = {f"n{b}" in c.eligible for b in block}
                assert len(inside) == 1


class TestFamilies:
    """The benchmark grid is non-empty, uniquely named, and every family generates."""

    def test_grid(self) -> None:
        fams = families()
        names = [f.name for f in fams]
        assert len(names) == len(set(names)) == 173
        assert {f.nodes for f in fams} == {2, 4, 8, 16}
        assert {f.candidates for f in fams} == {8, 16, 32, 64, 128, 160, 256}
        assert {f.load for f in fams} == {0.5, 1.0, 2.0, 3.0, 5.0}
        assert {f.credit for f in fams} == {"one", "several", "none"}
        assert any(f.interchangeable for f in fams)
        assert all(f.candidates >= 2 * f.nodes for f in fams)

    def test_family_problem(self) -> None:
        fam = Family(4, 64, 3.0, "one", True)
        assert fam.name == "m4-n64-L3-one-ix"
        assert fam.problem(9) == generate(
            9, nodes=4, candidates=64, load=3.0, credit="one", interchangeable=True
        )
