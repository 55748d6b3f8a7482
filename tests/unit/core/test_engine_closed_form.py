"""The closed-form decode runs give exactly what one-step-at-a-time simulation gives."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.core.engine import PROFILES, Completion, Engine, EngineRequest

QWEN = PROFILES["qwen3-32b-tp2"]

Workload = list[tuple[float, str, list[int], int]]


def scripted(n: int) -> list[int]:
    """A scripted output over the prompts' small alphabet, so later prompts can contain it."""
    return [(k * 7 + k // 5) % 4 for k in range(n)]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, int, int, Workload, list[float]]:
    blocks = draw(st.integers(4, 24))
    max_seqs = draw(st.integers(1, 5))
    budget = draw(st.integers(8, 80))
    prefixes = [draw(st.lists(st.integers(0, 3), min_size=0, max_size=48)) for _ in range(3)]
    n = draw(st.integers(1, 8))
    reqs: Workload = []
    t = 0.0
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.001, 0.02, 0.1, 0.5]))
        tail = draw(st.lists(st.integers(0, 3), min_size=1, max_size=30))
        if reqs and draw(st.booleans()):
            # continue an earlier request: its prompt + part of its (scripted) output
            _t, _sid, p0, m0 = reqs[draw(st.integers(0, len(reqs) - 1))]
            prompt = p0 + scripted(m0)[: draw(st.integers(0, m0))] + tail
        else:
            prompt = prefixes[draw(st.integers(0, 2))] + tail
        max_tokens = draw(st.integers(1, 60))
        if len(prompt) + max_tokens <= blocks * 16:
            reqs.append((t, f"s{i % 3}", prompt, max_tokens))
    probes = draw(st.lists(st.floats(0.0, 3.0), max_size=5))
    return blocks, max_seqs, budget, reqs, sorted(probes)


def simulate(
    closed: bool, blocks: int, max_seqs: int, budget: int, reqs: Workload, probes: list[float]
) -> tuple[list[Completion], list[object], int]:
    p = dataclasses.replace(
        QWEN, kv_tokens=blocks * 16, max_num_seqs=max_seqs, max_batched_tokens=budget
    )
    e = Engine("n", p, emit_kv_events=True, closed_form=closed)
    calls = sorted(
        [(t, i, "submit") for i, (t, *_r) in enumerate(reqs)] + [(t, -1, "probe") for t in probes]
    )
    out: list[Completion] = []
    for t, i, kind in calls:
        out.extend(e.advance(t))
        if kind == "submit":
            _t, sid, prompt, max_tokens = reqs[i]
            e.submit(EngineRequest(f"r{i}", sid, prompt, max_tokens, scripted(max_tokens)), t)
    out.extend(e.advance(math.inf))
    e.pool.check()
    return out, list(e.drain_kv_events()), e.num_preemptions


class TestClosedForm:
    """Jumping over runs of identical decode steps changes nothing observable."""

    @settings(max_examples=300, deadline=None)
    @given(workloads())
    def test_same_as_stepping(self, w: tuple[int, int, int, Workload, list[float]]) -> None:
        """Completions (ids, times, tokens, cache hits), KV events and preemptions all match."""
        fast = simulate(True, *w)
        slow = simulate(False, *w)
        assert fast == slow
        assert len(fast[0]) == len(w[3])

    def test_run_skips_steps(self) -> None:
        """A long decode is committed in a handful of scheduler passes, not one per token."""
        e = Engine("n", QWEN)
        for i in range(8):
            e.submit(EngineRequest(f"r{i}", f"s{i}", list(range(i, i + 50)), 500), 0.0)
        calls = 0
        orig = e._step

        def counting() -> None:
            nonlocal calls
            calls += 1
            orig()

        e._step = counting  # type: ignore[method-assign]
        done = e.advance(math.inf)
        assert len(done) == 8
        assert e.steps >= 500
        assert calls <= 3

    def test_run_stops_when_a_decode_creates_a_hit_for_the_waiting_head(self) -> None:
        """A blocked request whose prefix a running request is still writing gets admitted at the
        same step in both modes (the run must end when that block becomes cached)."""
        p = dataclasses.replace(QWEN, kv_tokens=5 * 16)
        out_a = scripted(60)
        prompt_a = list(range(20))
        prompt_b = prompt_a + out_a[:40] + list(range(1000, 1010))

        def go(closed: bool) -> list[Completion]:
            e = Engine("n", p, closed_form=closed)
            e.submit(EngineRequest("a", "s", prompt_a, 60, out_a), 0.0)
            e.advance(0.05)
            e.submit(EngineRequest("b", "s2", prompt_b, 1), 0.05)
            return e.advance(math.inf)

        slow = go(False)
        assert go(True) == slow
        b = next(c for c in slow if c.request_id == "b")
        assert b.cached_tokens >= 32
