"""The live ThunderAgent policies on ThunderAgent's code path (issue 38): admissions by the
machine's own accounting (no second capacity test), the check's period on snapshot time,
shared tokens from the engine's KV usage (``thunderagent-ideal``) and the acting-token decay
(``thunderagent-decay``). FakeBus + FakeStore, the rig of test_planner_thunder."""

from __future__ import annotations

import pytest

from services.planner.handlers import measured_used
from services.planner.thunder import Held, ThunderState
from shared.core.problem import Node
from shared.core.thunder import BUFFER_PER_PROGRAM
from shared.core.tick import TickSnapshot
from tests.service.test_planner_thunder import T0, bump_version, held, rig, waiting


class TestOwnAccounting:
    """A resume ThunderAgent's accounting allows is admitted even where the store's TAO
    accounting (weights against capacity × target utilisation) has no room: ThunderAgent has
    no second test (router.py:793-838), so the old capacity-checked apply delayed it a check."""

    @pytest.mark.parametrize("policy", ["thunderagent", "thunderagent-ideal"])
    async def test_direct_admission_over_the_target_utilisation(self, policy: str) -> None:
        r = await rig(10_000, policy, target=0.9)  # the store's room: 9,000
        await held(r.store, "big", "idle", 5_000)
        await waiting(r.store, "w", 3_950, T0)  # ThunderAgent: 10,000 - 5,100 >= 4,050
        await r.tick(T0)
        assert ("admit", "w") in r.placements()
        w = await r.store.get_session("w")
        assert w is not None and w.node == "n1"
        node = await r.store.get_node("n1")
        assert node is not None and node.reserved == 5_000 + 3_950 + BUFFER_PER_PROGRAM

    async def test_a_session_that_moved_is_not_admitted(self) -> None:
        """The version guard still holds: a session changed since the snapshot stays pooled."""
        r = await rig(10_000)
        await waiting(r.store, "w", 1_000, T0)
        snap = await r.snapshot()
        await bump_version(r.store, "w")
        await r.planner.plan_once(snap)
        w = await r.store.get_session("w")
        assert w is not None and w.node is None


class TestCheckPeriod:
    """ThunderAgent sleeps ``scheduler_interval`` between checks (router.py:660-665); on
    snapshots the check lands on the one nearest the interval, not the first after it."""

    @pytest.mark.parametrize(
        ("interval", "gaps", "period"),
        [(1.0, [1.02, 0.98, 1.01, 0.99] * 10, 1.0), (5.0, [1.0] * 40, 5.0),
         (2.0, [0.97, 1.04] * 20, 2.0)],
    )  # fmt: skip
    def test_mean_period_is_the_interval(
        self, interval: float, gaps: list[float], period: float
    ) -> None:
        st = ThunderState.for_policy("thunderagent", interval)
        t, checks = T0, []
        for g in [0.0, *gaps]:
            t += g
            if st.due(t):
                st.last_check = t
                checks.append(t)
            st.last_seen = t
        mean = (checks[-1] - checks[0]) / (len(checks) - 1)
        assert abs(mean - period) <= 0.1 * period


class TestSharedTokensLive:
    """``thunderagent-ideal``: shared = REASONING tokens - the engine's KV in use (state.py:126-
    133), so a prefix the engine holds once leaves room ``thunderagent`` does not see."""

    @pytest.mark.parametrize(("policy", "admitted"), [("thunderagent", False),
                                                      ("thunderagent-ideal", True)])  # fmt: skip
    async def test_new_program_fits_beside_shared_prefix(self, policy: str, admitted: bool) -> None:
        r = await rig(10_000, policy, used=5_000)  # two 4,000-token programs share 3,000
        await held(r.store, "a", "running", 4_000)
        await held(r.store, "b", "running", 4_000)
        await r.tick(T0)  # the first check: shared 3,000 under ideal
        await waiting(r.store, "w", 3_000, T0 + 0.5)  # plain room 1,800 < 3,100 <= 4,800
        await r.tick(T0 + 1.0)
        assert (("admit", "w") in r.placements()) is admitted

    @pytest.mark.parametrize(
        ("used", "running", "waiting", "measured"),
        [(1_000, 1, 0, 1_000), (0, 0, 0, 0), (0, 1, 0, None), (1_000, 1, 2, None)],
    )
    def test_measured_used(
        self, used: int, running: int, waiting: int, measured: int | None
    ) -> None:
        """0 KV in use while the engine runs requests is a missing metric, and while it queues
        requests the planner cannot tell which hold KV: no measure (shared 0, as ThunderAgent
        without metrics, vllm_metrics.py:305-306)."""
        assert measured_used(used, running, waiting) == measured

    @pytest.mark.parametrize(
        ("used", "shared"), [(1_000, 3_000), (None, 0), (0, 4_000), (5_000, 0)]
    )
    def test_shared_over_running_sessions(self, used: int | None, shared: int) -> None:
        """Only the held sessions running on the node count (an idle one holds no request)."""
        st = ThunderState.for_policy("thunderagent-ideal")
        hold = (
            Held("a", "n1", 4_000, 4_000, "running", 1),
            Held("b", "n1", 9_000, 9_000, "idle", 1),
        )
        snap = TickSnapshot(1, T0, 512, (Node("n1", 6_000, 4_000),), ())
        st.step(snap, {"n1": 20_000}, hold, {"n1": True}, {"n1": used})
        assert st.ta is not None and st.ta.shared.get("n1", 0) == shared


class TestDecayLive:
    """``thunderagent-decay``: the check's resume weighs an idle (ACTING) program 2^-t
    (state.py:193-211), then its pause (no decay) pauses that program (router.py:677-683)."""

    async def test_waiting_program_swaps_in_for_an_idle_one(self) -> None:
        r = await rig(10_000, "thunderagent-decay")
        await held(r.store, "big", "idle", 9_000)
        await waiting(r.store, "w", 3_000, T0)
        await r.tick(T0)  # the first check: big adopted ACTING now, weighs all 9,000
        assert ("admit", "w") not in r.placements()
        await r.tick(T0 + 5.0)  # the next: big weighs 9,000 / 32
        assert ("admit", "w") in r.placements()
        assert ("interrupt", "big") in r.placements()
