"""KV-event indexing throughput: vLLM payloads decoded and applied to ``KvIndex``, one core.

A script, not a test: it prints markdown tables to stdout (progress on stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.kv_events                 # 200k events x 3 runs
    PYTHONPATH=. .venv/bin/python -m benchmarks.kv_events --events 50000 --runs 1
    taskset -c 1 .venv/bin/python -m benchmarks.kv_events                 # pin to one core

The workload is a simulated engine (block size 16): ``--sessions`` agent sessions share a
system prompt of 64 blocks and grow turn by turn. Two mixes: ``vllm`` is what vLLM emits (its
``BlockPool.cache_full_blocks`` runs once per scheduler step and request, so a turn is one
prefill ``BlockStored`` of 1-16 blocks followed by 1-8 decode stores of one block each; its
``_maybe_evict_cached_block`` emits one ``BlockRemoved`` per evicted block); ``bulk`` is a
heavier stress mix where every store has 1-16 blocks and every removal 1-16 hashes. Stores
chain to the session's last block; once ``--capacity`` blocks are resident the oldest are
evicted, interleaved with the stores (evicting a session's tail makes its next store an
orphan, as in a real engine). Events
go into batches of 1-32 (one engine step each). Every session's chain is registered with the
index first (as the gateway's responses would), so the reverse map and the incremental prefix
updates are part of the cost. The payloads are encoded once per encoding (``legacy`` with int
hashes, ``mapev`` with 32-byte hashes, ``map`` with int hashes) and the timed loop is exactly
what telemetry does per message: ``decode_kv_batch`` then ``KvIndex.apply``. Best of ``--runs``
with a fresh index each; ``time.perf_counter``; GC left on.

The last table is the session-walk cost: registering a chain (own keys of a long prompt) on
an index holding it, for a new session and for a session whose previous chain was the same
less one turn (only the new blocks are linked), and a ``walk`` of it on one node.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import deque
from hashlib import blake2b

from shared.contracts.kv import (
    KV_ENCODINGS,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEncoding,
    KVEvent,
    KVEventBatch,
    decode_kv_batch,
    encode_kv_batch,
)
from shared.core.blockkeys import chain_keys
from shared.core.kvindex import KvIndex

BLOCK = 16
SYSTEM_BLOCKS = 64
TURN_BLOCKS = 32  # a turn's new blocks (~500 tokens of tool output and reply)


class Workload:
    """The simulated engine's event stream (see the module docstring)."""

    def __init__(self, seed: int, sessions: int, capacity: int, bytes_hashes: bool) -> None:
        self.rng = random.Random(seed)
        self.bytes_hashes = bytes_hashes
        self.capacity = capacity
        self.next_id = 1
        self.resident: deque[BlockHash] = deque()
        self.alive: set[BlockHash] = set()
        self.tokens: list[list[int]] = []
        self.last: list[BlockHash | None] = []
        system = [self.rng.randrange(50_000) for _ in range(SYSTEM_BLOCKS * BLOCK)]
        self.events: list[KVEvent] = [self._store(None, system)]
        sys_last = self.events[0].block_hashes[-1]  # type: ignore[union-attr]
        for _ in range(sessions):
            self.tokens.append(list(system))
            self.last.append(sys_last)

    def _hash(self) -> BlockHash:
        n = self.next_id
        self.next_id += 1
        if self.bytes_hashes:
            return blake2b(n.to_bytes(8, "little"), digest_size=32).digest()
        return n * 0x9E3779B97F4A7C15 % (2**64)

    def _store(self, parent: BlockHash | None, tokens: list[int]) -> BlockStored:
        hashes = [self._hash() for _ in range(len(tokens) // BLOCK)]
        for h in hashes:
            self.resident.append(h)
            self.alive.add(h)
        return BlockStored(hashes, parent, tokens, BLOCK, None, "GPU", None)

    def generate(self, n_events: int, mix: str) -> list[KVEvent]:
        """``vllm``: per turn one prefill store of 1-16 blocks, then 1-8 one-block decode
        stores, and one hash per removal (vLLM's ``cache_full_blocks`` runs once per step and
        request; ``_maybe_evict_cached_block`` emits one ``BlockRemoved`` per block).
        ``bulk``: every store 1-16 blocks, every removal 1-16 hashes."""
        rng = self.rng
        out = self.events
        while len(out) < n_events:
            if len(self.resident) > self.capacity:
                k = min(rng.randint(1, 16) if mix == "bulk" else 1, len(self.resident))
                gone = [self.resident.popleft() for _ in range(k)]
                self.alive.difference_update(gone)
                out.append(BlockRemoved(gone, "GPU"))
                continue
            i = rng.randrange(len(self.tokens))
            runs = [rng.randint(1, 16)]
            if mix != "bulk":
                runs += [1] * rng.randint(1, 8)
            for blocks in runs:
                new = [rng.randrange(50_000) for _ in range(BLOCK * blocks)]
                self.tokens[i].extend(new)
                ev = self._store(self.last[i], new)
                self.last[i] = ev.block_hashes[-1]
                out.append(ev)
        return out[:n_events]


def batches(events: list[KVEvent], seed: int) -> list[KVEventBatch]:
    rng = random.Random(seed)
    out: list[KVEventBatch] = []
    i = 0
    ts = 1_767_225_600.0
    while i < len(events):
        k = rng.randint(1, 32)
        out.append(KVEventBatch(ts=ts, events=events[i : i + k], data_parallel_rank=0))
        ts += 0.01
        i += k
    return out


def register_all(index: KvIndex, work: Workload) -> None:
    for i, tokens in enumerate(work.tokens):
        index.register(f"s{i}", chain_keys(tokens, BLOCK), BLOCK, 0.0)


def run_once(payloads: list[bytes], work: Workload) -> tuple[float, KvIndex]:
    index = KvIndex()
    register_all(index, work)  # chains as the responses left them (not timed)
    apply, decode = index.apply, decode_kv_batch
    t0 = time.perf_counter()
    for seq, payload in enumerate(payloads):
        apply("n0", seq, decode(payload), 0.0)
    elapsed = time.perf_counter() - t0
    return elapsed, index


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--capacity", type=int, default=20_000, help="resident blocks before evicting")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    rows: list[str] = []
    for mix, encoding in [(m, e) for m in ("vllm", "bulk") for e in KV_ENCODINGS]:
        enc: KVEncoding = encoding
        work = Workload(args.seed, args.sessions, args.capacity, bytes_hashes=enc == "mapev")
        events = work.generate(args.events, mix)
        stored = sum(len(e.block_hashes) for e in events if isinstance(e, BlockStored))
        removed = sum(len(e.block_hashes) for e in events if isinstance(e, BlockRemoved))
        bs = batches(events, args.seed)
        payloads = [encode_kv_batch(b, enc) for b in bs]
        size = sum(len(p) for p in payloads)
        best = float("inf")
        for run in range(args.runs):
            elapsed, index = run_once(payloads, work)
            best = min(best, elapsed)
            print(f"{mix} {enc} run {run + 1}: {elapsed:.3f} s", file=sys.stderr)
        st = index.stats("n0")
        assert st is not None
        rows.append(
            f"| {mix} | {enc} | {len(events):,} | {len(bs):,} | {stored + removed:,} "
            f"| {size / 1e6:.1f} "
            f"| **{len(events) / best:,.0f}** | {(stored + removed) / best:,.0f} "
            f"| {best * 1e6 / len(events):.2f} | {st.blocks:,} | {st.orphans:,} |"
        )

    print(
        f"events {args.events:,}, sessions {args.sessions}, capacity {args.capacity:,} blocks, "
        f"block size {BLOCK}, best of {args.runs}; python {sys.version.split()[0]}, "
        f"pid {os.getpid()}\n"
    )
    print(
        "| mix | encoding | events | batches | blocks (stored+removed) | MB | events/s "
        "| blocks/s | µs/event | resident blocks at end | orphan runs |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row)

    print("\n| session walk (chain fully resident) | chain blocks | µs per call |")
    print("|---|---:|---:|")
    rng = random.Random(args.seed + 1)
    for blocks in (64, 512, 4096):
        tokens = [rng.randrange(50_000) for _ in range(blocks * BLOCK)]
        index = KvIndex()
        store = BlockStored(list(range(1, blocks + 1)), None, tokens, BLOCK, None, "GPU", None)
        index.apply("n0", 0, KVEventBatch(ts=0.0, events=[store]), 0.0)
        keys = chain_keys(tokens, BLOCK)
        reps = max(10, 20_000 // blocks)
        t0 = time.perf_counter()
        for r in range(reps):
            index.register(f"new{r}", keys, BLOCK, 0.0)
        reg = (time.perf_counter() - t0) / reps
        for r in range(reps):  # the same sessions one turn earlier (not timed)
            index.register(f"turn{r}", keys[:-TURN_BLOCKS], BLOCK, 0.0)
        t0 = time.perf_counter()
        for r in range(reps):
            index.register(f"turn{r}", keys, BLOCK, 1.0)
        turn = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            assert index.walk("n0", keys) == blocks
        walk = (time.perf_counter() - t0) / reps
        t0 = time.perf_counter()
        for _ in range(reps):
            chain_keys(tokens, BLOCK)
        hashing = (time.perf_counter() - t0) / reps
        print(
            f"| register (a new session's chain, walk on 1 node) | {blocks:,} | {reg * 1e6:,.1f} |"
        )
        print(
            f"| register (the session's next turn: +{TURN_BLOCKS} blocks) | {blocks:,} "
            f"| {turn * 1e6:,.1f} |"
        )
        print(f"| walk (`tao inspect prefix`, 1 node) | {blocks:,} | {walk * 1e6:,.1f} |")
        print(f"| chain_keys (own keys of the token ids) | {blocks:,} | {hashing * 1e6:,.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
