"""The live shared-prefix registry (:mod:`shared.core.sharedprefix`)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.blockkeys import chain_keys
from shared.core.session import Session
from shared.core.sharedprefix import SharedPrefixes, with_shared

BS = 16
SYSTEM = list(range(1000, 1000 + 40 * BS))  # a 640-token system prompt: 40 blocks


def _prompt(*parts: list[int]) -> list[int]:
    return [t for p in parts for t in p]


def _own(seed: int, n: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(50_000, 60_000) for _ in range(n)]


def _keys(tokens: list[int]) -> list[int]:
    return chain_keys(tokens, BS)


class TestShared:
    def test_two_sessions_share_the_system_prompt(self) -> None:
        """Both get the common blocks; the first is reported when the second arrives."""
        reg = SharedPrefixes()
        a = _keys(_prompt(SYSTEM, _own(1, 300)))
        b = _keys(_prompt(SYSTEM, _own(2, 500)))
        assert reg.observe("a", a, BS, "m") == 0
        assert reg.take_touched() == set()
        assert reg.observe("b", b, BS, "m") == 40 * BS
        assert reg.shared("a") == 40 * BS
        assert reg.take_touched() == {"a"}
        assert reg.take_touched() == set()

    def test_a_single_session_shares_nothing(self) -> None:
        reg = SharedPrefixes()
        assert reg.observe("a", _keys(_prompt(SYSTEM, _own(1, 100))), BS) == 0
        assert reg.shared("a") == 0
        assert reg.shared("unknown") == 0

    def test_a_partial_block_is_not_shared(self) -> None:
        """Prompts that agree on 40.5 blocks share 40 (only full blocks have keys)."""
        reg = SharedPrefixes()
        common = _prompt(SYSTEM, [7] * 8)
        reg.observe("a", _keys(_prompt(common, [1] * 40)), BS)
        assert reg.observe("b", _keys(_prompt(common, [2] * 40)), BS) == 40 * BS

    def test_fork_shares_up_to_the_fork(self) -> None:
        """A sub-agent forked from a's conversation shares a's context up to the fork; a third
        session with only the system prompt shares just that; a's growth changes nothing."""
        reg = SharedPrefixes()
        convo = _prompt(SYSTEM, _own(1, 20 * BS))
        reg.observe("a", _keys(convo), BS)
        assert reg.observe("fork", _keys(_prompt(convo, _own(9, 10 * BS))), BS) == 60 * BS
        assert reg.shared("a") == 60 * BS
        assert reg.observe("c", _keys(_prompt(SYSTEM, _own(3, 5 * BS))), BS) == 40 * BS
        assert reg.observe("a", _keys(_prompt(convo, _own(4, 30 * BS))), BS) == 60 * BS

    def test_other_models_and_block_sizes_do_not_share(self) -> None:
        reg = SharedPrefixes()
        tokens = _prompt(SYSTEM, _own(1, 100))
        reg.observe("a", _keys(tokens), BS, "m1")
        assert reg.observe("b", _keys(tokens), BS, "m2") == 0
        assert reg.observe("c", chain_keys(tokens, 32), 32, "m1") == 0
        assert reg.observe("d", _keys(tokens), BS, "m1") > 0
        assert reg.observe("b", _keys(tokens), BS, "m1") > 0  # b moved to m1's scope
        assert reg.shared("d") > 0

    def test_end_forgets_and_the_peer_is_corrected_by_its_own_response(self) -> None:
        """The survivor is not reported when its peer ends; its next observation says 0."""
        reg = SharedPrefixes()
        a = _keys(_prompt(SYSTEM, _own(1, 100)))
        reg.observe("a", a, BS)
        reg.observe("b", _keys(_prompt(SYSTEM, _own(2, 100))), BS)
        reg.take_touched()
        assert reg.forget("b") and not reg.forget("b")
        assert reg.take_touched() == set()
        assert reg.shared("a") == 0  # counted now
        assert reg.observe("a", a, BS) == 0
        reg.forget("a")
        assert len(reg) == 0 and reg.keys == 0

    def test_a_changed_prefix_moves_the_counts(self) -> None:
        """A session that moved to another system prompt no longer counts for the old one."""
        reg = SharedPrefixes()
        other = list(range(5000, 5000 + 40 * BS))
        reg.observe("a", _keys(_prompt(SYSTEM, _own(1, 100))), BS)
        reg.observe("b", _keys(_prompt(SYSTEM, _own(2, 100))), BS)
        assert reg.take_touched() == {"a"}
        reg.observe("b", _keys(_prompt(other, _own(2, 100))), BS)
        assert reg.shared("a") == 0 and reg.shared("b") == 0
        assert reg.observe("c", _keys(_prompt(other, _own(3, 100))), BS) == 40 * BS
        assert reg.take_touched() == {"b"}

    def test_an_older_chain_changes_nothing(self) -> None:
        """A redelivered response (older stamp) does not replace the newer chain."""
        reg = SharedPrefixes()
        reg.observe("a", _keys(_prompt(SYSTEM, _own(1, 100))), BS, stamp=5.0)
        reg.observe("b", _keys(_prompt(SYSTEM, _own(2, 100))), BS, stamp=5.0)
        assert reg.observe("b", _keys(_own(3, 100)), BS, stamp=4.0) == 40 * BS
        assert reg.shared("a") == 40 * BS

    def test_bad_input(self) -> None:
        reg = SharedPrefixes()
        with pytest.raises(ValueError, match="block_size"):
            reg.observe("a", [1], 0)
        with pytest.raises(ValueError, match="block keys"):
            reg.observe("a", [-1], BS)
        with pytest.raises(ValueError, match="block keys"):
            reg.observe("a", [2**64], BS)
        with pytest.raises(ValueError, match="max_keys"):
            SharedPrefixes(max_keys=0)
        assert len(reg) == 0


class TestBounds:
    def test_only_the_first_max_tokens_count(self) -> None:
        """Chains are cut at ``max_tokens``: a fork past it shares only that much."""
        reg = SharedPrefixes(max_tokens=20 * BS)
        convo = _prompt(SYSTEM, _own(1, 100 * BS))
        reg.observe("a", _keys(convo), BS)
        assert reg.keys == 20
        assert reg.observe("b", _keys(convo), BS) == 20 * BS

    def test_least_recently_observed_session_is_evicted(self) -> None:
        reg = SharedPrefixes(max_sessions=2)
        reg.observe("a", _keys(_prompt(SYSTEM, _own(1, 100))), BS)
        reg.observe("b", _keys(_prompt(SYSTEM, _own(2, 100))), BS)
        reg.observe("a", _keys(_prompt(SYSTEM, _own(1, 200))), BS)  # a is recent again
        reg.observe("c", _keys(_own(3, 100)), BS)
        assert "b" not in reg and "a" in reg and "c" in reg and reg.evicted == 1
        assert reg.shared("a") == 0

    def test_keys_bound(self) -> None:
        """Sessions go, oldest first, until the kept keys fit; the newest always stays."""
        reg = SharedPrefixes(max_keys=100)
        reg.observe("a", _keys(_own(1, 60 * BS)), BS)
        reg.observe("b", _keys(_own(2, 30 * BS)), BS)
        assert reg.keys == 90
        reg.observe("c", _keys(_own(3, 30 * BS)), BS)
        assert "a" not in reg and reg.keys == 60
        reg.observe("d", _keys(_own(4, 500 * BS)), BS)  # cut to max_keys, alone
        assert list(reg._sessions) == ["d"] and reg.keys == 100

    def test_evicted_holder_is_not_reported(self) -> None:
        reg = SharedPrefixes(max_sessions=1)
        reg.observe("a", _keys(SYSTEM), BS)
        reg.observe("b", _keys(SYSTEM), BS)
        assert reg.take_touched() == set() and reg.shared("b") == 0


def _brute(chains: dict[str, tuple[tuple[str | None, int], list[int]]], sid: str) -> int:
    scope, keys = chains[sid]
    n = 0
    for j, key in enumerate(keys):
        if not any(
            o != sid and s == scope and len(k) > j and k[j] == key for o, (s, k) in chains.items()
        ):
            break
        n += 1
    return n * scope[1]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", "d", "e"]),
            st.sampled_from(["observe", "observe", "observe", "forget"]),
            st.sampled_from([None, "m"]),
            st.lists(st.integers(0, 2), min_size=0, max_size=12),
        ),
        max_size=30,
    )
)
def test_against_brute_force(
    ops: list[tuple[str, str, str | None, list[int]]],
) -> None:
    """After any sequence of observations and ends, each session's ``shared`` is the longest
    run of leading keys some other held session has at the same position (no bounds hit)."""
    reg = SharedPrefixes(max_tokens=8 * BS)
    chains: dict[str, tuple[tuple[str | None, int], list[int]]] = {}
    for sid, op, model, tokens in ops:
        if op == "forget":
            reg.forget(sid)
            chains.pop(sid, None)
            continue
        keys = _keys([t for t in tokens for _ in range(BS)])
        reg.observe(sid, keys, BS, model)
        chains[sid] = ((model, BS), keys[:8])
    for sid in chains:
        assert reg.shared(sid) == _brute(chains, sid), sid
    assert reg.keys == sum(len(k) for _, k in chains.values())


class TestWithShared:
    def test_admitted_weight_follows(self) -> None:
        """The weight's unshared part moves; the reserve (here a grown one) is kept."""
        s = Session(id="a", version=3, node="n1", tokens=20_000, weight=20_900, updated_at=7.0)
        t = with_shared(s, 15_000)
        assert (t.shared, t.weight, t.version, t.updated_at) == (15_000, 5_900, 4, 7.0)
        back = with_shared(t, 0)
        assert back.weight == 20_900
        assert with_shared(t, 15_000) is t

    def test_pooled_or_unweighed(self) -> None:
        pooled = Session(id="a", tokens=20_000)
        assert with_shared(pooled, 15_000).weight == 0
        s = Session(id="a", node="n1", tokens=20_000, weight=20_512)
        assert with_shared(s, 15_000, reweigh=False).weight == 20_512
        assert with_shared(s, 30_000).weight == 512  # never below the reserve


class TestAfterEnd:
    """A response that finished by its session's end is not registered again."""

    def test_late_response_is_refused_and_a_reused_id_is_not(self) -> None:
        from shared.core.sharedprefix import SharedPrefixes

        reg = SharedPrefixes()
        chain = list(range(1, 9))
        reg.observe("a", chain, 16, "m", 1.0)
        reg.observe("b", chain, 16, "m", 1.0)
        assert reg.shared("b") == 8 * 16
        reg.forget("a", 5.0)
        assert reg.shared("b") == 0
        assert reg.observe("a", chain, 16, "m", 4.0) == 0  # redelivered after the end
        assert "a" not in reg and reg.shared("b") == 0
        assert reg.observe("a", chain, 16, "m", 6.0) == 8 * 16  # the id used again, later
        assert reg.shared("b") == 8 * 16
