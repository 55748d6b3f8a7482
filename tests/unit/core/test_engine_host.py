"""The engine model's host KV tier: vLLM 0.32's OffloadingConnector semantics (docs/kv-tier.md).

Each test names the rule of vLLM's code it pins (short names and ``file:L@0.32`` as in
docs/kv-tier.md)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.kv import BlockRemoved, BlockStored
from shared.core.engine import PROFILES, ROOT_HASH, Engine, EngineRequest, chain_hash
from shared.core.engine.host import HostCache
from shared.core.engine.profiles import prefill_time
from shared.core.tiers import CPU, GPU, HostLink

QWEN = PROFILES["qwen3-32b-tp2"]
BS = 16


def _profile(blocks: int, *, max_seqs: int = 8, budget: int = 8192) -> object:
    return dataclasses.replace(
        QWEN, kv_tokens=blocks * BS, max_num_seqs=max_seqs, max_batched_tokens=budget
    )


def _engine(gpu_blocks: int, host_blocks: int, **kw: int) -> Engine:
    p = _profile(gpu_blocks, **kw)
    link = HostLink(
        blocks=host_blocks,
        block_size=BS,
        bytes_per_token=QWEN.kv_bytes_per_gpu_token,
        h2d_bytes_s=QWEN.h2d_bytes_s,
        d2h_bytes_s=QWEN.d2h_bytes_s,
    )
    return Engine("n", p, emit_kv_events=True, host=link)  # type: ignore[arg-type]


def _chain(tokens: list[int]) -> list[int]:
    out: list[int] = []
    parent = ROOT_HASH
    for j in range(len(tokens) // BS):
        parent = chain_hash(parent, tokens[j * BS : j * BS + BS])
        out.append(parent)
    return out


def _prompt(seed: int, n: int) -> list[int]:
    return [(seed * 1_000_003 + 7 * i) % 50_000 for i in range(n)]


def _run(e: Engine, rid: str, sid: str, prompt: list[int], t: float, max_tokens: int = 4):
    e.submit(EngineRequest(rid, sid, prompt, max_tokens), t)
    done = e.advance(math.inf)
    assert [c.request_id for c in done] == [rid]
    return done[0]


class TestStores:
    """Write-through stores of full prompt blocks (osched:1846-1885; base:616-622)."""

    def test_full_prompt_blocks_are_stored_once_their_copy_ends(self) -> None:
        """After a request, its full prompt blocks are ready in the host, not its partial block
        nor its decode blocks; each is announced once with vLLM's placeholder payload, the
        GPU event's hash and medium CPU, after the GPU events (oevents:337-379)."""
        e = _engine(64, 256)
        prompt = _prompt(1, 10 * BS + 5)
        _run(e, "a", "s", prompt, 0.0, max_tokens=40)
        e.advance(math.inf)
        chain = _chain(prompt)
        assert e.host_resident_blocks(chain, len(chain)) == 10
        events = e.drain_kv_events()
        cpu = [ev for ev in events if getattr(ev, "medium", None) == CPU]
        assert [ev.block_hashes[0] for ev in cpu] == chain  # prompt blocks only, in order
        for ev in cpu:
            assert isinstance(ev, BlockStored)
            assert (ev.parent_block_hash, ev.token_ids, ev.block_size) == (None, [], 0)
        first_cpu = events.index(cpu[0])
        assert all(getattr(ev, "medium", GPU) == GPU for ev in events[:first_cpu])
        assert e.host is not None and e.host.stored_blocks == 10

    def test_a_block_the_host_holds_is_not_stored_again(self) -> None:
        """prepare_store drops keys already present (cpumgr:262-270)."""
        e = _engine(64, 256)
        prompt = _prompt(2, 6 * BS)
        _run(e, "a", "s", prompt, 0.0)
        _run(e, "b", "s", prompt + _prompt(3, 2 * BS), 1.0)
        assert e.host is not None and e.host.stored_blocks == 8

    def test_not_hittable_before_the_copy_ends(self) -> None:
        """A stored block turns ready only when its store completes (pbase:36-45)."""
        host = HostCache(HostLink(8, BS, 1 << 20, 1e9, 1e9))
        assert host.offer([11, 12], 1.0)
        assert host.run([11, 12], 0, 2) == 0
        end = host.next_completion()
        assert end is not None and end == pytest.approx(1.0 + 2 * BS * (1 << 20) / 1e9)
        host.complete(end - 1e-9)
        assert host.run([11, 12], 0, 2) == 0
        host.complete(end)
        assert host.run([11, 12], 0, 2) == 2

    def test_stores_queue_behind_each_other(self) -> None:
        """One D2H FIFO per engine (gpuworker:255-260,666-670)."""
        host = HostCache(HostLink(8, BS, 1 << 20, 1e9, 1e9))
        host.offer([1], 0.0)
        first = host.next_completion()
        host.offer([2], 0.0)
        host.complete(first or 0.0)
        assert host.run([1, 2], 0, 2) == 1


class TestEviction:
    """LRU on demand over ready, unpinned blocks (cpumgr:310-334; lru:96-159)."""

    def test_lru_evicts_oldest_and_announces_it(self) -> None:
        host = HostCache(HostLink(3, BS, 1, 1e12, 1e12), emit_kv_events=True)
        for h in (1, 2, 3):
            host.offer([h], 0.0)
        host.complete(1.0)
        host.drain_events()
        host.offer([4], 1.0)
        host.complete(2.0)
        ev = host.drain_events()
        assert ev[0] == BlockRemoved(block_hashes=[1], medium=CPU)
        assert not host.holds(1) and all(host.holds(h) for h in (2, 3, 4))
        host.check()

    def test_eviction_log(self) -> None:
        """evicted_since lists what left since a mark, oldest first (the simulator resumes its
        host walks from it)."""
        host = HostCache(HostLink(2, BS, 1, 1e12, 1e12))
        host.offer([1, 2], 0.0)
        host.complete(1.0)
        mark = host.evicted
        host.offer([3], 1.0)
        host.complete(2.0)
        host.offer([4], 2.0)
        assert host.evicted_since(mark) == [1, 2]
        assert host.evicted_since(host.evicted) == []

    def test_finish_reranks_tail_before_head(self) -> None:
        """A finished request's blocks are re-ranked in reverse prefix order: its tail goes
        first (lru:96-104)."""
        host = HostCache(HostLink(3, BS, 1, 1e12, 1e12))
        host.offer([1, 2, 3], 0.0)
        host.complete(1.0)
        host.touch([1, 2, 3])
        host.offer([9], 1.0)
        assert not host.holds(3) and host.holds(1) and host.holds(2)

    def test_a_store_longer_than_the_host_fails(self) -> None:
        """More new blocks than the host holds cannot be stored whatever it evicts (the walk
        that finds them stops there: it once filled the hash table and never ended)."""
        host = HostCache(HostLink(1, BS, 1, 1e12, 1e12))
        host.offer([1], 0.0)
        host.complete(1.0)
        assert not host.offer(list(range(100, 140)), 1.0)
        assert host.store_failures == 1 and host.holds(1) and host.num_blocks == 1
        host.check()

    def test_pinned_blocks_are_not_evicted_and_a_store_without_room_fails(self) -> None:
        """Only ref_cnt == 0 blocks are evictable; with too few the store is skipped
        (cpumgr:315-317; osched:1732-1740)."""
        host = HostCache(HostLink(2, BS, 1, 1e12, 1e12))
        host.offer([1, 2], 0.0)
        host.complete(1.0)
        host.load([1, 2], 1.0)
        assert not host.offer([3], 1.0)
        assert host.store_failures == 1 and host.holds(1) and host.holds(2)
        host.unpin([1, 2])
        assert host.offer([3], 2.0)
        host.check()


class TestLoads:
    """A host hit is an asynchronous load (osched:1039-1097; vsched:1241-1341)."""

    def _evicted_from_gpu(self) -> tuple[Engine, list[int]]:
        """Session s's 40-block prompt, then other prompts that push it out of the GPU."""
        e = _engine(64, 1024)
        prompt = _prompt(5, 40 * BS)
        _run(e, "a", "s", prompt, 0.0)
        for i in range(3):
            _run(e, f"x{i}", f"o{i}", _prompt(100 + i, 50 * BS), 1.0 + i)
        chain = _chain(prompt)
        assert e.resident_blocks(chain, len(chain)) < 40
        assert e.host_resident_blocks(chain, len(chain)) == 40
        e.drain_kv_events()
        return e, prompt

    def test_host_hit_counts_as_cached_and_costs_the_load_not_the_prefill(self) -> None:
        e, prompt = self._evicted_from_gpu()
        gpu_hit = e.resident_blocks(_chain(prompt), 40)
        turn = prompt + _prompt(9, 3 * BS)
        c = _run(e, "b", "s", turn, 10.0)
        assert c.cached_tokens == 40 * BS  # vLLM: num_cached_tokens = local + external
        assert e.host_hit_tokens == (40 - gpu_hit) * BS
        link = e.host.link if e.host else None
        assert link is not None
        load = link.load_s((40 - gpu_hit) * BS)
        ttft = c.first_token_at - c.arrived_at
        assert ttft >= load
        assert ttft < prefill_time(e.profile, len(turn), 0)  # cheaper than recomputing

    def test_loaded_blocks_are_announced_on_the_gpu_after_the_load(self) -> None:
        """vsched:3155-3157: cache_blocks after the load."""
        e, prompt = self._evicted_from_gpu()
        gpu_hit = e.resident_blocks(_chain(prompt), 40)
        _run(e, "b", "s", prompt + _prompt(9, BS), 10.0)
        stored = {
            ev.block_hashes[0]
            for ev in e.drain_kv_events()
            if isinstance(ev, BlockStored) and ev.medium == GPU
        }
        assert set(_chain(prompt)[gpu_hit:40]) <= stored

    def test_abort_while_loading_unpins(self) -> None:
        e, prompt = self._evicted_from_gpu()
        e.submit(EngineRequest("b", "s", prompt + [1] * BS, 4), 10.0)
        e.advance(10.0)
        assert e.waiting == 1 and e.running == 0  # waiting for its load
        e.abort("b", 10.0)
        assert e.host is not None
        e.host.check()
        e.pool.check()
        assert e.waiting == 0


def _workload_runs(closed: bool, seed_prompts: list[list[int]], gaps: list[float]):
    e = _engine(10, 40, max_seqs=3, budget=64)
    t = 0.0
    out = []
    for i, (p, g) in enumerate(zip(seed_prompts, gaps, strict=False)):
        t += g
        out.extend(e.advance(t))
        e.submit(EngineRequest(f"r{i}", f"s{i % 2}", p, 5), t)
    out.extend(e.advance(math.inf))
    e.pool.check()
    assert e.host is not None
    e.host.check()
    return out, e.drain_kv_events(), e.num_preemptions


class TestClosedFormWithHost:
    """Closed-form decode runs stop at a load's end: the same as stepping."""

    @settings(max_examples=150, deadline=None)
    @given(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 150)), min_size=1, max_size=8),
        st.lists(st.sampled_from([0.0, 0.001, 0.02, 0.1, 0.5]), min_size=8, max_size=8),
    )
    def test_same_as_stepping(self, spec: list[tuple[int, int]], gaps: list[float]) -> None:
        prompts = [_prompt(base, n) for base, n in spec]
        fast = _workload_runs(True, prompts, gaps)
        slow = _workload_runs(False, prompts, gaps)
        assert fast == slow
        assert len(fast[0]) == len(prompts)


class TestEventDriven:
    """Driven only by :meth:`Engine.next_event_time`, as the simulator drives it, an engine
    with loads in flight always makes progress (a load that ended before the committed clock
    once made the next event time stand still) and finishes what ``advance(inf)`` finishes."""

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(st.tuples(st.integers(0, 3), st.integers(1, 150)), min_size=1, max_size=8),
    )
    def test_next_event_time_always_progresses(self, spec: list[tuple[int, int]]) -> None:
        prompts = [_prompt(base, n) for base, n in spec]
        e = _engine(10, 40, max_seqs=3, budget=64)
        for i, p in enumerate(prompts):
            e.submit(EngineRequest(f"r{i}", f"s{i % 2}", p, 5), 0.0)
        done = []
        now = 0.0
        for _ in range(20_000):
            t = e.next_event_time()
            if t is None:
                break
            now = max(now, t)
            done.extend(e.advance(now))
        else:
            pytest.fail("next_event_time made no progress")
        reference, _, _ = _workload_runs(True, prompts, [0.0] * len(prompts))
        assert sorted(c.request_id for c in done) == sorted(c.request_id for c in reference)


class _DictHost:
    """The host tier as plain dicts, block by block (the tier's first implementation): the
    reference the array tier must match operation by operation."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.pins: dict[int, int] = {}
        self.lru: dict[int, None] = {}  # insertion order = LRU order
        self.pending: list[list[int]] = []
        self.evicted: list[int] = []
        self.failures = 0

    def run(self, hashes: list[int], start: int, stop: int) -> int:
        j = start
        while j < stop and self.pins.get(hashes[j], -1) >= 0:
            j += 1
        return j

    def complete(self) -> list[int]:
        done = []
        for job in self.pending:
            for h in job:
                if self.pins.get(h) == -1:
                    self.pins[h] = 0
                    self.lru[h] = None
                    done.append(h)
        self.pending = []
        return done

    def offer(self, hashes: list[int]) -> bool:
        new = list(dict.fromkeys(h for h in hashes if h not in self.pins))
        if not new:
            return True
        short = len(self.pins) + len(new) - self.capacity
        if short > 0:
            if short > len(self.lru):
                self.failures += 1
                return False
            for _ in range(short):
                h = next(iter(self.lru))
                del self.lru[h]
                del self.pins[h]
                self.evicted.append(h)
        for h in new:
            self.pins[h] = -1
        self.pending.append(new)
        return True

    def load(self, hashes: list[int]) -> None:
        for h in hashes:
            if self.pins[h] == 0:
                del self.lru[h]
            self.pins[h] += 1

    def unpin(self, hashes: list[int]) -> None:
        for h in hashes:
            self.pins[h] -= 1
            if self.pins[h] == 0:
                self.lru[h] = None

    def touch(self, hashes: list[int]) -> None:
        for h in reversed(hashes):
            if h in self.lru:
                del self.lru[h]
                self.lru[h] = None


class TestAgainstReference:
    """The array tier (hostkernels) against :class:`_DictHost`, on random operation sequences:
    the same hits, store failures, evictions in the same order, the same announced stores and
    the same LRU order (through what later evictions pick)."""

    @settings(max_examples=300, deadline=None)
    @given(st.integers(1, 24), st.lists(st.tuples(st.integers(0, 5), st.integers(0, 9),
           st.integers(1, 12)), min_size=1, max_size=80))  # fmt: skip
    def test_same_as_the_dict_tier(self, capacity: int, ops: list[tuple[int, int, int]]) -> None:
        host = HostCache(HostLink(capacity, BS, 1, 1e12, 1e12), emit_kv_events=True)
        ref = _DictHost(capacity)
        loads: list[list[int]] = []
        now = 0.0
        for op, chain, length in ops:
            # chains share heads (hash = chain * 1000 + position, positions from a chain's
            # first block) and a few hashes above 2**63, as chain hashes are
            hashes = [
                (chain % 4) * 1000 + j + (1 << 63 if chain >= 8 else 0) for j in range(length)
            ]
            now += 1.0
            if op == 0:
                assert host.offer(hashes, now) == ref.offer(hashes)
            elif op == 1:
                host.complete(now + 1.0)
                stored = [
                    e.block_hashes[0] for e in host.drain_events() if isinstance(e, BlockStored)
                ]
                assert stored == ref.complete()
            elif op == 2:
                assert host.run(hashes, 0, length) == ref.run(hashes, 0, length)
            elif op == 3:
                ready = hashes[: ref.run(hashes, 0, length)]
                if ready:
                    host.load(ready, now)
                    ref.load(ready)
                    loads.append(ready)
            elif op == 4 and loads:
                done = loads.pop(0)
                host.unpin(done)
                ref.unpin(done)
            else:
                host.touch(hashes)
                ref.touch(hashes)
            removed = [
                e.block_hashes[0] for e in host.drain_events() if isinstance(e, BlockRemoved)
            ]
            assert host.evicted_since(0) == ref.evicted
            assert removed == ref.evicted[len(ref.evicted) - len(removed) :]
            assert host.store_failures == ref.failures
            assert host.num_blocks == len(ref.pins)
            host.check()
