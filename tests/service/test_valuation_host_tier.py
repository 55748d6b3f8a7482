"""The live valuation with host KV tiers: each node's host-tier load rate comes from the nodes
file (``kv_bytes_per_gpu_token`` / ``h2d_gbs``), each session's host residency from the store
(written by telemetry), and both reach :func:`value_snapshot`; the interrupt candidates' host
figures reach the planner through the snapshot's wire form."""

from __future__ import annotations

from services.planner.mapping import from_wire, to_wire
from services.valuation.app import host_links
from services.valuation.handlers import Valuator, with_host_links
from shared.contracts.codec import decode, encode
from shared.contracts.valuation import ValuationSnapshot
from shared.core.rules import DEFAULT_RULES, RULE_SETS, RuleSet
from shared.core.session import Session, ToolCall
from shared.core.valuation import NodeView, ValuationParams
from shared.infra.fake_store import FakeStore
from shared.infra.fakes import FakeBus
from shared.infra.logging import get_logger
from shared.infra.settings import NodeSpec, Settings
from shared.infra.store_types import NodeUpdate

NOW = 1000.0
PARAMS = ValuationParams()
RATE = 131072 / 35.2e9  # Qwen3-32B on TP2 over H100's measured H2D


def _valuator(store: FakeStore, load: dict[str, float], rules: RuleSet = DEFAULT_RULES) -> Valuator:
    return Valuator(store=store, bus=FakeBus(), log=get_logger("test"), params=PARAMS,
                    idle_timeout_s=300.0, clock=lambda: NOW, rules=rules,
                    host_load=load)  # fmt: skip


async def _world(capacity: int) -> FakeStore:
    """A pooled session whose context n1's host tier holds (its GPU copy is gone) and one
    admitted on n1 in a tool, its context in n1's host tier too."""
    st = FakeStore()
    await st.put_node_status("n1", NodeUpdate(capacity_tokens=capacity, target_utilisation=1.0,
                             healthy=True, models=None))  # fmt: skip
    call = ToolCall("c0", "bash", NOW - 5.0)
    await st.update_session(
        "p00", lambda _: Session("p00", version=2, activity="tool", tokens=8000, tool=call)
    )
    await st.update_session(
        "a00",
        lambda _: Session(
            "a00",
            version=3,
            activity="tool",
            node="n1",
            weight=6512,
            tokens=6000,
            tool=ToolCall("t0", "bash", NOW - 5.0),
        ),
    )
    await st.put_tiered_residencies(
        [("p00", "n1", 0, NOW - 1.0, 8000), ("a00", "n1", 2000, NOW - 1.0, 6000)]
    )
    return st


class TestHostCredit:
    async def test_a_host_held_prefix_is_credited_on_its_node(self) -> None:
        """The pooled session's host-held context is worth credit on n1 with the node's link
        known; without it (no host tier known) or under tao-no-tier, none."""
        store = await _world(100_000)
        snap = await _valuator(store, {"n1": RATE}).run_tick()
        credit = next(c.credit for c in snap.candidates if c.id == "p00")
        assert 0 < credit.get("n1", 0) <= 8000
        for load, rules in (({}, DEFAULT_RULES), ({"n1": RATE}, RULE_SETS["tao-no-tier"])):
            snap = await _valuator(store, load, rules).run_tick()
            assert next(c.credit for c in snap.candidates if c.id == "p00").get("n1", 0) == 0

    async def test_interrupt_candidates_carry_the_host_figures_to_the_planner(self) -> None:
        """On a shortfall the in-tool session is listed with what n1's host holds of it and
        n1's load rate, and the snapshot's wire form keeps both (the planner's release rule
        prices its context by the load)."""
        store = await _world(9_000)
        snap = await _valuator(store, {"n1": RATE}).run_tick()
        (ic,) = snap.interrupts
        assert (ic.id, ic.host_tokens, ic.load_s_per_token) == ("a00", 6000, RATE)
        views = [NodeView(id="n1", capacity_tokens=9_000, target_utilisation=1.0)]
        wire = decode(encode(to_wire(snap, views)), ValuationSnapshot)
        (back,) = from_wire(wire).interrupts
        assert (back.host_tokens, back.load_s_per_token) == (6000, RATE)


class TestHostLinks:
    def test_from_the_nodes_file(self) -> None:
        nodes = (
            NodeSpec("a", "http://a", kv_bytes_per_gpu_token=131072, h2d_gbs=35.2),
            NodeSpec("b", "http://b"),
        )
        assert host_links(Settings(nodes=nodes)) == {"a": RATE}

    def test_views_get_their_node_rate(self) -> None:
        views = [NodeView(id="a", capacity_tokens=1), NodeView(id="b", capacity_tokens=1)]
        out = with_host_links(views, {"a": RATE})
        assert [v.host_load_s_per_token for v in out] == [RATE, 0.0]
        assert with_host_links(views, {}) is views
