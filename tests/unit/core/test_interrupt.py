"""Interrupt rule: least valuable non-ready tool-running sessions go first, only when short."""

from __future__ import annotations

import pytest

from shared.core.interrupt import (
    InterruptCandidate,
    interrupt_key,
    pool_deficit,
    select_interrupts,
)


def _c(id_: str, k: int, r: int, t: int, w: int, node: str = "n1") -> InterruptCandidate:
    return InterruptCandidate(id=id_, node=node, weight=w, credit=k, ready=r, tokens=t)


RUNNING = (
    _c("hi-credit", k=5000, r=0, t=100, w=1000),
    _c("ready", k=0, r=1, t=10, w=5000),
    _c("low-t", k=0, r=0, t=50, w=600, node="n2"),
    _c("low-t-big", k=0, r=0, t=50, w=900),
    _c("mid", k=100, r=0, t=10, w=700, node="n2"),
)


class TestSelectInterrupts:
    """Sessions are interrupted in (k, r, t, -w, id) order until the deficit is covered."""

    @pytest.mark.parametrize(
        ("demand", "free", "interrupt", "deficit", "freed", "satisfied"),
        [
            (1000, 1000, (), 0, 0, True),  # demand met: nobody
            (500, 1000, (), 0, 0, True),
            (1000, 100, ("low-t-big",), 900, 900, True),  # larger weight first among equals
            (1000, 0, ("low-t-big", "low-t"), 1000, 1500, True),
            (2000, 0, ("low-t-big", "low-t", "mid"), 2000, 2200, True),
            (3000, 0, ("low-t-big", "low-t", "mid", "hi-credit"), 3000, 3200, True),
            (9000, 0, ("low-t-big", "low-t", "mid", "hi-credit"), 9000, 3200, False),  # r=1 kept
            (1000, -500, ("low-t-big", "low-t"), 1000, 1500, True),  # negative free reads as 0
        ],
    )
    def test_table(
        self,
        demand: int,
        free: int,
        interrupt: tuple[str, ...],
        deficit: int,
        freed: int,
        satisfied: bool,
    ) -> None:
        """Each row interrupts exactly the expected sessions, in order."""
        got = select_interrupts(RUNNING, demand, free)
        assert got.interrupt == interrupt
        assert (got.deficit, got.freed, got.satisfied) == (deficit, freed, satisfied)
        assert "ready" not in got.interrupt
        assert got.protected == ("ready",)

    def test_freed_per_node(self) -> None:
        """Freed weight is reported per node so the caller can add it back."""
        got = select_interrupts(RUNNING, 2000, 0)
        assert dict(got.freed_per_node) == {"n1": 900, "n2": 1300}

    def test_order_independent_of_input(self) -> None:
        """The decision does not depend on the order the candidates are listed in."""
        a = select_interrupts(RUNNING, 2000, 0)
        b = select_interrupts(tuple(reversed(RUNNING)), 2000, 0)
        assert a == b

    def test_id_breaks_full_ties(self) -> None:
        """Equal value and weight fall back to the session id."""
        got = select_interrupts([_c("b", 0, 0, 1, 10), _c("a", 0, 0, 1, 10)], 10, 0)
        assert got.interrupt == ("a",)

    def test_key(self) -> None:
        """The key is credit, readiness, tokens, then larger weight, then id."""
        assert interrupt_key(_c("x", k=1, r=0, t=2, w=3)) == (1, 0, 2, -3, "x")

    def test_duplicate_rejected(self) -> None:
        """A session listed twice is an error."""
        with pytest.raises(ValueError, match="duplicate"):
            select_interrupts([_c("a", 0, 0, 1, 1), _c("a", 0, 0, 1, 1)], 10, 0)


class TestPoolDeficit:
    """The deficit is Σ pool weights − Σ free (free clamped at 0), never negative."""

    @pytest.mark.parametrize(
        ("weights", "free", "expected"),
        [([], [100], 0), ([600, 600], [1000], 200), ([600], [1000, 0], 0), ([600], [-50], 600)],
    )
    def test_table(self, weights: list[int], free: list[int], expected: int) -> None:
        """Each row gives the expected deficit."""
        assert pool_deficit(weights, free) == expected
