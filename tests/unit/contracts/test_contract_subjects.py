"""NATS subject and stream names: the tao.v1 scheme, token escaping and name checks."""

from __future__ import annotations

import re

import hypothesis.strategies as st
import pytest
from hypothesis import given

from shared.contracts import (
    DeadLetter,
    Message,
    NodeStatus,
    Placement,
    Plan,
    SessionCancel,
    SessionEnd,
    SessionRequest,
    SessionResponse,
    SubjectError,
    ToolEnd,
    ToolProgress,
    ToolStart,
    ValuationSnapshot,
    subjects,
)

NATS_TOKEN = re.compile(r"[^.\s*>]+")


class TestSubjects:
    """Each builder gives the documented subject under the versioned prefix."""

    @pytest.mark.parametrize(
        ("subject", "expected"),
        [
            (subjects.tool_event("s1"), "tao.v1.tool.s1"),
            (subjects.tool_events(), "tao.v1.tool.*"),
            (subjects.session_event("request", "s1"), "tao.v1.session.request.s1"),
            (subjects.session_event("end", "s1"), "tao.v1.session.end.s1"),
            (subjects.session_events(), "tao.v1.session.*.*"),
            (subjects.session_events("response"), "tao.v1.session.response.*"),
            (subjects.node_status("node-a"), "tao.v1.node.status.node-a"),
            (subjects.node_statuses(), "tao.v1.node.status.*"),
            (subjects.kv_events("node-a"), "tao.v1.kv.node-a"),
            (subjects.kv_events_all(), "tao.v1.kv.*"),
            (subjects.valuation_snapshot(), "tao.v1.valuation.snapshot"),
            (subjects.plan(), "tao.v1.plan"),
            (subjects.placement("gw_0"), "tao.v1.placement.gw_0"),
            (subjects.placements(), "tao.v1.placement.*"),
            (subjects.dead_letter("tools"), "tao.v1.dlq.tools"),
            (subjects.dead_letters(), "tao.v1.dlq.*"),
        ],
    )
    def test_subject(self, subject: str, expected: str) -> None:
        """Builder output is exactly the documented name."""
        assert subject == expected
        assert subject.startswith(subjects.PREFIX + ".")

    def test_unknown_session_kind(self) -> None:
        """Only request, response and end are session event kinds."""
        with pytest.raises(SubjectError, match="session event kind"):
            subjects.session_event("start", "s1")  # type: ignore[arg-type]
        with pytest.raises(SubjectError, match="session event kind"):
            subjects.session_events("start")  # type: ignore[arg-type]


class TestSessionTokens:
    """Session ids are escaped deterministically and reversibly into one token."""

    @pytest.mark.parametrize(
        ("session_id", "token"),
        [
            ("550e8400-e29b-41d4-a716-446655440000", "550e8400-e29b-41d4-a716-446655440000"),
            ("ses_01JABC", "ses_01JABC"),
            ("alice@example.com", "alice~40example~2Ecom"),
            ("a.b c*>", "a~2Eb~20c~2A~3E"),
            ("~", "~7E"),
            ("é", "~C3~A9"),
            ("ab\n", "ab~0A"),  # a safe-looking id with a trailing newline is not safe
            ("١٢", "~D9~A1~D9~A2"),  # non-ASCII digits are not [0-9]
        ],
    )
    def test_escape(self, session_id: str, token: str) -> None:
        """Safe ids pass through; every other character becomes ~XX per UTF-8 byte."""
        assert subjects.escape_token(session_id) == token
        assert subjects.unescape_token(token) == session_id
        assert subjects.tool_event(session_id) == f"tao.v1.tool.{token}"

    @given(st.text(min_size=1, max_size=40))
    def test_escape_is_the_per_character_rule(self, session_id: str) -> None:
        """The fast path (a regex for all-safe ids) is the rule stated per character."""
        safe = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
        want = "".join(
            c if c in safe else "".join(f"~{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
            for c in session_id
        )
        try:
            got = subjects.escape_token(session_id)
        except (SubjectError, UnicodeEncodeError):
            assert len(want) > subjects.MAX_TOKEN_LEN or any(
                0xD800 <= ord(c) <= 0xDFFF for c in session_id
            )
            return
        assert got == want

    def test_escaped_subject_has_one_token(self) -> None:
        """Whatever the id, the session segment is a single valid NATS token."""
        subject = subjects.session_event("request", "x.y > *\t~z")
        assert subject.count(".") == 4
        assert all(NATS_TOKEN.fullmatch(t) for t in subject.split("."))

    def test_escaping_is_injective(self) -> None:
        """Ids that differ give tokens that differ, including lookalikes of escapes."""
        ids = ["a.b", "a~2Eb", "a~7E2Eb", "a_b", "a-b", "A.B"]
        tokens = [subjects.escape_token(i) for i in ids]
        assert len(set(tokens)) == len(ids)

    def test_empty_id(self) -> None:
        """An empty session id cannot form a subject."""
        with pytest.raises(SubjectError, match="empty"):
            subjects.tool_event("")

    def test_too_long(self) -> None:
        """An id whose escaped token passes MAX_TOKEN_LEN is rejected."""
        with pytest.raises(SubjectError, match="longer than"):
            subjects.tool_event("." * 200)

    @pytest.mark.parametrize("token", ["a.b", "~41", "~zz", "~C3", "a b"])
    def test_unescape_rejects_foreign_tokens(self, token: str) -> None:
        """Only tokens escape_token can produce are unescaped."""
        with pytest.raises(SubjectError):
            subjects.unescape_token(token)


class TestConfiguredNames:
    """Node, gateway and service names must be plain tokens; others are rejected."""

    @pytest.mark.parametrize("name", ["node.a", "node a", "node*", "gw>", "", "x" * 129, "n/é"])
    def test_rejected(self, name: str) -> None:
        """Dots, spaces, wildcards, empty, over-long and non-ASCII names raise SubjectError."""
        with pytest.raises(SubjectError, match=r"\[A-Za-z0-9_-\]"):
            subjects.node_status(name)
        with pytest.raises(SubjectError):
            subjects.placement(name)
        with pytest.raises(SubjectError):
            subjects.dead_letter(name)

    def test_error_names_the_role(self) -> None:
        """The error says which kind of name was bad."""
        with pytest.raises(SubjectError, match=r"invalid gateway id 'gw\.1'"):
            subjects.placement("gw.1")


class TestSubjectFor:
    """subject_for derives the publish subject from a message."""

    @pytest.mark.parametrize(
        ("msg", "expected"),
        [
            (
                ToolStart(session_id="s.1", call_id="c", tool="Bash", started_at=0),
                "tao.v1.tool.s~2E1",
            ),
            (ToolEnd(session_id="s1", call_id="c", ended_at=0), "tao.v1.tool.s1"),
            (ToolProgress(session_id="s1", call_id="c", ts=0), "tao.v1.tool.s1"),
            (
                SessionRequest(
                    session_id="s1", request_id="r", model="m", arrived_at=0, gateway_id="g"
                ),
                "tao.v1.session.request.s1",
            ),
            (
                SessionResponse(
                    session_id="s1", request_id="r", node_id="n", gateway_id="g", finished_at=0
                ),
                "tao.v1.session.response.s1",
            ),
            (SessionEnd(session_id="s1", ended_at=0), "tao.v1.session.end.s1"),
            (
                SessionCancel(session_id="s1", request_id="r", cancelled_at=0),
                "tao.v1.session.cancel.s1",
            ),
            (NodeStatus(node_id="n1", ts=0), "tao.v1.node.status.n1"),
            (ValuationSnapshot(tick=1, now=0), "tao.v1.valuation.snapshot"),
            (Plan(tick=1, policy="tao"), "tao.v1.plan"),
            (
                Placement(kind="admit", session_id="s1", version=1, tick=1, gateway_id="gw"),
                "tao.v1.placement.gw",
            ),
            (
                DeadLetter(subject="x", reason="r", payload=b"", received_at=0, service="tools"),
                "tao.v1.dlq.tools",
            ),
        ],
    )
    def test_subject_for(self, msg: Message, expected: str) -> None:
        """Each message type maps to its documented subject."""
        assert subjects.subject_for(msg) == expected


class TestStreams:
    """JetStream streams capture the subjects that must not be lost."""

    def test_names_are_valid(self) -> None:
        """Stream names contain no dots, spaces or wildcards and are unique."""
        names = [s.name for s in subjects.ALL_STREAMS]
        assert len(set(names)) == len(names)
        assert all(re.fullmatch(r"TAO_V1_[A-Z]+", n) for n in names)

    def test_subjects_do_not_overlap(self) -> None:
        """No two streams capture the same subject filter."""
        filters = [f for s in subjects.ALL_STREAMS for f in s.subjects]
        assert len(set(filters)) == len(filters)

    def test_durable_tool_events(self) -> None:
        """Tool events go to TAO_V1_TOOL; durable names join service and stream."""
        assert subjects.STREAM_TOOL.subjects == ("tao.v1.tool.*",)
        assert subjects.durable_name("tools", subjects.STREAM_TOOL) == "tools-TAO_V1_TOOL"
        with pytest.raises(SubjectError):
            subjects.durable_name("to.ols", subjects.STREAM_TOOL)
