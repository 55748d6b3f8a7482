"""ThunderAgent's code paths as tables (shared/core/thunder.py against ThunderAgent-org/
ThunderAgent; `state.py` = ThunderAgent/backend/state.py and `router.py` =
ThunderAgent/scheduler/router.py at a7eef77 unless a commit is named): capacity with shared
tokens, the acting-token decay, the pause order and the resume order. Each row names the
lines it checks."""

from __future__ import annotations

import pytest

from shared.core.thunder import (
    BUFFER_PER_PROGRAM,
    DECAY,
    DECAY_HALF_LIFE_S,
    FAITHFUL,
    IDEAL,
    VARIANTS,
    ThunderAgent,
    Variant,
    variant_for,
)

B = BUFFER_PER_PROGRAM

# (pid, tokens, acting, acting_since) of programs admitted directly on one backend "n0"
Prog = tuple[str, int, bool, float]


def loaded(variant: Variant, progs: list[Prog], cap: int = 100_000) -> ThunderAgent:
    ta = ThunderAgent(capacity={"n0": cap}, variant=variant)
    for pid, tokens, acting, since in progs:
        assert ta.on_request(pid, tokens) == "n0"
        if acting:
            ta.on_response(pid, tokens, since)
    return ta


class TestCapacityWithSharedTokens:
    """remaining = capacity - (int(reasoning + w x acting) - shared + 100 x programs)
    (state.py:182-191), shared = max(0, REASONING tokens - engine KV in use) (state.py:126-133,
    vllm_metrics.py:294-311), set at the check after the metrics fetch (d37e825b
    router.py:656-659); the released code never sets it (a7eef77, ThunderAgent issue #36)."""

    @pytest.mark.parametrize(
        ("variant", "progs", "used", "expected", "cite"),
        [
            # three REASONING programs sharing a 6,000-token prefix: the engine holds
            # 6,000 + 3 x 2,000 = 12,000, the programs count 24,000 -> shared 12,000
            (IDEAL, [("a", 8_000, False, 0), ("b", 8_000, False, 0), ("c", 8_000, False, 0)],
             12_000, 100_000 - (24_000 - 12_000 + 3 * B), "state.py:126-133,182-191"),
            # the released code: shared stays 0 whatever the engine holds
            (FAITHFUL, [("a", 8_000, False, 0), ("b", 8_000, False, 0), ("c", 8_000, False, 0)],
             12_000, 100_000 - (24_000 + 3 * B), "a7eef77: no update_shared_tokens call"),
            # ACTING programs are not in the measure (only REASONING tokens, state.py:131-133)
            (IDEAL, [("a", 8_000, False, 0), ("b", 8_000, True, 0)],
             5_000, 100_000 - (16_000 - 3_000 + 2 * B), "state.py:131-133"),
            # the engine holding more than the programs (a waiting-room prefix): never negative
            (IDEAL, [("a", 8_000, False, 0)], 20_000, 100_000 - (8_000 + B),
             "vllm_metrics.py:311 max(0, ...)"),
        ],
    )  # fmt: skip
    def test_remaining(
        self, variant: Variant, progs: list[Prog], used: int, expected: int, cite: str
    ) -> None:
        ta = loaded(variant, progs)
        ta.check(0.0, {"n0": used})
        assert ta.remaining("n0") == expected, cite

    @pytest.mark.parametrize(
        ("holding", "used", "shared"),
        [({"a", "b", "c"}, 12_000, 12_000), ({"a", "b"}, 10_000, 6_000), (set(), 0, 0)],
    )
    def test_only_programs_holding_kv_count(
        self, holding: set[str], used: int, shared: int
    ) -> None:
        """A request queued in the engine holds no block (kv_cache_usage_perc counts only
        scheduled requests' blocks): its program is left out of the sum, else its whole
        context would read as shared."""
        ta = loaded(IDEAL, [("a", 8_000, False, 0), ("b", 8_000, False, 0), ("c", 8_000, False, 0)])
        ta.check(0.0, {"n0": used}, {"n0": holding})
        assert ta.shared["n0"] == shared

    def test_no_measure_is_zero(self) -> None:
        """vllm_metrics.py:305-306: no metrics, no shared tokens."""
        ta = loaded(IDEAL, [("a", 8_000, False, 0), ("b", 8_000, False, 0)])
        ta.check(0.0, {"n0": 10_000})
        assert ta.shared["n0"] == 6_000
        ta.check(1.0, {"n0": None})
        assert ta.shared["n0"] == 0

    def test_shared_tokens_admit_a_program_the_released_code_queues(self) -> None:
        """router.py:275: a new program needs remaining >= estimate + 100."""
        for variant, admitted in ((IDEAL, True), (FAITHFUL, False)):
            ta = loaded(variant, [("a", 8_000, False, 0), ("b", 8_000, False, 0)], cap=20_000)
            ta.check(0.0, {"n0": 10_000})  # the two share 6,000
            assert (ta.on_request("c", 8_000) == "n0") is admitted, variant.name


class TestDecayWeights:
    """remaining_capacity_with_decay (state.py:193-211): each ACTING program's tokens x
    2^(-t), t its seconds in ACTING (acting_since, router.py:391), no tool coefficient;
    REASONING programs in full; the 100-token buffer per program still counts."""

    @pytest.mark.parametrize(
        ("progs", "now", "half_life", "expected"),
        [
            ([("a", 8_000, True, 10.0)], 10.0, 1.0, 100_000 - (8_000 + B)),
            ([("a", 8_000, True, 10.0)], 11.0, 1.0, 100_000 - (4_000 + B)),
            ([("a", 8_000, True, 10.0)], 13.0, 1.0, 100_000 - (1_000 + B)),
            ([("a", 8_000, True, 10.0), ("b", 3_000, False, 0)], 12.0, 1.0,
             100_000 - (3_000 + 2_000 + 2 * B)),
            # a half-life other than the code's 1 s (the sweep's knob)
            ([("a", 8_000, True, 10.0)], 14.0, 4.0, 100_000 - (4_000 + B)),
            # int() of the float sum, as state.py:208
            ([("a", 1_001, True, 0.0)], 1.0, 1.0, 100_000 - (500 + B)),
        ],
    )  # fmt: skip
    def test_remaining_decayed(
        self, progs: list[Prog], now: float, half_life: float, expected: int
    ) -> None:
        ta = loaded(variant_for(DECAY.name, decay_half_life_s=half_life), progs)
        assert ta.remaining_decayed("n0", now) == expected

    def test_the_code_has_a_one_second_half_life(self) -> None:
        """state.py:207 ``2.0 ** -t``; config.py:29 off by default, __main__.py:32-33 the flag."""
        assert DECAY.decay_half_life_s == DECAY_HALF_LIFE_S == 1.0
        assert FAITHFUL.decay_half_life_s is None and IDEAL.decay_half_life_s is None
        assert set(VARIANTS) == {"thunderagent", "thunderagent-ideal", "thunderagent-decay"}

    def test_decay_sizes_the_resume_not_the_pause(self) -> None:
        """router.py:677-683: resume on decayed room (747-749), then pause on the plain room
        (682, 692): the resumed REASONING program stays, the ACTING one it displaced pauses."""
        ta = ThunderAgent(capacity={"n0": 10_000}, variant=DECAY)
        assert ta.on_request("a", 6_000) == "n0"
        ta.on_response("a", 6_000, 0.0)
        assert ta.on_request("b", 6_000) is None  # 10,000 - 6,100 < 6,100: queued
        plain = ThunderAgent(capacity={"n0": 10_000}, variant=FAITHFUL)
        assert plain.on_request("a", 6_000) == "n0"
        plain.on_response("a", 6_000, 0.0)
        assert plain.on_request("b", 6_000) is None
        assert plain.check(10.0).resumed == ()  # no decay: no room
        check = ta.check(10.0)  # a weighs 6,000 x 2^-10 ~ 5 tokens in the resume
        assert check.resumed == (("b", "n0"),)
        assert check.paused == ("a",)  # then the plain room is negative: a (ACTING) pauses


class TestPauseOrder:
    """_pause_until_safe (router.py:685-714): smallest ACTING first (519-529), then mark the
    smallest unmarked REASONING (531-543, 574-586); the code's loop never counts the marks
    (remaining_capacity, state.py:182-191, has no future_paused_tokens) so it marks all."""

    @pytest.mark.parametrize(
        ("variant", "progs", "paused", "marked"),
        [
            (FAITHFUL, [("a", 3_000, True, 0), ("b", 1_000, True, 0), ("c", 5_000, False, 0)],
             ("b", "a"), ()),
            (FAITHFUL, [("a", 4_000, False, 0), ("b", 2_000, False, 0), ("c", 5_000, False, 0)],
             (), ("b", "a", "c")),
            # marks count as released (mark_until_safe): 5,300 over, b then a cover it
            (IDEAL, [("a", 4_000, False, 0), ("b", 2_000, False, 0), ("c", 5_000, False, 0)],
             (), ("b", "a")),
            (FAITHFUL, [("a", 4_000, False, 0), ("b", 2_000, True, 0), ("c", 5_000, False, 0)],
             ("b",), ("a", "c")),
        ],
    )  # fmt: skip
    def test_order(
        self,
        variant: Variant,
        progs: list[Prog],
        paused: tuple[str, ...],
        marked: tuple[str, ...],
    ) -> None:
        ta = loaded(variant, progs)
        ta.capacity["n0"] = 6_000  # over-full now: 11,000 + 300 > 6,000 before any pause
        check = ta.check(0.0)
        assert (check.paused, check.marked) == (paused, marked)


class TestResumeOrder:
    """_greedy_resume (router.py:719-844): REASONING with step > 1, then new (step 1), then
    ACTING, each ascending by the tokens when queued (492-505, 763-778); selected while the
    cumulative tokens + 100 fit the total room (780-788); placed largest first on the
    backend with most room (793-838)."""

    def _queue(self) -> ThunderAgent:
        ta = ThunderAgent(capacity={"n0": 10_000, "n1": 10_000}, variant=FAITHFUL)
        # fill both backends, then queue programs of each class
        assert ta.on_request("f0", 9_800) == "n0"
        assert ta.on_request("f1", 9_800) == "n1"
        ta.on_response("f0", 9_800, 0.0)
        ta.on_response("f1", 9_800, 0.0)
        for pid, tokens in (("new-big", 3_000), ("new-small", 1_000)):
            assert ta.on_request(pid, tokens) is None
        return ta

    @pytest.mark.parametrize(
        ("room", "expected"),
        [
            # room for everything queued: placed largest first on the most free backend
            (20_000, (("new-big", "n0"), ("new-small", "n1"))),
            # room for the smaller only: selection walks on past what does not fit
            (2_000, (("new-small", "n0"),)),
        ],
    )
    def test_new_programs(self, room: int, expected: tuple[tuple[str, str], ...]) -> None:
        ta = self._queue()
        for pid in ("f0", "f1"):
            ta.release(pid)
        ta.capacity = {"n0": room // 2 + 200, "n1": room // 2 + 200}
        if room >= 20_000:
            ta.capacity = {"n0": 10_000, "n1": 10_000}
        assert ta.resume(0.0).resumed == expected

    def test_reasoning_before_new_before_acting(self) -> None:
        """router.py:771-778: the class order decides who gets the only room."""
        ta = ThunderAgent(capacity={"n0": 10_000}, variant=FAITHFUL)
        for pid in ("r", "a"):
            assert ta.on_request(pid, 2_000) == "n0"
            ta.on_response(pid, 2_000, 0.0)
        assert ta.on_request("big", 6_000) is None  # 10,000 - 4,200 < 6,100: queued (new)
        ta.capacity["n0"] = 2_000
        paused = ta.check(0.0).paused  # both ACTING: the smaller first, then the next
        assert paused == ("r", "a")
        assert ta.on_request("r", 2_500) is None  # r's request blocks: REASONING, step 2
        ta.capacity["n0"] = 2_700  # room for one 2,600 (2,500 + 100) only
        assert ta.resume(0.0).resumed == (("r", "n0"),)
        ta.capacity["n0"] = 2_700 + 6_100 + 2_100
        assert ta.resume(0.0).resumed == (("big", "n0"), ("a", "n0"))
