"""The gateway's per-session hook rate limit: which session a payload names, and the buckets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.gateway.hook_limit import HookLimiter, session_of
from shared.harness.claude import SUB_AGENT_INFIX
from shared.harness.registry import mapper_for

FIXTURES = Path(__file__).parents[2] / "fixtures"
HARNESS_DIRS = {
    "claude-code": "claude",
    "mini-swe-agent": "mini-swe-agent",
    "openhands": "openhands",
    "opencode": "opencode",
}


_HOOK_KEYS = {"hook_event_name", "event_type", "hook", "event"}
"""A top-level key of each harness's hook payloads (other fixtures are requests, configs)."""


def _payloads() -> list[tuple[str, str, bytes]]:
    out: list[tuple[str, str, bytes]] = []
    for folder, harness in HARNESS_DIRS.items():
        for path in sorted((FIXTURES / folder).glob("*.json")):
            data = path.read_bytes()
            doc = json.loads(data)
            if isinstance(doc, dict) and _HOOK_KEYS & set(doc):
                out.append((harness, path.name, data))
        events = FIXTURES / folder / "events.jsonl"
        if events.exists():  # OpenCode's bus events, as its plugin posts them
            for i, line in enumerate(events.read_text().splitlines()):
                wrapped = {"hook": "event", "ts": 1767225600000, "event": json.loads(line)}
                out.append((harness, f"events.jsonl:{i + 1}", json.dumps(wrapped).encode()))
    return out


PAYLOADS = _payloads()


def test_fixtures_cover_every_harness() -> None:
    assert {h for h, _, _ in PAYLOADS} == set(HARNESS_DIRS.values())


@pytest.mark.parametrize(
    ("harness", "name", "data"), PAYLOADS, ids=[f"{h}/{n}" for h, n, _ in PAYLOADS]
)
def test_session_agrees_with_the_mapper(harness: str, name: str, data: bytes) -> None:
    """Where the harness's own mapper finds a session, the limiter keys on the same one, or on
    the session a Claude Code sub-agent's id is made from (its parent's bucket). The one
    exception: OpenCode's ``session.deleted`` names its session as ``info.id``; it shares the
    harness's bucket (one event per session)."""
    msgs = mapper_for(harness).map(json.loads(data), 1767225600.0)
    ids = {getattr(m, "session_id", None) for m in msgs} - {None}
    if not ids:
        return
    found = session_of(data)
    if name == "session-deleted.json" and harness == "opencode":
        assert found == ""
        return
    assert found, ids
    for mapped in ids:  # an Agent call's end also ends its sub-agent's session
        assert mapped == found or mapped.startswith(found + SUB_AGENT_INFIX), (mapped, found)


@pytest.mark.parametrize(
    ("body", "want"),
    [
        (b'{"session_id": "a"}', "a"),
        (b'{"input": {"sessionID": "b"}}', "b"),
        (b'{"event": {"properties": {"part": {"sessionID": "c"}}}}', "c"),
        (b'{"a": {"b": {"c": {"d": {"session_id": "too deep"}}}}}', ""),
        (b'{"session_id": 7}', ""),
        (b'{"session_id": ""}', ""),
        (b"not json", ""),
        (b"[1, 2]", ""),
    ],
)
def test_session_of(body: bytes, want: str) -> None:
    assert session_of(body) == want


class TestBuckets:
    def test_burst_then_rate(self) -> None:
        lim = HookLimiter(rate=2.0, burst=3)
        key = ("t", "claude", "s1")
        assert [lim.take(key, 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
        assert lim.take(key, 0.0) == pytest.approx(0.5)  # the 4th at once: wait 1/rate
        assert lim.take(key, 0.5) == 0.0  # refilled one
        assert lim.take(key, 0.5) > 0
        assert lim.take(("t", "claude", "s2"), 0.5) == 0.0  # another session: its own bucket
        assert lim.take(("u", "claude", "s1"), 0.5) == 0.0  # another tenant's s1: its own

    def test_refill_caps_at_burst(self) -> None:
        lim = HookLimiter(rate=100.0, burst=2)
        key = ("", "claude", "s1")
        lim.take(key, 0.0)
        lim.take(key, 0.0)
        assert lim.take(key, 100.0) == 0.0 and lim.take(key, 100.0) == 0.0
        assert lim.take(key, 100.0) > 0  # not 10,000 saved up

    def test_keys_are_bounded(self) -> None:
        lim = HookLimiter(rate=1.0, burst=1, max_keys=100)
        for i in range(1000):
            lim.take(("", "claude", f"s{i}"), 0.0)
        assert len(lim) == 100

    @pytest.mark.parametrize(("wait", "header"), [(0.01, "1"), (1.0, "1"), (1.2, "2")])
    def test_retry_after_whole_seconds(self, wait: float, header: str) -> None:
        assert HookLimiter.retry_after(wait) == header
