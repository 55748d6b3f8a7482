"""The canonical log line of each scheduling service carries the core's typed diagnostics:
the planner's ``plan_tick`` (how the plan was proven, what each heuristic reached, the
baselines' own facts) and the valuation's ``valuation_tick`` (why a candidate fits nowhere).
Each line is held with ``structlog.testing.capture_logs``, as a log reader would see it."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from services.valuation.handlers import SKIPPED_LOGGED, Valuator
from shared.core.heuristics import PORTFOLIO
from shared.core.session import Session, on_request
from shared.core.valuation import ValuationParams
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.store_types import NodeUpdate
from tests.service.test_planner_service import NOW, planner, pool, snapshot

pytestmark = pytest.mark.usefixtures("info_lines_kept")


def lines(logs: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == event]


async def nodes(store: FakeStore, *caps: int, models: frozenset[str] | None = None) -> None:
    for i, cap in enumerate(caps):
        update = NodeUpdate(
            capacity_tokens=cap, target_utilisation=1.0, healthy=True, models=models
        )
        await store.put_node_status(f"n{i + 1}", update)


class TestPlanTick:
    async def test_tao_line_says_how_the_plan_was_proven(self) -> None:
        """Everything fits: the line names the proof (a bound met), the objective of each
        portfolio heuristic tried, and the objective TAO optimised (unablated: the plan's)."""
        store, bus = FakeStore(), FakeBus()
        await nodes(store, 10_000)
        await pool(store, 2000, 3000)
        snap = await snapshot(store, bus)
        with capture_logs() as logs:
            await planner(store, bus, "tao").plan_once(snap)
        [line] = lines(logs, "plan_tick")
        assert line["exact"] is True and line["proof"] == "bound"
        # the portfolio stops at the first heuristic that admits everyone
        assert list(line["heuristics"]) == [name for name, _ in PORTFOLIO][:1]
        assert line["own_objective"][3] == line["admitted"] == 2
        assert max(line["heuristics"].values()) == line["own_objective"]

    async def test_dp_proof_and_root_bound_when_not_everyone_fits(self) -> None:
        """Demand past capacity on two nodes: the line carries the node groups and the root
        bound the tables gave, and a proof (bound or DP) for an exact plan."""
        store, bus = FakeStore(), FakeBus()
        await nodes(store, 6_000, 5_000)
        await pool(store, 2500, 2600, 2700, 1800, 3100, 900)
        snap = await snapshot(store, bus)
        with capture_logs() as logs:
            await planner(store, bus, "tao").plan_once(snap)
        [line] = lines(logs, "plan_tick")
        assert line["groups"] == 2
        assert list(line["heuristics"]) == [name for name, _ in PORTFOLIO]
        assert len(line["root_bound"]) == 4 and line["root_bound"] >= line["own_objective"]
        assert line["exact"] is True and line["proof"] in ("bound", "dp")

    async def test_baseline_line_names_the_candidates_it_left_out(self) -> None:
        """A heuristic baseline's line names the candidates it placed nowhere (and none of
        the DP's fields)."""
        store, bus = FakeStore(), FakeBus()
        await nodes(store, 4_000)
        await pool(store, 3000, 3000)
        snap = await snapshot(store, bus)
        with capture_logs() as logs:
            await planner(store, bus, "rr").plan_once(snap)
        [line] = lines(logs, "plan_tick")
        assert line["admitted"] == 1 and len(line["skipped"]) == 1
        assert line["skipped"][0] in ("s0", "s1") and "pointer" in line
        assert "proof" not in line and "heuristics" not in line

    async def test_thunderagent_line_says_whether_its_check_ran(self) -> None:
        """ThunderAgent's line carries its pause check's facts."""
        store, bus = FakeStore(), FakeBus()
        await nodes(store, 10_000)
        await pool(store, 1000)
        snap = await snapshot(store, bus, thunder=True)
        with capture_logs() as logs:
            await planner(store, bus, "thunderagent").plan_once(snap)
        [line] = lines(logs, "plan_tick")
        assert line["policy"] == "thunderagent" and line["admitted"] == 1
        assert isinstance(line["checked"], bool)


class TestValuationTick:
    async def tick(self, store: FakeStore) -> dict[str, Any]:
        v = Valuator(store, FakeBus(), get_logger("test"), ValuationParams(), 300.0, lambda: NOW)
        with capture_logs() as logs:
            await v.run_tick()
        [line] = lines(logs, "valuation_tick")
        return line

    async def put(self, store: FakeStore, sid: str, tokens: int, model: str = "m") -> None:
        s, _ = on_request(
            Session(sid), "r", NOW - 1, model=model, gateway_id="gw", tokens_estimate=tokens
        )
        await store.update_session(sid, lambda _o, s=s: s)

    async def test_names_why_a_candidate_fits_nowhere(self) -> None:
        """A session too large for every node, and one for a model no node serves, each get
        their reason; a session that fits is not named."""
        store = FakeStore()
        await nodes(store, 8_000, 6_000, models=frozenset({"m"}))
        await self.put(store, "fits", 1000)
        await self.put(store, "huge", 50_000)
        await self.put(store, "other", 1000, model="x")
        line = await self.tick(store)
        assert line["candidates"] == 3
        assert line["skipped"] == {"huge": "too-large", "other": "model"}
        assert line["skipped_by"] == {"too-large": 1, "model": 1}

    async def test_mixed_reasons_and_no_nodes(self) -> None:
        """Too large for one node and the wrong model for the other: both reasons; with no
        node at all: ``no nodes``."""
        store = FakeStore()
        await store.put_node_status(
            "n1", NodeUpdate(capacity_tokens=2_000, healthy=True, models=frozenset({"m"}))
        )
        await store.put_node_status(
            "n2", NodeUpdate(capacity_tokens=90_000, healthy=True, models=frozenset({"y"}))
        )
        await self.put(store, "big", 5000)
        assert (await self.tick(store))["skipped"] == {"big": "model+too-large"}
        bare = FakeStore()
        await self.put(bare, "lonely", 100)
        assert (await self.tick(bare))["skipped"] == {"lonely": "no nodes"}

    async def test_a_line_names_a_bounded_few_and_counts_all(self) -> None:
        """With every node down each pooled session is skipped: the line counts them all by
        reason and names only the first few."""
        store = FakeStore()
        await store.put_node_status("n1", NodeUpdate(capacity_tokens=10_000, healthy=False))
        for i in range(SKIPPED_LOGGED + 9):
            await self.put(store, f"s{i:02d}", 100)
        line = await self.tick(store)
        assert line["skipped_by"] == {"unhealthy": SKIPPED_LOGGED + 9}
        assert len(line["skipped"]) == SKIPPED_LOGGED

    async def test_nothing_skipped_no_fields(self) -> None:
        store = FakeStore()
        await nodes(store, 10_000)
        await self.put(store, "a", 100)
        line = await self.tick(store)
        assert "skipped" not in line and "skipped_by" not in line
