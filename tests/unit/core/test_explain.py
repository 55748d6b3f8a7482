"""Reading round records back (shared/core/explain.py): why a session was admitted, released,
held or kept waiting, and how the releases of a live run fared."""

from __future__ import annotations

import json

import pytest

from shared.core.explain import (
    ExplainError,
    TurnSeen,
    audit_releases,
    explain,
    round_fields,
    rounds_from_lines,
)
from shared.core.round import Proposal, RoundRecord

REC = RoundRecord(
    tick=7,
    now=100.0,
    rules="tao",
    entries=(
        Proposal("release", "t", "n1", 2048, 60.0, 1.5, "home", "a"),
        Proposal("hold", "u", "n1", 2048, 0.4, 1.5, "demand", note="not worth it"),
        Proposal("admit", "a", "n1", 4096, 0.2, 0.3, "search"),
        Proposal("wait", "b", "", 1024, 0.0, 0.0, "search", note="no room"),
    ),
    prices={"n1": 5e-5},
)


class TestExplain:
    """Each entry about a session is one line with its rule and price."""

    def test_subject_and_beneficiary(self) -> None:
        rounds = [REC.to_dict()]
        assert explain(rounds, "t") == [
            "t=100.000 tick 7 [tao] released from n1 to make room for a by rule home: "
            "gain 60.000 s, cost 1.500 s, net 58.500 s"
        ]
        lines = explain(rounds, "a")
        assert lines[0].endswith("t released from n1 to make room for it by rule home: "
                                 "gain 60.000 s, cost 1.500 s, net 58.500 s")  # fmt: skip
        assert "admitted on n1 by rule search" in lines[1]
        assert "held on n1, not released by rule demand" in explain(rounds, "u")[0]
        assert explain(rounds, "u")[0].endswith("; not worth it")
        assert "kept waiting by rule search" in explain(rounds, "b")[0]

    def test_up_to_a_time_and_discarded(self) -> None:
        later = {**RoundRecord(8, 200.0, "tao", REC.entries[:1]).to_dict(), "discarded": True}
        rounds = [REC.to_dict(), later]
        assert len(explain(rounds, "t")) == 2
        assert explain(rounds, "t")[1].endswith("[plan discarded]")
        assert len(explain(rounds, "t", at=150.0)) == 1

    def test_unknown_session(self) -> None:
        with pytest.raises(ExplainError, match="session 'zz': no round records it"):
            explain([REC.to_dict()], "zz")

    def test_infinite_gain_round_trips(self) -> None:
        rec = RoundRecord(1, 1.0, "tao", (Proposal("release", "s", "n0", 1, float("inf"), 0.1,
                                                   "evacuate"),))  # fmt: skip
        line = json.dumps(rec.to_dict())
        assert "gain inf s" in explain(rounds_from_lines([line]), "s")[0]


class TestLines:
    """A simulator record file and a planner log read the same; other lines are skipped."""

    def test_planner_log_and_record_file(self) -> None:
        log = {"event": "plan_round", "service": "planner", **round_fields(REC)}
        other = {"event": "plan_tick", "tick": 7}
        lines = [json.dumps(other), json.dumps(log), "console text", "", json.dumps(REC.to_dict())]
        assert len(rounds_from_lines(lines)) == 2

    def test_broken_json_names_its_line(self) -> None:
        with pytest.raises(ExplainError, match="line 2: not JSON"):
            rounds_from_lines([json.dumps(REC.to_dict()), "{broken"])

    def test_log_line_is_bounded(self) -> None:
        many = RoundRecord(1, 1.0, "tao", tuple(
            Proposal("wait", f"s{i}", "", 1, 0.0, 0.0, "search") for i in range(600)
        ))  # fmt: skip
        fields = round_fields(many)
        assert len(fields["entries"]) == 500 and fields["omitted"] == 100  # type: ignore[arg-type]


class TestAudit:
    """A release is costly when its recompute outlasts the time the room would have been held."""

    @pytest.mark.parametrize(
        ("sent", "prompt", "cached", "costly"),
        [
            (130.0, 10_000, 0, 0),  # 0.5 s of recompute for 30 s of room
            (100.2, 10_000, 0, 1),  # back after 0.2 s: 0.5 s of recompute
            (100.2, 10_000, 9_000, 0),  # the engine kept most of it: 0.05 s
        ],
    )
    def test_judged_by_the_next_request(
        self, sent: float, prompt: int, cached: int, costly: int
    ) -> None:
        turns = [TurnSeen("t", 90.0, 5_000, 0), TurnSeen("t", sent, prompt, cached)]
        got = audit_releases([REC.to_dict()], turns)
        assert (got.applied, got.followed, got.costly) == (1, 1, costly)

    def test_discarded_and_unfollowed(self) -> None:
        gone = {**REC.to_dict(), "discarded": True}
        assert audit_releases([gone], [TurnSeen("t", 130.0, 1, 0)]).applied == 0
        got = audit_releases([REC.to_dict()], [TurnSeen("t", 90.0, 1, 0)])
        assert (got.applied, got.followed, got.costly) == (1, 0, 0)
