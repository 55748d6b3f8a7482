"""Signatures: stable eligibility digests and the changed-selection check."""

from __future__ import annotations

import pytest

from shared.core.problem import ZERO, Assignment, Candidate, Node, PlanResult, Problem
from shared.core.signature import (
    Signature,
    changed,
    eligibility_digest,
    selected,
    set_digest,
    signature_of,
    signatures,
)


class TestEligibilityDigest:
    """The digest is 16 hex chars and depends only on the set of node ids."""

    @pytest.mark.parametrize(
        ("a", "b", "same"),
        [
            (["n1", "n2"], ["n2", "n1"], True),
            (["n1", "n2"], ["n1", "n2", "n1"], True),
            (["n1"], ["n1", "n2"], False),
            ([], [], True),
            ([], [""], False),
            (["ab", "c"], ["a", "bc"], False),  # length prefixes keep boundaries
            (["n1"], ["N1"], False),
        ],
    )
    def test_table(self, a: list[str], b: list[str], same: bool) -> None:
        """Each pair digests equal exactly when the sets are equal."""
        assert (eligibility_digest(a) == eligibility_digest(b)) is same

    def test_format_and_stability(self) -> None:
        """The digest is lowercase hex of length 16 and fixed across runs."""
        d = eligibility_digest(["n1", "n2"])
        assert len(d) == 16
        assert d == d.lower()
        int(d, 16)
        assert d == eligibility_digest(("n2", "n1"))

    @pytest.mark.parametrize("ids", [[], [""], ["n1"], ["n2", "n1", "n3"]])
    def test_set_digest_is_the_digest(self, ids: list[str]) -> None:
        """The cached digest of a frozen set is the digest of its ids, asked once or twice."""
        assert set_digest(frozenset(ids)) == eligibility_digest(ids)
        assert set_digest(frozenset(ids)) == eligibility_digest(ids)


class TestChanged:
    """Selected sessions whose live signature differs or vanished are reported once, in order."""

    A = Signature("a", 1, eligibility_digest(["n1"]))
    B = Signature("b", 4, eligibility_digest(["n1", "n2"]))

    @pytest.mark.parametrize(
        ("live", "expected"),
        [
            ({"a": A, "b": B}, []),
            ({"a": A, "b": Signature("b", 5, B.eligibility_digest)}, ["b"]),  # version bumped
            ({"a": Signature("a", 1, eligibility_digest(["n2"])), "b": B}, ["a"]),
            ({"b": B}, ["a"]),  # gone
            ({}, ["a", "b"]),
        ],
    )
    def test_table(self, live: dict[str, Signature], expected: list[str]) -> None:
        """Each row reports exactly the expected session ids."""
        assert changed([self.A, self.B, self.A], live) == expected

    def test_signature_of(self) -> None:
        """A candidate's signature digests its eligible set; None means every node."""
        c = Candidate(id="s", weight=1, tokens=1, eligible=frozenset({"n2", "n1"}))
        assert signature_of(c, 3, ["n1", "n2", "n3"]) == Signature(
            "s", 3, self.B.eligibility_digest
        )
        anywhere = Candidate(id="s", weight=1, tokens=1)
        assert (
            signature_of(anywhere, 3, ["n2", "n1"]).eligibility_digest == self.B.eligibility_digest
        )


class TestPlanSignatures:
    """A problem's signatures follow its candidates; a plan's selection follows its order."""

    PROBLEM = Problem(
        quantum=1,
        nodes=(Node("n1", 10), Node("n2", 10)),
        candidates=(
            Candidate("a", 1, 1, eligible=frozenset({"n1"})),
            Candidate("b", 1, 1),
        ),
    )

    def test_signatures_and_selected(self) -> None:
        """Every candidate gets a signature; the selection is in assignment order."""
        table = signatures(self.PROBLEM, {"a": 1, "b": 4})
        assert table == {"a": TestChanged.A, "b": TestChanged.B}
        plan = PlanResult(
            assignments=(Assignment("b", "n2"), Assignment("a", "n1")),
            objective=ZERO,
            exact=True,
            method="test",
        )
        assert selected(plan, table) == [TestChanged.B, TestChanged.A]

    def test_missing_version_rejected(self) -> None:
        """A candidate without a version is an error naming the session."""
        with pytest.raises(KeyError, match="'b'"):
            signatures(self.PROBLEM, {"a": 1})
