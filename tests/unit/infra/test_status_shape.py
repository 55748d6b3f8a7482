"""`tao status --json` has exactly the keys the README's table documents (its shape is read
by checks outside the repository, so a key added or dropped must show in the docs)."""

from __future__ import annotations

import re
from pathlib import Path

from shared.core.session import Session, ToolCall
from shared.infra.fake_store import FakeStore
from shared.infra.store_types import NodeUpdate

README = Path(__file__).resolve().parents[3] / "README.md"


def _documented() -> dict[str, set[str]]:
    """row key → the backticked names of its content, parenthesised remarks left out."""
    text = README.read_text()
    section = text[text.index("### `tao status --json`") :]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z_]+)(?:\[\])?` \| (.*) \|$", line)
        if m is None:
            continue
        content = m.group(2)
        while re.search(r"\([^()]*\)", content):
            content = re.sub(r"\([^()]*\)", "", content)
        rows[m.group(1)] = set(re.findall(r"`([a-z_0-9]+)`", content))
        if len(rows) == 4:
            break
    return rows


async def test_status_keys_are_the_documented_ones() -> None:
    store = FakeStore()
    await store.put_node_status(
        "n1", NodeUpdate(capacity_tokens=1000, healthy=True, url="http://n1")
    )
    call = ToolCall("c1", "bash", 1.0)
    await store.update_session("s1", lambda _: Session("s1", version=1, activity="tool", tool=call))
    await store.incr(ticks=1)
    status = await store.status()
    doc = _documented()
    assert set(doc) == {"domain", "nodes", "sessions", "planner"}
    assert set(status) == set(doc)
    nodes, sessions = status["nodes"], status["sessions"]
    assert isinstance(nodes, list) and isinstance(sessions, list)
    assert set(nodes[0]) == doc["nodes"]
    assert set(sessions[0]) == doc["sessions"]
    planner = status["planner"]
    assert isinstance(planner, dict) and set(planner) == doc["planner"]
