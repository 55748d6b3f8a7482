"""ThunderAgent's router as a state machine (shared/core/thunder.py), rule by rule against the
code it cites: accounting, direct admission, blocking, the check's resume and pause, marks,
forced resume; and what the ideal variant changes."""

from __future__ import annotations

import pytest

from shared.core.thunder import (
    BUFFER_PER_PROGRAM,
    FAITHFUL,
    IDEAL,
    ThunderAgent,
    Variant,
    variant_for,
)


def machine(caps: dict[str, int], variant: Variant = FAITHFUL) -> ThunderAgent:
    return ThunderAgent(capacity=dict(caps), variant=variant)


def active(ta: ThunderAgent, pid: str, backend: str, tokens: int, acting: bool = False) -> None:
    """A program already running on ``backend`` (first request admitted directly)."""
    assert ta.on_request(pid, tokens) == backend
    if acting:
        ta.on_response(pid, tokens)


class TestAccounting:
    """state.py:182-191: capacity - (reasoning + w x acting) - 100 per program."""

    @pytest.mark.parametrize(
        ("programs", "expected"),
        [
            ([], 10_000),
            ([("a", 1_000, False)], 10_000 - 1_000 - 100),
            ([("a", 1_000, False), ("b", 2_000, True)], 10_000 - 3_000 - 200),
        ],
    )
    def test_remaining(self, programs: list[tuple[str, int, bool]], expected: int) -> None:
        ta = machine({"n0": 10_000})
        for pid, tokens, acting in programs:
            active(ta, pid, "n0", tokens, acting)
        assert ta.remaining("n0") == expected


class TestRequests:
    """router.py:249-281, 290-372."""

    def test_new_program_goes_to_least_active_backend_that_fits(self) -> None:
        ta = machine({"n0": 10_000, "n1": 10_000})
        active(ta, "a", "n0", 3_000)
        # n1 has fewer active tokens; both fit
        assert ta.on_request("b", 1_000) == "n1"
        # c does not fit n1 (10,000 - 1,100 < 9,000 + 100) but fits nowhere else either
        assert ta.on_request("c", 9_000) is None
        assert list(ta.queue) == ["c"]

    def test_new_program_waits_while_the_queue_is_not_empty(self) -> None:
        ta = machine({"n0": 10_000})
        assert ta.on_request("big", 20_000) is None
        assert ta.on_request("small", 100) is None  # fits, but the queue is not empty
        assert list(ta.queue) == ["big", "small"]

    def test_paused_program_request_blocks_until_resumed(self) -> None:
        ta = machine({"n0": 2_000})
        active(ta, "a", "n0", 1_500, acting=True)
        active(ta, "b", "n0", 0)  # a second program, REASONING
        ta.programs["b"].tokens = 1_000  # b's context grew: the backend is over-full
        check = ta.check()
        assert check.paused == ("a",)  # ACTING first
        assert ta.on_request("a", 1_600) is None
        assert ta.programs["a"].blocked

    def test_active_program_goes_to_its_backend(self) -> None:
        ta = machine({"n0": 10_000, "n1": 10_000})
        active(ta, "a", "n0", 1_000, acting=True)
        assert ta.on_request("a", 1_200) == "n0"
        assert ta.programs["a"].status == "reasoning"


class TestResume:
    """router.py:719-844: classes, cumulative selection, largest first on the most room."""

    def test_class_order_then_largest_first_on_most_room(self) -> None:
        ta = machine({"n0": 5_000, "n1": 3_000})
        # three queued programs: new (steps 1), reasoning (a pending request), acting
        assert ta.on_request("new", 9_000) is None  # too large for either backend alone
        for pid in ("r", "x"):
            ta.programs[pid] = ta.programs["new"].__class__(pid, steps=2, status="reasoning")
        ta.programs["x"].status = "acting"
        ta.programs["r"].tokens = 2_000
        ta.programs["x"].tokens = 2_500
        for pid in ("r", "x"):
            ta._enqueue(ta.programs[pid])
        check = ta.resume()
        # total room 8,000: r (2,100) selected, new (9,100) does not fit the total, x (2,600)
        # selected; placed largest first on the backend with most room, re-sorted after each
        # placement (n0 has 2,400 left, n1 3,000)
        assert check.resumed == (("x", "n0"), ("r", "n1"))
        assert list(ta.queue) == ["new"]

    def test_a_backend_with_100_or_less_left_drops_out(self) -> None:
        ta = machine({"n0": 1_200})
        assert ta.on_request("big", 5_000) is None
        for pid, tokens in (("a", 1_000), ("b", 0)):
            ta.programs[pid] = ta.programs["big"].__class__(pid, steps=2, tokens=tokens)
            ta._enqueue(ta.programs[pid])
        check = ta.resume()
        # both selected (100 + 1,100 = 1,200); a placed first leaves exactly 100, so n0 drops
        # out although b's 100 would fit there
        assert check.resumed == (("a", "n0"),)
        assert BUFFER_PER_PROGRAM == 100


class TestPause:
    """router.py:685-714: ACTING smallest first; then marks — every one in the code."""

    def _overfull(self, variant: Variant) -> ThunderAgent:
        ta = machine({"n0": 10_000}, variant)
        for pid, tokens in (("a", 1_000), ("b", 2_000), ("c", 3_000)):
            active(ta, pid, "n0", tokens)
        for pid, tokens in (("a", 4_000), ("b", 4_000), ("c", 4_000)):
            ta.programs[pid].tokens = tokens  # contexts grew: 12,000 + 300 > 10,000
        return ta

    def test_code_marks_every_reasoning_program(self) -> None:
        check = self._overfull(FAITHFUL).check()
        assert check.paused == ()
        assert sorted(check.marked) == ["a", "b", "c"]

    def test_ideal_marks_only_until_safe(self) -> None:
        check = self._overfull(IDEAL).check()
        assert len(check.marked) == 1  # 4,000 released by one mark covers the 2,300 overflow

    def test_marked_program_is_paused_when_its_call_ends(self) -> None:
        ta = self._overfull(FAITHFUL)
        ta.check()
        assert ta.on_response("a", 4_100) is True
        assert ta.programs["a"].paused and "a" in ta.queue
        assert ta.programs["a"].origin == "n0"

    def test_acting_programs_are_paused_smallest_first_until_safe(self) -> None:
        ta = machine({"n0": 10_000})
        for pid, tokens in (("a", 3_000), ("b", 1_000), ("c", 2_000)):
            active(ta, pid, "n0", tokens, acting=True)
        ta.programs["a"].tokens = 7_000  # 10,000 + 300 > 10,000
        check = ta.check()
        assert check.paused == ("b",)


class TestForce:
    """router.py:846-868: regardless of capacity, origin backend or fewest programs."""

    def test_forced_resume_goes_to_origin(self) -> None:
        ta = machine({"n0": 2_000, "n1": 2_000})
        active(ta, "a", "n0", 1_500, acting=True)
        ta.programs["a"].tokens = 2_500
        ta.check()  # a paused from n0
        assert ta.on_request("a", 2_600) is None
        assert ta.force("a") == "n0"
        assert not ta.programs["a"].paused
        assert ta.force("a") is None  # no longer queued

    def test_forced_new_program_goes_to_the_backend_with_fewest_programs(self) -> None:
        ta = machine({"n0": 10_000, "n1": 10_000})
        active(ta, "a", "n0", 100)
        assert ta.on_request("huge", 50_000) is None
        assert ta.force("huge") == "n1"


class TestVariants:
    @pytest.mark.parametrize(
        ("name", "resume_on_event", "mark_until_safe"),
        [("thunderagent", False, False), ("thunderagent-ideal", True, True)],
    )
    def test_variant_for(self, name: str, resume_on_event: bool, mark_until_safe: bool) -> None:
        v = variant_for(name, 2.5)
        assert (v.name, v.resume_on_event, v.mark_until_safe, v.interval_s) == (
            name,
            resume_on_event,
            mark_until_safe,
            2.5,
        )

    def test_unknown_variant(self) -> None:
        with pytest.raises(ValueError, match="not a ThunderAgent variant"):
            variant_for("tao")
