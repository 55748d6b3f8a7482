"""Engine scheduling: prefix-cache hits across turns, preemption, limits, abort, events."""

from __future__ import annotations

import dataclasses
import math

import pytest

from shared.contracts.kv import BlockRemoved, BlockStored
from shared.core.engine import PROFILES, Completion, Engine, EngineRequest, Profile

QWEN = PROFILES["qwen3-32b-tp2"]


def tiny(blocks: int) -> Profile:
    """A small profile for exercising capacity limits."""
    return dataclasses.replace(QWEN, name="tiny", kv_tokens=blocks * 16)


def run_all(e: Engine) -> list[Completion]:
    return e.advance(math.inf)


class TestPrefixCache:
    """Turn N+1 hits the full blocks of turn N's prompt and output."""

    def test_second_turn_hits_previous_prompt_and_output(self) -> None:
        """cached_tokens = full blocks of prompt + output minus the never-computed last token."""
        e = Engine("n", QWEN)
        prompt = list(range(100))
        e.submit(EngineRequest("t1", "s", prompt, 20), 0.0)
        (c1,) = run_all(e)
        assert c1.cached_tokens == 0
        prompt2 = prompt + list(c1.output) + list(range(5000, 5030))
        e.submit(EngineRequest("t2", "s", prompt2, 5), 10.0)
        (c2,) = run_all(e)
        # 100 + 20 tokens, the last output token's KV is never computed: 119 -> 7 full blocks
        assert c2.cached_tokens == 112
        assert e.prefix_cache_queries == 100 + 150
        assert e.prefix_cache_hits == 112

    def test_last_prompt_token_never_counted(self) -> None:
        """An identical 32-token prompt hits only its first block: 1 token is always recomputed."""
        e = Engine("n", QWEN)
        e.submit(EngineRequest("a", "s", list(range(32)), 1), 0.0)
        run_all(e)
        e.submit(EngineRequest("b", "s2", list(range(32)), 1), 1.0)
        (c,) = run_all(e)
        assert c.cached_tokens == 16

    def test_hit_is_cheaper(self) -> None:
        """A cached prefix shortens the prefill, so TTFT drops."""
        e = Engine("n", QWEN)
        prompt = list(range(4000))
        e.submit(EngineRequest("a", "s", prompt, 1), 0.0)
        (a,) = run_all(e)
        e.submit(EngineRequest("b", "s", [*prompt, 1, 2, 3], 1), 10.0)
        (b,) = run_all(e)
        assert b.cached_tokens == 4000
        assert b.first_token_at - b.arrived_at < (a.first_token_at - a.arrived_at) / 5

    def test_resident_prefix_and_eviction(self) -> None:
        """Ground-truth residency falls to 0 once other prompts evict the blocks (LRU)."""
        e = Engine("n", tiny(10))
        p = list(range(64))
        e.submit(EngineRequest("a", "s", p, 1), 0.0)
        run_all(e)
        assert e.resident_prefix(p) == 64
        assert e.resident_prefix(p, session_id="s") == 64
        assert e.resident_prefix(p[:40]) == 32
        e.submit(EngineRequest("b", "t", list(range(1000, 1150)), 1), 1.0)
        run_all(e)
        assert e.resident_prefix(p) == 0
        e.pool.check()

    def test_lru_evicts_least_recently_freed(self) -> None:
        """Of two freed prompts, the one freed earlier is evicted first."""
        e = Engine("n", tiny(6))
        pa, pb = list(range(32)), list(range(100, 132))
        e.submit(EngineRequest("a", "s", pa, 1), 0.0)
        run_all(e)
        e.submit(EngineRequest("b", "t", pb, 1), 1.0)
        run_all(e)
        # free queue now: 2 never-used blocks, a's 2 (tail first), b's 2; c takes 3 from the head
        e.submit(EngineRequest("c", "u", list(range(500, 548)), 1), 2.0)
        run_all(e)
        assert e.resident_prefix(pb) == 32
        assert e.resident_prefix(pa) == 16


class TestCapacity:
    """Capacity is never exceeded: limits queue requests and shortage preempts."""

    def test_prompt_that_never_fits_rejected(self) -> None:
        """submit refuses a request larger than the whole cache, naming it."""
        e = Engine("n", tiny(4))
        with pytest.raises(ValueError, match="never fit"):
            e.submit(EngineRequest("big", "s", list(range(60)), 10), 0.0)

    def test_bad_requests_rejected(self) -> None:
        """Empty prompts, zero max_tokens, wrong scripted length and duplicate ids are refused."""
        e = Engine("n", QWEN)
        with pytest.raises(ValueError, match="empty prompt"):
            e.submit(EngineRequest("a", "s", [], 1), 0.0)
        with pytest.raises(ValueError, match="max_tokens"):
            e.submit(EngineRequest("a", "s", [1], 0), 0.0)
        with pytest.raises(ValueError, match="scripted output"):
            e.submit(EngineRequest("a", "s", [1], 2, output=[5]), 0.0)
        e.submit(EngineRequest("a", "s", [1], 1), 0.0)
        with pytest.raises(ValueError, match="already"):
            e.submit(EngineRequest("a", "s", [1], 1), 0.0)

    def test_preemption_recomputes_and_finishes(self) -> None:
        """When decode runs out of blocks the newest request is preempted, later resumed."""
        e = Engine("n", tiny(5))
        e.submit(EngineRequest("a", "s", list(range(16)), 40), 0.0)
        e.submit(EngineRequest("b", "t", list(range(100, 116)), 40), 0.0)
        done = run_all(e)
        assert e.num_preemptions >= 1
        assert sorted(c.request_id for c in done) == ["a", "b"]
        assert all(c.completion_tokens == 40 and len(c.output) == 40 for c in done)
        by_id = {c.request_id: c for c in done}
        assert by_id["a"].finished_at < by_id["b"].finished_at
        assert e.running == 0 and e.waiting == 0 and e.kv_usage == 0.0
        e.pool.check()

    def test_max_num_seqs_queues(self) -> None:
        """With max_num_seqs=1 the second request waits for the first to finish."""
        e = Engine("n", dataclasses.replace(QWEN, max_num_seqs=1))
        e.submit(EngineRequest("a", "s", [1, 2, 3], 5), 0.0)
        e.submit(EngineRequest("b", "t", [4, 5, 6], 5), 0.0)
        e.advance(0.0)
        assert (e.running, e.waiting) == (1, 1)
        a, b = run_all(e)
        assert b.first_token_at > a.finished_at

    def test_kv_usage_tracks_running(self) -> None:
        """kv_usage counts blocks held by running requests only, like vLLM."""
        e = Engine("n", tiny(10))
        e.submit(EngineRequest("a", "s", list(range(40)), 5), 0.0)
        e.advance(0.0)
        assert e.kv_usage == pytest.approx(3 / 10)
        run_all(e)
        assert e.kv_usage == 0.0
        assert e.kv_cached_blocks == 2


class TestAbort:
    """abort frees a request's blocks wherever it is."""

    def test_abort_running_frees_blocks(self) -> None:
        """Aborting a running request returns its blocks and it never completes."""
        e = Engine("n", tiny(10))
        e.submit(EngineRequest("a", "s", list(range(40)), 50), 0.0)
        e.advance(0.0)
        assert e.kv_usage > 0
        e.abort("a", 0.5)
        assert e.kv_usage == 0.0 and e.running == 0
        assert run_all(e) == []
        e.pool.check()

    def test_abort_waiting_and_unknown(self) -> None:
        """Aborting a queued request dequeues it; an unknown id is ignored."""
        e = Engine("n", dataclasses.replace(QWEN, max_num_seqs=1))
        e.submit(EngineRequest("a", "s", [1], 3), 0.0)
        e.submit(EngineRequest("b", "t", [2], 3), 0.0)
        e.advance(0.0)
        e.abort("b", 0.0)
        e.abort("nope", 0.0)
        assert [c.request_id for c in run_all(e)] == ["a"]


class TestProgressAndEvents:
    """progress, next_event_time, KV events and determinism."""

    def test_progress_counts_tokens(self) -> None:
        """progress reports tokens produced by now and the first-token time once reached."""
        e = Engine("n", QWEN)
        e.submit(EngineRequest("a", "s", list(range(100)), 10), 0.0)
        assert e.progress("a", 0.0) == (0, None)
        first = e.next_event_time()
        assert first is not None and first > 0.0
        n, t = e.progress("a", first)
        assert n == 1 and t == pytest.approx(first)
        (c,) = e.advance(10.0)
        assert c.completion_tokens == 10
        with pytest.raises(KeyError):
            e.progress("a", 10.0)

    def test_next_event_time_never_late(self) -> None:
        """Advancing to next_event_time step by step yields the same completions as one jump."""

        def make() -> Engine:
            e = Engine("n", tiny(12))
            for i in range(4):
                e.submit(
                    EngineRequest(f"r{i}", f"s{i}", list(range(i, i + 20 + 7 * i)), 9 + i), 0.0
                )
            return e

        jump = run_all(make())
        e = make()
        got: list[Completion] = []
        for _ in range(10_000):
            t = e.next_event_time()
            if t is None:
                break
            got.extend(e.advance(t))
        assert got == jump
        assert len(got) == 4

    def test_time_cannot_go_backwards(self) -> None:
        """A call with an earlier now than before is refused."""
        e = Engine("n", QWEN)
        e.advance(5.0)
        with pytest.raises(ValueError, match="backwards"):
            e.advance(4.0)

    def test_kv_events_mirror_cache(self) -> None:
        """Stored minus removed hashes equals the set of hashes resident in the pool."""
        e = Engine("n", tiny(6), emit_kv_events=True)
        for i in range(4):
            e.submit(EngineRequest(f"r{i}", f"s{i}", list(range(100 * i, 100 * i + 40)), 3), i)
            e.advance(float(i))
        run_all(e)
        live: set[int] = set()
        removed = 0
        for ev in e.drain_kv_events():
            if isinstance(ev, BlockStored):
                assert len(ev.token_ids) == 16 * len(ev.block_hashes)
                live.update(h for h in ev.block_hashes if isinstance(h, int))
            elif isinstance(ev, BlockRemoved):
                removed += 1
                live.difference_update(h for h in ev.block_hashes if isinstance(h, int))
        assert removed > 0
        assert len(live) == e.kv_cached_blocks
        assert all(e.pool.lookup(h) is not None for h in live)

    def test_deterministic(self) -> None:
        """Two engines fed the same calls produce identical completions and block hashes."""

        def once() -> tuple[list[Completion], list[object]]:
            e = Engine("n", tiny(8), emit_kv_events=True)
            for i in range(5):
                e.submit(EngineRequest(f"r{i}", "s", list(range(30 + 10 * i)), 7), 0.1 * i)
            return run_all(e), list(e.drain_kv_events())

        assert once() == once()
