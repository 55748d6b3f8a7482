"""Per-client byte budgets of request bodies (services/gateway/pacing.py), on a given clock."""

from __future__ import annotations

import pytest

from services.gateway.pacing import BodyPacer, client_address, pacer_of
from shared.infra.settings import Settings

MB = 1_000_000


class TestBudget:
    def test_a_burst_is_free_then_the_rate_paces(self) -> None:
        """1 MB/s with a 2 MB burst: 2 MB at once wait nothing; each further 0.5 MB waits
        0.5 s more than the one before, until the client stops."""
        pacer = BodyPacer(1 * MB, 2 * MB)
        assert pacer.charge("t", "a", 2 * MB, now=0.0) == 0.0
        assert pacer.charge("t", "a", MB // 2, now=0.0) == pytest.approx(0.5)
        assert pacer.charge("t", "a", MB // 2, now=0.0) == pytest.approx(1.0)
        assert pacer.paced_s == pytest.approx(1.5)

    def test_the_budget_refills_at_the_rate(self) -> None:
        pacer = BodyPacer(1 * MB, 2 * MB)
        pacer.charge("t", "a", 3 * MB, now=0.0)  # 1 MB over: 1 s to wait
        assert pacer.charge("t", "a", MB, now=1.0) == pytest.approx(1.0)  # still 1 MB over
        assert pacer.charge("t", "a", MB, now=5.0) == 0.0  # idle 3 s: full again (capped)
        assert pacer.charge("t", "a", 2 * MB, now=5.0) == pytest.approx(1.0)

    def test_clients_are_paced_apart(self) -> None:
        """Another address, or the same address under another tenant, has its own budget."""
        pacer = BodyPacer(1 * MB, 1 * MB)
        assert pacer.charge("t", "a", 5 * MB, now=0.0) == pytest.approx(4.0)
        assert pacer.charge("t", "b", MB, now=0.0) == 0.0
        assert pacer.charge("u", "a", MB, now=0.0) == 0.0

    def test_a_clients_connections_share_its_budget(self) -> None:
        """Chunks of two bodies of one client, interleaved, add up to one rate: the n-th
        chunk past the burst waits n chunks' time, whichever body it belongs to."""
        pacer = BodyPacer(1 * MB, 1 * MB)
        pacer.charge("t", "a", MB, now=0.0)
        waits = [pacer.charge("t", "a", 100_000, now=0.0) for _ in range(6)]
        assert waits == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])

    def test_the_clients_kept_are_bounded(self) -> None:
        """Past the bound the least recently paced client is forgotten: full again."""
        pacer = BodyPacer(1 * MB, 1 * MB, per_tenant=2, total=4)
        pacer.charge("t", "a", 3 * MB, now=0.0)
        pacer.charge("t", "b", 1, now=0.0)
        pacer.charge("t", "c", 1, now=0.0)  # drops "a"
        assert pacer.charge("t", "a", MB, now=0.0) == 0.0

    @pytest.mark.parametrize(("rate", "burst"), [(0, 1), (1, 0), (-1, 1)])
    def test_a_budget_needs_a_rate_and_a_burst(self, rate: float, burst: float) -> None:
        with pytest.raises(ValueError, match="rate and burst must be > 0"):
            BodyPacer(rate, burst)


class TestClientAddress:
    @pytest.mark.parametrize(
        ("remote", "client"),
        [
            ("10.1.2.3", "10.1.2.3"),
            ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
            ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),
            ("::ffff:10.1.2.3", "10.1.2.3"),
            (None, ""),
            ("unix-socket", "unix-socket"),
        ],
    )
    def test_an_ipv6_host_is_its_64(self, remote: str | None, client: str) -> None:
        assert client_address(remote) == client


class TestSettings:
    def test_64_mb_a_second_by_default_0_is_off_and_the_burst_is_one_largest_body(
        self,
    ) -> None:
        pacer = pacer_of(Settings())
        assert pacer is not None and pacer.rate == 64e6 and pacer.burst == 32 * 1024 * 1024
        assert pacer_of(Settings(body_client_rate=0)) is None
        pacer = pacer_of(Settings(body_client_rate=5e6, max_body_bytes=8 * MB))
        assert pacer is not None and pacer.rate == 5e6 and pacer.burst == 8 * MB
        pacer = pacer_of(Settings(body_client_rate=5e6, body_client_burst=MB))
        assert pacer is not None and pacer.burst == MB

    def test_the_environment_names_a_bad_value(self) -> None:
        with pytest.raises(ValueError, match="TAO_BODY_CLIENT_RATE"):
            Settings.from_env({"TAO_BODY_CLIENT_RATE": "-1"})
