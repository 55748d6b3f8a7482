"""`tao inspect session` and `tao inspect tools` views (shared/cli/inspect_state.py)."""

from __future__ import annotations

import pytest

from shared.cli.inspect_state import SessionNotFound, session_view, tools_view
from shared.core.session import Session, on_tool_start
from shared.infra.fake_store import FakeStore
from shared.infra.settings import Settings

SETTINGS = Settings(half_life_s=10.0, credit_unit=1, horizon_s=1.0)


async def _store_with_tool() -> FakeStore:
    store = FakeStore()
    await store.record_tools([("pytest", 4.0, False), ("pytest", 6.0, False), ("bash", 1.0, True)])

    def start(s: Session | None) -> Session:
        base = s or Session(id="s1", activity="idle", tokens=4096, turns=2)
        return on_tool_start(base, "call-7", "pytest", 100.0, source="hook", deadline=400.0)

    await store.update_session("s1", start)
    await store.put_residency("s1", "n1", 4096, 100.0)
    return store


async def test_session_view_reports_tool_prediction_readiness_and_decayed_credit() -> None:
    store = await _store_with_tool()
    view = await session_view(store, "s1", 110.0, SETTINGS)
    assert view["session"] == "s1" and view["state"] == "tool" and view["tokens"] == 4096
    tool = view["tool"]
    assert tool["name"] == "pytest" and tool["call_id"] == "call-7" and tool["source"] == "hook"
    assert tool["started_at"] == 100.0 and tool["deadline"] == 400.0
    # history says pytest takes about 5 s, so its end was predicted before now: a probe is due
    assert tool["evidence"].startswith("history") and tool["predicted_end"] < 110.0
    assert view["readiness"] == {"r": 1, "rule": "probe"}
    # one half-life after the observation: half the tokens remain as credit
    assert view["residency"]["n1"] == {
        "k0": 4096,
        "t_obs": 100.0,
        "age_s": 10.0,
        "credit": 2048,
        "host": 0,
    }


async def test_session_view_shows_the_host_tier_per_node() -> None:
    """A node's host KV tier tokens sit beside its GPU residency; a node that holds the
    session in its host tier only is listed with no GPU residency."""
    store = await _store_with_tool()
    await store.put_tiered_residencies(
        [("s1", "n1", 4096, 100.0, 8192), ("s1", "n2", 0, 90.0, 512)]
    )
    view = await session_view(store, "s1", 110.0, SETTINGS)
    assert view["residency"]["n1"]["host"] == 8192 and view["residency"]["n1"]["k0"] == 4096
    assert view["residency"]["n2"] == {
        "k0": 0,
        "t_obs": None,
        "age_s": None,
        "credit": 0,
        "host": 512,
    }
    assert list(view["residency"]) == ["n1", "n2"]


async def test_unknown_session_raises() -> None:
    with pytest.raises(SessionNotFound):
        await session_view(FakeStore(), "nobody", 0.0, SETTINGS)


async def test_tools_view_has_per_tool_and_global_statistics() -> None:
    store = await _store_with_tool()
    view = await tools_view(store)
    pytest_row = view["tools"]["pytest"]
    assert pytest_row["count"] == 2 and pytest_row["mean_s"] == pytest.approx(5.0)
    assert pytest_row["min_s"] == 4.0 and pytest_row["max_s"] == 6.0
    assert pytest_row["evidence"] == "history:tool" and pytest_row["predicted_s"] >= 5.0
    assert view["tools"]["bash"]["censored"] == 1 and view["tools"]["bash"]["count"] == 0
    assert view["global"]["count"] == 2 and view["global"]["censored"] == 1
