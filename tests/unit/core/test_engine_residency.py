"""Eviction counter, eviction log, pool generation and chain residency queries of the engine."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared.core.engine import PROFILES, ROOT_HASH, BlockPool, Engine, EngineRequest, chain_hash
from shared.core.engine import cache as cache_mod


def _hash(i: int) -> int:
    return chain_hash(ROOT_HASH, [i, i, i, i])


def _chain(tokens: list[int], bs: int) -> list[int]:
    out: list[int] = []
    parent = ROOT_HASH
    for j in range(len(tokens) // bs):
        parent = chain_hash(parent, tokens[j * bs : j * bs + bs])
        out.append(parent)
    return out


class TestEvictionLog:
    """The pool counts and logs un-cached blocks, oldest first."""

    def test_counts_only_cached_blocks(self) -> None:
        """Allocating never-cached free blocks evicts nothing; popping cached ones counts each."""
        pool = BlockPool(3, 4)
        a, b, c = pool.allocate(3)
        pool.cache(a, _hash(1), ROOT_HASH, [1] * 4)
        pool.cache(c, _hash(3), ROOT_HASH, [3] * 4)
        assert pool.evicted == 0
        pool.release([a, b, c])  # free order: c, b, a
        pool.allocate(2)
        assert pool.evicted == 1
        assert pool.evicted_since(0) == [_hash(3)]
        pool.allocate(1)
        assert pool.evicted == 2
        assert pool.evicted_since(1) == [_hash(1)]
        assert pool.evicted_since(2) == []
        pool.check()

    def test_trimmed_log_says_none(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Past twice the kept length the oldest entries go and a mark before them gets None."""
        monkeypatch.setattr(cache_mod, "_LOG_KEEP", 2)
        pool = BlockPool(1, 4)
        for i in range(6):
            (b,) = pool.allocate(1)
            pool.cache(b, _hash(i), ROOT_HASH, [i] * 4)
            pool.release([b])
        (b,) = pool.allocate(1)
        assert pool.evicted == 6
        assert pool.evicted_since(0) is None
        assert pool.evicted_since(4) == [_hash(4), _hash(5)]

    def test_generation_moves_on_every_mutation(self) -> None:
        """touch, allocate, release and cache each bump the generation."""
        pool = BlockPool(2, 4)
        seen = [pool.generation]
        (a,) = pool.allocate(1)
        seen.append(pool.generation)
        pool.cache(a, _hash(0), ROOT_HASH, [0] * 4)
        seen.append(pool.generation)
        pool.release([a])
        seen.append(pool.generation)
        pool.touch([a])
        seen.append(pool.generation)
        assert seen == sorted(set(seen))


evictions: list[int] = []


class TestResidentBlocks:
    """``resident_blocks`` on the chain hashes answers what ``resident_prefix`` does."""

    @settings(max_examples=25, deadline=None)
    @example(turns=[(s, 200, 40) for _ in range(3) for s in range(4)])  # evicts: 4 × 700 > 1024
    @given(
        turns=st.lists(
            st.tuples(st.integers(0, 3), st.integers(1, 200), st.integers(1, 40)),
            min_size=1,
            max_size=12,
        )
    )
    def test_incremental_equals_full_walk(self, turns: list[tuple[int, int, int]]) -> None:
        """Starting at a previous answer while nothing was evicted, or before the first block
        evicted since, gives the full walk's answer, under eviction pressure."""
        prof = PROFILES["qwen3-32b-tp2"]
        prof = replace(prof, kv_tokens=64 * prof.block_size)
        eng = Engine("n0", prof)
        bs = eng.block_size
        ctx: dict[int, list[int]] = {}
        known: dict[int, tuple[int, int]] = {}
        now = 0.0
        for k, (sess, added, out) in enumerate(turns):
            toks = ctx.setdefault(sess, list(range(sess * 10**6, sess * 10**6 + 32)))
            toks.extend(range(len(toks) + sess * 10**6, len(toks) + sess * 10**6 + added))
            if len(toks) + out > prof.kv_tokens:
                break
            output = list(range(len(toks) + sess * 10**6, len(toks) + sess * 10**6 + out))
            eng.submit(EngineRequest(f"r{k}", f"s{sess}", list(toks), out, output), now)
            eng.advance(now + 0.05)
            now = eng.next_event_time() or now + 0.05
            eng.advance(now)
            for s, t in ctx.items():
                hashes = _chain(t, bs)
                stop = len(hashes)
                ev = eng.evicted_blocks
                start = 0
                if s in known:
                    mark, start = known[s]
                    gone = eng.evicted_since(mark)
                    if gone is None:
                        start = 0
                    for h in gone or []:
                        if h in hashes[:start]:
                            start = hashes.index(h)
                n = eng.resident_blocks(hashes, stop, start)
                assert n * bs == eng.resident_prefix(t)
                known[s] = (ev, n)
            toks.extend(output)
        evictions.append(eng.evicted_blocks)

    @classmethod
    def teardown_class(cls) -> None:
        """Hypothesis drew workloads that evicted (else the property was not exercised)."""
        assert max(evictions, default=0) > 0
