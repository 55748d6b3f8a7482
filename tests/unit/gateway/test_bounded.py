"""Maps keyed by client input: bounded per tenant and in all, the flooding tenant paying."""

from __future__ import annotations

import pytest

from services.gateway.bounded import TenantLRU
from services.gateway.calibration import PromptCalibration
from services.gateway.hook_limit import HookLimiter
from services.gateway.response_ids import ResponseIds


class TestTenantLRU:
    """At most per_tenant entries of a tenant and total in all; a drop over the total comes
    from the tenant holding the most, least recently used first."""

    def test_per_tenant_bound_drops_that_tenants_oldest(self) -> None:
        dropped: list[tuple[str, int]] = []
        m: TenantLRU[str, int, str] = TenantLRU(2, 10, lambda t, k, v: dropped.append((t, k)))
        m.put("b", 0, "b0")
        for k in range(3):
            m.put("a", k, f"a{k}")
        assert m.get("a", 0) is None and m.get("a", 2) == "a2" and m.get("b", 0) == "b0"
        assert dropped == [("a", 0)] and m.dropped == 1 and len(m) == 3

    def test_total_bound_drops_from_the_largest_tenant(self) -> None:
        m: TenantLRU[str, int, int] = TenantLRU(100, 5)
        m.put("quiet", 0, 0)
        m.put("quiet", 1, 1)
        for k in range(50):
            m.put("flood", k, k)
        assert len(m) == 5 and m.count("quiet") == 2 and m.count("flood") == 3

    def test_get_touches(self) -> None:
        m: TenantLRU[str, int, int] = TenantLRU(2, 2)
        m.put("a", 0, 0)
        m.put("a", 1, 1)
        assert m.get("a", 0) == 0  # now the most recently used
        m.put("a", 2, 2)
        assert m.get("a", 1) is None and m.get("a", 0) == 0

    def test_pop_and_bounds_checked(self) -> None:
        m: TenantLRU[str, int, int] = TenantLRU(2, 2)
        m.put("a", 0, 0)
        assert m.pop("a", 0) == 0 and m.pop("a", 0) is None and len(m) == 0
        with pytest.raises(ValueError, match="per_tenant and total"):
            TenantLRU(0, 1)


class TestHookBuckets:
    """One tenant flooding new session ids keeps at most its share of buckets; another
    tenant's bucket, half spent, is still there (a forgotten bucket would be full again)."""

    def test_a_flooding_tenant_does_not_evict_another(self) -> None:
        lim = HookLimiter(rate=0.001, burst=2, max_keys=50, max_keys_per_tenant=10)
        assert lim.take(("b", "claude", "s"), 0.0) == 0.0
        assert lim.take(("b", "claude", "s"), 0.0) == 0.0
        for n in range(1000):
            lim.take(("a", "claude", f"s{n}"), 0.0)
        assert lim.count("a") == 10 and lim.count("b") == 1
        assert lim.take(("b", "claude", "s"), 0.0) > 0  # still spent: not forgotten

    def test_the_tenant_bucket_spans_sessions(self) -> None:
        lim = HookLimiter(rate=10.0, burst=10, tenant_rate=1.0, tenant_burst=3)
        waits = [lim.take(("t", "claude", f"s{n}"), 0.0) for n in range(5)]
        assert waits[:3] == [0.0, 0.0, 0.0] and all(w > 0 for w in waits[3:])
        assert lim.take(("u", "claude", "s0"), 0.0) == 0.0  # another tenant: its own bucket


class TestResponseIdsPerTenant:
    """One tenant serving many responses never evicts another tenant's ids."""

    def test_flood_keeps_the_other_tenants_ids(self) -> None:
        ids = ResponseIds(ttl_s=100, per_tenant=10, total=15)
        ids.served("b", "resp_b", "sb", 0)
        for n in range(1000):
            ids.served("a", f"resp_{n}", "sa", 0)
        assert ids.session("b", "resp_b", 1) == "sb"
        assert ids.count("a") == 10 and len(ids) == 11
        assert ids.session("a", "resp_b", 1) is None  # another tenant's id names nothing


class TestCalibrationPerTenant:
    """A tenant whose text tokenizes densely moves only its own factor."""

    def test_one_tenant_cannot_poison_another(self) -> None:
        c = PromptCalibration(alpha=1.0)
        c.observe("m", 1000, 4000, "cjk")
        assert c.factor("m", "cjk") == 4.0
        assert c.factor("m", "prose") == 1.0 and c.scale("m", 1000, "prose") == 1000

    def test_bounded_and_long_models_not_learnt(self) -> None:
        c = PromptCalibration()
        for n in range(500):
            c.observe(f"model-{n}", 1000, 800, "t")
        c.observe("m" * 300, 1000, 800, "t")
        assert len(c) == 64 and c.factor("m" * 300, "t") == 1.0
