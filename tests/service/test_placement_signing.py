"""Signed placements end to end in memory: the planner signs, the gateway acts only on those.

The planner service's ``plan_once`` on a fake store and bus (as ``test_planner_service``),
and the real gateway app (as ``test_gateway_service``) with ``TAO_PLACEMENT_KEYS``: a
request held for its session is admitted by a placement the planner signed, never by an
unsigned, forged, foreign or replayed one, and each rejection is counted by reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from shared.contracts import Placement, SessionRequest
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.signing import PlacementVerifier, load_signer, new_key_files
from shared.infra.store_types import NodeUpdate
from tests.service.test_gateway_service import GW, SETTINGS, Harness, make_harness
from tests.service.test_planner_service import placements, planner, pool, snapshot


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    new_key_files("planner-1", tmp_path / "key.toml", tmp_path / "trusted.toml")
    return tmp_path / "key.toml", tmp_path / "trusted.toml"


@pytest.fixture
async def g(keys: tuple[Path, Path]) -> AsyncIterator[Harness]:
    async for harness in make_harness(SETTINGS.replace(placement_keys=str(keys[1]))):
        yield harness


async def test_the_planner_signs_every_placement(keys: tuple[Path, Path]) -> None:
    store, bus = FakeStore(), FakeBus()
    await store.put_node_status(
        "n1", NodeUpdate(capacity_tokens=10_000, target_utilisation=1.0, healthy=True)
    )
    await pool(store, 2000, 3000)
    p = planner(store, bus)
    p.signer = load_signer(keys[0])
    await p.plan_once(await snapshot(store, bus))
    await p.resync()  # the start-up re-publication is signed too
    sent = placements(bus)
    assert len(sent) == 4 and {s.key_id for s in sent} == {"planner-1"}
    v = PlacementVerifier(keys[1], clock=lambda: sent[0].issued_at or 0.0)
    assert [v.verdict(s) for s in sent] == ["ok"] * 4


def admit(version: int = 1, **change: object) -> Placement:
    p = Placement(
        kind="admit", session_id="s1", version=version, tick=1, gateway_id=GW, node_id="n1"
    )
    return msgspec.structs.replace(p, **change) if change else p


class TestGatewayVerifies:
    async def test_only_a_signed_placement_admits(
        self, g: Harness, keys: tuple[Path, Path], tmp_path: Path
    ) -> None:
        signer = load_signer(keys[0])
        new_key_files("intruder", tmp_path / "intruder.toml", tmp_path / "theirs.toml")
        intruder = load_signer(tmp_path / "intruder.toml")
        now = time.time()
        task = asyncio.create_task(g.chat("s1"))
        await g.rec.next(SessionRequest)
        good = signer.sign(admit(5), now)
        attempts = {
            "unsigned": admit(5),
            "unknown_key": intruder.sign(admit(5), now),
            "forged": msgspec.structs.replace(good, node_id="evil"),
            "expired": signer.sign(admit(5), now - 3600),
        }
        for p in attempts.values():
            await g.bus.publish_msg(p)
        await g.bus.settle()
        await asyncio.sleep(0.05)
        assert not task.done() and g.node.bodies == []  # none of them admitted it
        for reason in attempts:
            assert g.relay.metrics.placements.get(kind="admit", result=reason) == 1, reason
        await g.bus.publish_msg(good)
        await g.bus.settle()
        resp = await asyncio.wait_for(task, 5)
        assert resp.status == 200 and len(g.node.bodies) == 1
        assert g.relay.metrics.placements.get(kind="admit", result="admitted") == 1
        # a replay of the same signed placement within the window changes nothing
        await g.bus.publish_msg(msgspec.structs.replace(good, tick=2))  # altered: forged
        await g.bus.publish_msg(signer.sign(admit(4), time.time()))  # older version: stale
        await g.bus.settle()
        assert g.relay.metrics.placements.get(kind="admit", result="forged") == 2
        assert g.relay.placements.node_of("s1") == "n1"
