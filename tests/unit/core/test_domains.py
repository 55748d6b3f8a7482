"""The upper-level choice between scheduling domains (shared.core.domains)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.domains import DomainLoad, choose_domain, domain_load, session_demand
from shared.core.session import Session, admit, on_request
from shared.core.valuation import NodeView


class TestChooseDomain:
    def test_least_loaded_after_the_session_and_ties_by_name(self) -> None:
        """The ratio is (demand + weight) / capacity: a big, busier domain can beat a small,
        idler one; equal ratios go to the first name."""
        loads = [DomainLoad("a", 1000, 500), DomainLoad("b", 4000, 1500)]
        assert choose_domain(loads, 100) == "b"  # 0.6 vs 0.4
        assert choose_domain([DomainLoad("b", 100, 10), DomainLoad("a", 200, 20)], 0) == "a"

    def test_only_domains_that_serve_the_model_and_have_capacity(self) -> None:
        loads = [
            DomainLoad("idle-other-model", 10_000, 0, frozenset({"llama"})),
            DomainLoad("busy", 1000, 900, frozenset({"qwen"})),
            DomainLoad("down", 0, 0),
        ]
        assert choose_domain(loads, 10, "qwen") == "busy"
        assert choose_domain(loads, 10, "mistral") is None
        assert choose_domain(loads, 10, None) is None  # a model-less request: any-model domains
        assert choose_domain([*loads, DomainLoad("any", 50, 40)], 10, None) == "any"

    @given(
        st.lists(st.tuples(st.integers(1, 10**6), st.integers(0, 10**6)), min_size=1, max_size=8),
        st.integers(0, 10**5),
    )
    @settings(max_examples=200, deadline=None)
    def test_matches_the_exact_minimum(self, caps: list[tuple[int, int]], weight: int) -> None:
        """Against the written-out rule with exact fractions."""
        loads = [DomainLoad(f"d{i:02d}", c, dem) for i, (c, dem) in enumerate(caps)]
        want = min(loads, key=lambda d: (Fraction(d.demand + weight, d.capacity), d.name))
        assert choose_domain(loads, weight) == want.name


def test_session_demand_counts_admitted_weights_and_waiting_tokens() -> None:
    waiting, _ = on_request(Session("w"), "r", 1.0, tokens_estimate=1000)
    held, _ = on_request(Session("h"), "r", 1.0, tokens_estimate=300)
    held = admit(held, "n1", 2048, 2.0)
    gone = Session("e", ended=True, tokens=5000)
    assert session_demand([waiting, held, gone], reserve=512) == 1512 + 2048


class TestDomainLoad:
    def test_healthy_usable_capacity_reserved_plus_pooled_demand_and_the_models(self) -> None:
        nodes = [
            NodeView("n1", 10_000, 0.9, reserved=3000, models=frozenset({"m"})),
            NodeView("n2", 5000, 1.0, reserved=700, healthy=False, models=frozenset({"q"})),
        ]
        waiting, _ = on_request(Session("w"), "r", 1.0, model="m", tokens_estimate=400)
        load = domain_load("pool-a", nodes, [waiting], reserve=100)
        assert load == DomainLoad("pool-a", 9000, 3000 + 700 + 500, frozenset({"m", "q"}))

    def test_a_node_that_names_no_models_makes_the_domain_serve_any(self) -> None:
        nodes = [NodeView("n1", 1000, models=frozenset({"m"})), NodeView("n2", 1000)]
        assert domain_load("d", nodes, [], reserve=0).models is None
        assert domain_load("d", [], [], reserve=0) == DomainLoad("d", 0, 0, frozenset())
