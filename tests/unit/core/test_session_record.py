"""Session record transitions: activity, admission, tool precedence and versions."""

from __future__ import annotations

import hypothesis.strategies as st
import msgspec
import pytest
from hypothesis import given

from shared.core.session import (
    INFERRED,
    Session,
    ToolCall,
    _evolve,
    _touch,
    admit,
    on_cancel,
    on_end,
    on_request,
    on_response,
    on_tool_end,
    on_tool_progress,
    on_tool_start,
    release,
    set_probe_mark,
)


def _fresh(at: float = 10.0) -> Session:
    s, _ = on_request(Session(id="s1"), "r1", at, model="m", gateway_id="gw0", tokens_estimate=900)
    return s


class TestRequest:
    """A request makes a session wait (or run when admitted) and ends an open tool call."""

    def test_new_session_waits_in_pool(self) -> None:
        """A first request creates a pooled, waiting record stamped with its arrival."""
        s = _fresh()
        assert (s.activity, s.pooled, s.version, s.created_at) == ("waiting", True, 1, 10.0)
        assert (s.model, s.gateway_id, s.tokens, s.phase) == ("m", "gw0", 900, "new")

    def test_admitted_session_runs_at_once(self) -> None:
        """An admitted session's next request runs on its node and is not pooled."""
        s = admit(_fresh(), "n1", 1400, 11.0)
        s = on_response(s, 12.0, total_tokens=1000, tool_calls=[("c1", "bash")])
        s2, ended = on_request(s, "r2", 13.0)
        assert (s2.activity, s2.node, s2.pooled) == ("running", "n1", False)
        assert ended is not None and ended.completed_at == 13.0 and ended.call_id == "c1"
        assert s2.tool is None

    def test_request_ends_nothing_when_tool_completed(self) -> None:
        """A tool already ended by a hook is not reported ended again by the next request."""
        s = on_response(_fresh(), 12.0, total_tokens=1000, tool_calls=[("c1", "bash")])
        s, _ = on_tool_end(s, "c1", 13.0, source="hook")
        _, ended = on_request(s, "r2", 14.0)
        assert ended is None

    def test_tokens_never_shrink_on_estimate(self) -> None:
        """A smaller prompt estimate keeps the larger known token count."""
        s = on_response(_fresh(), 12.0, total_tokens=5000)
        s2, _ = on_request(s, "r2", 13.0, tokens_estimate=100)
        assert s2.tokens == 5000


class TestResponse:
    """A response sets tokens and enters a tool when the model asked for one."""

    def test_tool_calls_start_inferred_tool(self) -> None:
        """The first tool call is tracked as an inferred call started at the response."""
        s = on_response(_fresh(), 12.0, total_tokens=1234, tool_calls=[("c1", "bash"), ("c2", "x")])
        assert s.activity == "tool" and s.tool is not None
        assert (s.tool.call_id, s.tool.tool, s.tool.started_at, s.tool.source) == (
            "c1",
            "bash",
            12.0,
            INFERRED,
        )
        assert (s.tokens, s.turns, s.phase, s.pooled) == (1234, 1, "acting", True)

    def test_admitted_reservation_follows_context(self) -> None:
        """With a reserve, an admitted session's weight becomes its new context + reserve."""
        s = admit(_fresh(), "n1", 1412, 11.0)
        s2 = on_response(s, 12.0, total_tokens=3000, reserve=512)
        assert s2.weight == 3512
        assert on_response(s, 12.0, total_tokens=3000).weight == 1412
        assert on_response(_fresh(), 12.0, total_tokens=3000, reserve=512).weight == 0

    def test_no_tool_goes_idle(self) -> None:
        """A plain answer leaves the session idle and out of the pool."""
        s = on_response(_fresh(), 12.0, total_tokens=50)
        assert (s.activity, s.pooled, s.tool) == ("idle", False, None)

    def test_hook_start_before_response_is_kept(self) -> None:
        """A hook that reported the call first is not replaced by the inferred one."""
        s = on_tool_start(_fresh(), "h1", "Bash", 11.5, source="hook", deadline=131.5)
        s = on_response(s, 12.0, total_tokens=10, tool_calls=[("c1", "bash")])
        assert s.tool is not None and (s.tool.call_id, s.tool.source) == ("h1", "hook")
        assert s.activity == "tool"


class TestTools:
    """Hook events take precedence over inferred ones; ends give durations."""

    def _in_tool(self) -> Session:
        return on_response(_fresh(), 12.0, total_tokens=10, tool_calls=[("c1", "bash")])

    def test_hook_start_replaces_inferred(self) -> None:
        """A hook start replaces the inferred call and carries its deadline."""
        s = on_tool_start(self._in_tool(), "c1", "Bash", 12.1, source="hook", deadline=20.0)
        assert s.tool is not None
        assert (s.tool.source, s.tool.deadline, s.tool.started_at) == ("hook", 20.0, 12.0)

    def test_inferred_start_never_replaces_hook(self) -> None:
        """An inferred start for a session in a hook-reported call changes nothing."""
        s = on_tool_start(self._in_tool(), "h", "Bash", 12.1, source="hook")
        assert on_tool_start(s, "c9", "bash", 12.2, source=INFERRED) is s

    def test_late_start_never_reopens_an_ended_call(self) -> None:
        """Async hooks cross: a start that arrives after its own end changes nothing."""
        ended, _ = on_tool_end(self._in_tool(), "c1", 13.0, source="hook")
        assert on_tool_start(ended, "c1", "Bash", 13.1, source="hook") is ended
        moved, _ = on_tool_end(self._in_tool(), "c1", 13.0, source="hook", background=True)
        assert on_tool_start(moved, "c1", "Bash", 13.1, source="hook") is moved

    def test_an_end_before_its_start_is_not_undone_by_the_start(self) -> None:
        """A tool end delivered before its start (the two on different paths: a hook's
        PostToolUse overtaking its PreToolUse) records the duration; the late start must not
        open the call again, or the session would wait in a tool that already ended."""
        idle = on_response(_fresh(), 12.0, total_tokens=10)
        ended, d = on_tool_end(idle, "h7", 13.0, source="hook", duration_s=0.8)
        assert d == 0.8 and "h7" in ended.ended_calls
        assert on_tool_start(ended, "h7", "Bash", 13.1, source="hook") is ended

    def test_end_records_reported_or_measured_duration(self) -> None:
        """The reported duration wins; otherwise end minus start."""
        s, d = on_tool_end(self._in_tool(), "c1", 14.5, source="hook")
        assert d == pytest.approx(2.5) and s.tool is not None and s.tool.completed_at == 14.5
        _, d2 = on_tool_end(self._in_tool(), "c1", 14.5, source="hook", duration_s=1.25)
        assert d2 == 1.25

    def test_background_end_gives_no_duration(self) -> None:
        """A call moved to the background makes the session runnable but is no sample."""
        s, d = on_tool_end(self._in_tool(), "c1", 13.0, source="hook", background=True)
        assert d is None and s.tool is not None and s.tool.background and not s.tool.open

    def test_progress_updates_evidence(self) -> None:
        """Progress and expected end are stored with the time they were reported."""
        s = on_tool_progress(self._in_tool(), "c1", 13.0, fraction=0.5, expected_end=15.0)
        assert s.tool is not None
        assert (s.tool.progress, s.tool.progress_ts, s.tool.expected_end) == (0.5, 13.0, 15.0)
        assert s.tool.view().expected_end_ts == 13.0

    def test_unknown_call_is_ignored(self) -> None:
        """Progress for another call id leaves the record unchanged."""
        s = self._in_tool()
        assert on_tool_progress(s, "other", 13.0, fraction=0.5) is s


class TestAdmission:
    """Admission, release, cancel and end move the session in and out of the pool."""

    def test_admit_runs_waiting_request(self) -> None:
        """Admitting a waiting session runs its request and reserves the weight."""
        s = admit(_fresh(), "n1", 1412, 11.0)
        assert (s.activity, s.node, s.weight, s.pooled) == ("running", "n1", 1412, False)

    def test_release_in_tool_rejoins_pool(self) -> None:
        """An interrupted session in a tool is pooled again with no reservation."""
        s = admit(_fresh(), "n1", 1412, 11.0)
        s = on_response(s, 12.0, total_tokens=10, tool_calls=[("c1", "bash")])
        s = release(s, 12.5)
        assert (s.node, s.weight, s.pooled, s.activity) == (None, 0, True, "tool")

    def test_cancel_and_end(self) -> None:
        """A cancelled request leaves the pool; an ended session releases everything."""
        s = on_cancel(_fresh(), 12.0)
        assert (s.activity, s.pooled) == ("idle", False)
        e = on_end(admit(_fresh(), "n1", 100, 11.0), 20.0)
        assert (e.ended, e.node, e.weight, e.pooled) == (True, None, 0, False)

    def test_cancel_when_not_waiting_is_noop(self) -> None:
        """Cancelling another (or an unnamed) request of a running session changes nothing."""
        s = admit(_fresh(), "n1", 100, 11.0)
        assert on_cancel(s, 12.0) is s
        assert on_cancel(s, 12.0, "other") is s

    def test_cancel_of_admitted_current_request_idles(self) -> None:
        """A request admitted just as its client left is withdrawn when the cancel names it."""
        s = on_cancel(admit(_fresh(), "n1", 100, 11.0), 12.0, "r1")
        assert (s.activity, s.request_id, s.node) == ("idle", None, "n1")


class TestVersions:
    """Every transition bumps the version once; the probe mark does not."""

    def test_each_change_increments(self) -> None:
        """A chain of transitions counts one version per change."""
        s = _fresh()
        s = admit(s, "n1", 1, 1.0)
        s = on_response(s, 2.0, total_tokens=3, tool_calls=[("c", "t")])
        s, _ = on_tool_end(s, "c", 3.0, source="hook")
        s = release(s, 4.0)
        assert s.version == 5 and s.updated_at == 4.0

    def test_probe_mark_keeps_version(self) -> None:
        """Spending a probe is persisted without invalidating plans."""
        s = _fresh()
        t = set_probe_mark(s, 12.0)
        assert (t.version, t.probe_mark) == (s.version, 12.0)
        assert set_probe_mark(t, 12.0) is t


_SESSION_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "activity": st.sampled_from(["idle", "waiting", "running", "tool"]),
        "node": st.none() | st.sampled_from(["n1", "n2"]),
        "weight": st.integers(0, 10**6),
        "tokens": st.integers(0, 10**6),
        "tool": st.none()
        | st.builds(ToolCall, st.text(max_size=4), st.just("bash"), st.floats(0, 9)),
        "probe_mark": st.none() | st.floats(0, 99),
        "ended_calls": st.lists(st.text(max_size=3), max_size=3).map(tuple),
        "ended": st.booleans(),
    },
)


class TestRecordCopy:
    """The transitions' record copy (``msgspec.structs.replace``) is the record built anew
    from its fields with the changes."""

    @given(_SESSION_CHANGES)
    def test_session_as_rebuilt(self, changes: dict[str, object]) -> None:
        s = msgspec.structs.replace(_fresh(), node="n1", weight=1200, tool=ToolCall("c1", "b", 1.0))
        want = Session(**{**msgspec.structs.asdict(s), **changes})  # type: ignore[arg-type]
        got = _evolve(s, **changes)
        assert got == want and type(got) is Session and got is not s
        assert hash(got) == hash(want)
        t = _touch(s, 99.0, **changes)
        assert t == msgspec.structs.replace(want, version=s.version + 1, updated_at=99.0)

    def test_tool_call_as_rebuilt(self) -> None:
        c = ToolCall("c1", "bash", 11.0, deadline=30.0)
        want = ToolCall("c1", "bash", 11.0, deadline=30.0, completed_at=12.0, background=True)
        assert _evolve(c, completed_at=12.0, background=True) == want

    def test_unknown_field_is_a_type_error(self) -> None:
        with pytest.raises(TypeError, match="Session` has no field 'bogus'"):
            _touch(_fresh(), 1.0, bogus=1)
