"""TAO messages: JSON round trips, the ``type`` tag, tolerance and clear decode errors."""

from __future__ import annotations

import msgspec
import pytest

from shared.contracts import (
    MESSAGE_TYPES,
    ContractError,
    DeadLetter,
    DecodeError,
    DomainLoadReport,
    Message,
    NodeStatus,
    Placement,
    Plan,
    SessionCancel,
    SessionEnd,
    SessionRequest,
    SessionResponse,
    ToolCallInfo,
    ToolEnd,
    ToolProgress,
    ToolStart,
    Usage,
    ValuationSnapshot,
    Wake,
    WireAssignment,
    WireCandidate,
    WireInterruptCandidate,
    WireNodeView,
    WireObjective,
    WireSignature,
    decode,
    decode_message,
    decode_session_event,
    decode_tool_event,
    encode,
)
from shared.contracts.wake import WAKE_NAMES_MAX, wake_for

SIG = WireSignature(session_id="s1", version=7, eligibility_digest="ab12")

SAMPLES: list[Message] = [
    SessionRequest(
        session_id="s1",
        request_id="r1",
        model="qwen3-8b",
        arrived_at=1767225600.5,
        gateway_id="gw-0",
        prompt_tokens_estimate=5120,
        messages_count=9,
        stream=True,
        max_tokens=1024,
        harness="claude-code",
    ),
    SessionResponse(
        session_id="s1",
        request_id="r1",
        node_id="node-a",
        gateway_id="gw-0",
        finished_at=1767225602.0,
        usage=Usage(
            prompt_tokens=5120, completion_tokens=80, cached_tokens=4096, total_tokens=5200
        ),
        finish_reason="tool_calls",
        tool_calls=[ToolCallInfo(id="call_1", name="Bash", arguments_bytes=57)],
        ttft_s=0.12,
        duration_s=1.5,
    ),
    Wake(reason="tool_end", ts=1767225650.5, session_id="s1"),
    Wake(reason="arrival", ts=1767225650.5, session_ids=["s1", "s2"]),
    DomainLoadReport(
        domain="pool-a", ts=1767225650.5, tick=7, capacity=64_000, demand=51_200, models=["m"]
    ),
    SessionCancel(
        session_id="s1", request_id="r2", cancelled_at=1767225650.0, reason="wait_timeout"
    ),
    SessionEnd(session_id="s1", ended_at=1767225700.0, reason="client_closed", gateway_id="gw-0"),
    ToolStart(
        session_id="s1",
        call_id="toolu_01",
        tool="Bash",
        started_at=1767225602.1,
        source="hook",
        harness="claude-code",
        deadline=1767225722.1,
        timeout_s=120.0,
        expected_end=1767225610.0,
        background=False,
    ),
    ToolEnd(
        session_id="s1",
        call_id="toolu_01",
        ended_at=1767225605.0,
        tool="Bash",
        duration_s=2.9,
        ok=False,
        censored=True,
        background=True,
    ),
    ToolProgress(
        session_id="s1", call_id="toolu_01", ts=1767225603.0, fraction=0.5, expected_end=1.0e9
    ),
    NodeStatus(
        node_id="node-a",
        ts=1767225600.0,
        models=["qwen3-8b"],
        capacity_tokens=262144,
        used_tokens=131072,
        usage=0.5,
        running=3,
        waiting=1,
        healthy=True,
        block_size=16,
        url="http://node-a:8000/v1",
        prefix_cache_queries=1000,
        prefix_cache_hits=700,
    ),
    ValuationSnapshot(
        tick=42,
        now=1767225600.0,
        quantum=512,
        nodes=[WireNodeView(id="node-a", free=8192, load=4096, capacity=16384, healthy=True)],
        candidates=[
            WireCandidate(
                id="s1",
                weight=2560,
                tokens=2048,
                signature=SIG,
                ready=1,
                credit={"node-a": 2048},
                eligible=["node-a"],
                phase="acting",
                model="qwen3-8b",
            )
        ],
        interrupt_candidates=[
            WireInterruptCandidate(
                id="s2", node="node-a", weight=1024, tokens=900, signature=SIG, credit=512
            )
        ],
    ),
    Plan(
        tick=42,
        policy="tao",
        assignments=[WireAssignment("s1", "node-a")],
        interrupts=[WireAssignment("s2", "node-a")],
        objective=WireObjective(credit=2048, ready=1, tokens=2048, admitted=1),
        exact=False,
        method="bfd",
        states=100001,
        elapsed_ms=3.5,
        reason="state budget exceeded",
    ),
    Placement(
        kind="admit",
        session_id="s1",
        version=8,
        tick=42,
        gateway_id="gw-0",
        node_id="node-a",
        issued_at=1767225600.01,
    ),
    DeadLetter(
        subject="tao.v1.tool.s1",
        reason="cannot decode ToolEvent: Input data was truncated",
        payload=b'{"type":"ToolSt\xff',
        received_at=1767225600.0,
        service="tools",
        error_type="DecodeError",
        headers={"Nats-Msg-Id": "abc"},
    ),
]


def ids(msg: Message) -> str:
    return type(msg).__name__


class TestRoundTrip:
    """Every message survives encode → decode unchanged and carries its class name as tag."""

    def test_every_message_type_has_a_sample(self) -> None:
        """The samples cover every top-level message type."""
        assert {type(m) for m in SAMPLES} == set(MESSAGE_TYPES)

    @pytest.mark.parametrize("msg", SAMPLES, ids=ids)
    def test_round_trip(self, msg: Message) -> None:
        """decode(encode(m), type(m)) == m."""
        assert decode(encode(msg), type(msg)) == msg

    @pytest.mark.parametrize("msg", SAMPLES, ids=ids)
    def test_tag_is_class_name(self, msg: Message) -> None:
        """The JSON object's ``type`` is the class name."""
        assert msgspec.json.decode(encode(msg))["type"] == type(msg).__name__

    @pytest.mark.parametrize("msg", SAMPLES, ids=ids)
    def test_decode_message_dispatches_on_tag(self, msg: Message) -> None:
        """decode_message picks the right type from the tag alone."""
        assert decode_message(encode(msg)) == msg

    @pytest.mark.parametrize("msg", SAMPLES, ids=ids)
    def test_accepts_str_and_memoryview(self, msg: Message) -> None:
        """Decoding accepts bytes, str and memoryview alike."""
        data = encode(msg)
        assert decode(data.decode(), type(msg)) == decode(memoryview(data), type(msg)) == msg

    def test_tool_and_session_unions(self) -> None:
        """The per-subject decoders return the concrete message."""
        for msg in SAMPLES:
            if isinstance(msg, ToolStart | ToolEnd | ToolProgress):
                assert decode_tool_event(encode(msg)) == msg
            if isinstance(msg, SessionRequest | SessionResponse | SessionCancel | SessionEnd):
                assert decode_session_event(encode(msg)) == msg

    def test_assignment_is_a_pair(self) -> None:
        """Plan assignments are encoded as [session, node] pairs."""
        plan = Plan(tick=1, policy="tao", assignments=[WireAssignment("s1", "n1")])
        assert msgspec.json.decode(encode(plan))["assignments"] == [["s1", "n1"]]

    def test_dead_letter_payload_is_base64(self) -> None:
        """Raw payload bytes, even invalid UTF-8, travel as base64 and come back exact."""
        letter = next(m for m in SAMPLES if isinstance(m, DeadLetter))
        assert msgspec.json.decode(encode(letter))["payload"] == "eyJ0eXBlIjoiVG9vbFN0/w=="
        assert decode(encode(letter), DeadLetter).payload == letter.payload


class TestCompatibility:
    """Old and new writers interoperate: defaults fill gaps, unknown fields are ignored."""

    def test_minimal_tool_start_gets_defaults(self) -> None:
        """Only the required fields are needed; optional ones default."""
        data = b'{"type":"ToolStart","session_id":"s","call_id":"c","tool":"Read","started_at":1}'
        msg = decode(data, ToolStart)
        assert (msg.source, msg.deadline, msg.timeout_s, msg.background) == (
            "hook",
            None,
            None,
            False,
        )
        assert msg.started_at == 1.0

    def test_unknown_fields_are_ignored(self) -> None:
        """A field added by a newer writer does not break an older reader."""
        data = b'{"type":"SessionEnd","session_id":"s","ended_at":2.0,"future":{"x":[1]}}'
        assert decode(data, SessionEnd) == SessionEnd(session_id="s", ended_at=2.0)

    def test_tag_may_be_omitted_for_a_direct_decode(self) -> None:
        """Decoding a known type directly does not require the tag."""
        assert decode(b'{"session_id":"s","ended_at":2.0}', SessionEnd).reason == "completed"

    def test_messages_are_frozen(self) -> None:
        """A decoded message is a value and cannot be mutated."""
        msg = SessionEnd(session_id="s", ended_at=2.0)
        with pytest.raises(AttributeError):
            msg.reason = "x"  # type: ignore[misc]

    def test_fields_are_keyword_only(self) -> None:
        """Messages are built by name, so adding a field never shifts arguments."""
        with pytest.raises(TypeError):
            SessionEnd("s", 2.0)  # type: ignore[call-arg]

    def test_empty_container_defaults_are_not_shared(self) -> None:
        """Each message gets its own empty list."""
        a = Plan(tick=1, policy="rr")
        b = Plan(tick=2, policy="rr")
        assert a.assignments == [] and a.assignments is not b.assignments


class TestWakeNames:
    def test_names(self) -> None:
        """One name, several, or none (a wake-up that makes the valuation read its whole pool);
        an older reader that knows only ``session_id`` sees none for several."""
        assert Wake(reason="arrival", ts=0.0, session_id="a").names() == {"a"}
        assert Wake(reason="arrival", ts=0.0, session_ids=["a", "b"]).names() == {"a", "b"}
        assert Wake(reason="arrival", ts=0.0, session_ids=[]).names() == frozenset()
        assert Wake(reason="arrival", ts=0.0).names() is None

    def test_wake_for(self) -> None:
        assert wake_for("end", 1.0, {"a"}) == Wake(reason="end", ts=1.0, session_id="a")
        several = wake_for("end", 1.0, {"b", "a"})
        assert (several.session_id, several.session_ids) == (None, ["a", "b"])
        assert wake_for("end", 1.0, set()).names() is None
        many = {f"s{i}" for i in range(WAKE_NAMES_MAX + 1)}
        assert wake_for("end", 1.0, many).names() is None
        assert len(wake_for("end", 1.0, sorted(many)[:WAKE_NAMES_MAX]).session_ids or ()) == (
            WAKE_NAMES_MAX
        )


class TestDecodeErrors:
    """Bad JSON raises DecodeError with the target type and msgspec's reason and path."""

    @pytest.mark.parametrize(
        ("data", "fragment"),
        [
            (b"", "empty payload"),
            (b'{"type":"ToolEnd"', "truncated"),
            (b"not json", "malformed"),
            (b"[1, 2]", "Expected `object`, got `array`"),
            (b'{"type":"ToolEnd","session_id":"s","call_id":"c"}', "`ended_at`"),
            (
                b'{"type":"ToolEnd","session_id":"s","call_id":"c","ended_at":"now"}',
                "Expected `float`, got `str` - at `$.ended_at`",
            ),
        ],
    )
    def test_bad_tool_end(self, data: bytes, fragment: str) -> None:
        """Each failure names ToolEnd and what was wrong."""
        with pytest.raises(DecodeError, match="cannot decode ToolEnd") as info:
            decode(data, ToolEnd)
        assert fragment in info.value.reason
        assert info.value.target == "ToolEnd"

    def test_wrong_tag(self) -> None:
        """A message of another type is rejected by its tag."""
        with pytest.raises(DecodeError, match=r"Invalid value 'ToolStart' - at `\$\.type`"):
            decode(encode(next(m for m in SAMPLES if isinstance(m, ToolStart))), ToolEnd)

    def test_unknown_tag_in_union(self) -> None:
        """A tool subject carrying a non-tool message is rejected."""
        with pytest.raises(DecodeError, match="cannot decode ToolEvent"):
            decode_tool_event(encode(SAMPLES[0]))

    def test_nested_path_is_named(self) -> None:
        """Errors inside nested values name the JSON path."""
        data = b'{"tick":1,"now":0,"candidates":[{"id":"s","weight":"big"}]}'
        with pytest.raises(DecodeError, match=r"\$\.candidates\[0\]\.weight"):
            decode(data, ValuationSnapshot)

    def test_placement_kind_is_closed(self) -> None:
        """Placement.kind accepts only admit, interrupt and revoke."""
        data = b'{"kind":"evict","session_id":"s","version":1,"tick":1,"gateway_id":"g"}'
        with pytest.raises(DecodeError, match="kind"):
            decode(data, Placement)

    def test_error_tree(self) -> None:
        """DecodeError is a ContractError is a ValueError."""
        assert issubclass(DecodeError, ContractError)
        assert issubclass(ContractError, ValueError)
