"""Helpers both buses share: subject matching, stream lookup, backoff, dead letters, the
receive-time header."""

from __future__ import annotations

import pytest

from shared.contracts import subjects
from shared.infra.busapi import (
    Delivery,
    backoff_delay,
    check_namespace,
    dead_letter_for,
    received_at,
    stream_for_subject,
    subject_matches,
)


class TestSubjectMatches:
    @pytest.mark.parametrize(
        ("pattern", "subject", "expected"),
        [
            ("tao.v1.tool.*", "tao.v1.tool.s1", True),
            ("tao.v1.tool.*", "tao.v1.tool.s1.x", False),
            ("tao.v1.tool.*", "tao.v1.tool", False),
            ("tao.v1.session.*.*", "tao.v1.session.request.s", True),
            ("tao.v1.>", "tao.v1.plan", True),
            ("tao.v1.>", "tao.v1", False),
            ("tao.v1.plan", "tao.v1.plan", True),
            ("tao.v1.plan", "tao.v1.planx", False),
        ],
    )
    def test_nats_wildcards(self, pattern: str, subject: str, expected: bool) -> None:
        """`*` matches one token and `>` one or more, as in NATS."""
        assert subject_matches(pattern, subject) is expected


class TestStreamForSubject:
    def test_streams_capture_their_subjects_and_nothing_else(self) -> None:
        """Tool events go to TAO_V1_TOOL, placements to TAO_V1_PLACEMENT, plans to no stream."""
        assert stream_for_subject(subjects.tool_event("s")) == subjects.STREAM_TOOL
        assert stream_for_subject(subjects.placement("gw0")) == subjects.STREAM_PLACEMENT
        assert stream_for_subject(subjects.dead_letter("tools")) == subjects.STREAM_DLQ
        assert stream_for_subject(subjects.plan()) is None
        assert stream_for_subject(subjects.node_status("n1")) is None


class TestBackoff:
    def test_doubles_from_base_up_to_cap(self) -> None:
        """Delays are base, 2·base, 4·base, … never above the cap; zero base means no delay."""
        assert [backoff_delay(n, 0.5, 3.0) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
        assert backoff_delay(3, 0.0, 3.0) == 0.0


class TestDeadLetterFor:
    def test_exception_gives_reason_and_type(self) -> None:
        """An exception becomes the reason (its message) and the error type (its class)."""
        letter = dead_letter_for("tools", "tao.v1.tool.s", b"x", {"h": "1"}, ValueError("bad"))
        assert (letter.reason, letter.error_type, letter.payload) == ("bad", "ValueError", b"x")
        assert letter.headers == {"h": "1"} and letter.service == "tools"

    def test_string_reason_keeps_the_given_type(self) -> None:
        """A reason string keeps an explicit error type."""
        letter = dead_letter_for("t", "s", b"", None, "failed 5 times", error_type="KeyError")
        assert (letter.reason, letter.error_type, letter.headers) == (
            "failed 5 times",
            "KeyError",
            {},
        )


class TestNamespace:
    def test_rejects_subject_syntax(self) -> None:
        """A namespace with a dot or wildcard cannot prefix subjects and is refused."""
        assert check_namespace("t0abc") == "t0abc"
        with pytest.raises(ValueError, match="namespace"):
            check_namespace("a.b")


class TestAckFields:
    def test_reads_delivery_count_and_stream_sequence_from_both_layouts(self) -> None:
        """The 9-token and the 12-token JetStream ack subjects give (delivered, stream seq)."""
        from shared.infra.receiver import ack_fields

        assert ack_fields("$JS.ACK.S.C.3.41.40.1700000000000000000.5") == (3, 41)
        assert ack_fields("$JS.ACK.dom.acchash.S.C.2.7.6.1700000000000000000.0.tok") == (2, 7)

    def test_unknown_layout_counts_as_first_delivery(self) -> None:
        """A reply subject that is not an ack subject gives (1, None) instead of failing."""
        from shared.infra.receiver import ack_fields

        assert ack_fields("_INBOX.abc") == (1, None)
        assert ack_fields("$JS.ACK.S.C.x.y.1.2.3") == (1, None)


class TestReceivedAt:
    """The receive-time header is believed only when it is a plausible epoch time."""

    @pytest.mark.parametrize(
        ("header", "expected"),
        [
            ("1700000000.25", 1700000000.25),
            (None, 5.0),
            ("soon", 5.0),
            ("nan", 5.0),
            ("inf", 5.0),
            ("-inf", 5.0),
            ("0", 5.0),
            ("-3", 5.0),
            ("1e308", 5.0),
        ],
    )
    def test_header_or_delivery_time(self, header: str | None, expected: float) -> None:
        headers = {} if header is None else {subjects.RECEIVED_AT_HEADER: header}
        assert received_at(Delivery("tao.v1.kv.n1", headers, 1, 1, 5.0)) == expected
