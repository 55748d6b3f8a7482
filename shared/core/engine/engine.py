"""A vLLM-v1-like serving engine model: continuous batching, chunked prefill, prefix cache.

Scheduling (after vLLM ``v1/core/sched/scheduler.py``; one call of :meth:`Engine._step` is one
``schedule()`` + one forward pass):

1. Running requests, in admission order, each get ``min(tokens not yet computed, budget)`` new
   tokens (1 for a decode) out of the step's ``max_batched_tokens`` budget. If a request's new
   tokens need a block and none is free, the most recently admitted running request is preempted
   (recompute: its blocks are freed, it goes to the front of the waiting queue) until the
   allocation fits or the request itself was preempted.
2. If nobody was preempted, waiting requests are admitted FCFS while ``max_num_seqs``, the
   token budget and free blocks allow: their longest cached prefix of full blocks (never the
   last known token) is reused, the rest is a prefill chunk. The head blocks the queue.
3. The step takes :func:`~.profiles.step_time` of its prefill chunks and decodes. A request
   whose known tokens are all computed at the step's end samples one token then; the first
   one sets ``first_token_at``; at ``max_tokens`` tokens it finishes and frees its blocks.

Time: a step that *starts* at or before ``now`` is committed by ``advance(now)`` (its end may
lie after ``now``); a request submitted while a step is in flight joins the next one.

Closed form: while every running request is decoding and no waiting request can be admitted,
steps differ only in their context sum, so :meth:`Engine._try_run` commits a whole run of
them at once, up to the next finish, the first step whose new blocks would not fit (there the
general step preempts), or ``now``. Its cost is per request and per block boundary, plus one
float addition per step (done exactly as single steps do, so both give identical times).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Final

import numpy as np

from shared.contracts.kv import KVEvent
from shared.core.engine.cache import ROOT_HASH, BlockPool, chain_hash
from shared.core.engine.host import HostCache
from shared.core.engine.profiles import Profile, step_time
from shared.core.engine.requests import (
    OUTPUT_VOCAB,
    Completion,
    EngineRequest,
    ReqState,
    generated_token_ids,
)
from shared.core.tiers import HostLink

__all__ = ["OUTPUT_VOCAB", "Completion", "Engine", "EngineRequest", "generated_token_ids"]

_MASK64: Final = (1 << 64) - 1

_NO_HASHES: Final = np.empty(0, dtype=np.uint64)

_MEMO_SESSIONS: Final = 4096
"""Sessions whose last token sequence and block hashes are remembered to hash new turns fast."""


class Engine:
    """One node's engine; pure and deterministic: every call takes the virtual time ``now``."""

    def __init__(
        self,
        node_id: str,
        profile: Profile,
        *,
        emit_kv_events: bool = False,
        closed_form: bool = True,
        host: HostLink | None = None,
    ) -> None:
        self.node_id = node_id
        self.profile = profile
        self.block_size = profile.block_size
        self.num_gpu_blocks = profile.num_gpu_blocks
        self.closed_form = closed_form
        self._pool = BlockPool(self.num_gpu_blocks, self.block_size, emit_kv_events=emit_kv_events)
        self._emit = emit_kv_events
        self._host = None if host is None else HostCache(host, emit_kv_events=emit_kv_events)
        """The host KV tier (vLLM's OffloadingConnector, :mod:`.host`), or ``None``."""
        self._loading: list[tuple[float, ReqState, int, int]] = []
        """Requests admitted with a host hit, waiting for its load: (copy end, request, first
        and end block of the load), in copy-end order (the loads are one FIFO)."""
        self._host_memo: tuple[ReqState, int, int, int, int] | None = None
        """(request, host generation, start, limit, end) of the last host hit walk."""
        self.host_hit_tokens = 0
        """Prompt tokens loaded from the host tier (vLLM's ``external_prefix_cache_hits``)."""
        self._waiting: deque[ReqState] = deque()
        self._running: list[ReqState] = []
        self._by_id: dict[str, ReqState] = {}
        self._done: list[Completion] = []
        self._memo: OrderedDict[str, tuple[list[int], np.ndarray, int]] = OrderedDict()
        """Per session: the last finished turn's tokens and ``(hashes, count)``."""
        self._hit_memo: tuple[ReqState, int, int, np.ndarray, int, int, int] | None = None
        """(request, pool generation, limit, hit blocks, hit length, evictable, evicted) of
        the last :meth:`_hits` answer."""
        self._clock = 0.0
        self._now = -math.inf
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.num_preemptions = 0
        self.steps = 0

    # -- observable state ------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Requests admitted and holding blocks."""
        return len(self._running)

    @property
    def running_sessions(self) -> frozenset[str]:
        """The sessions whose requests are admitted and hold blocks."""
        return frozenset(r.session_id for r in self._running)

    @property
    def waiting(self) -> int:
        """Requests queued (new or preempted, or waiting for a host-tier load: vLLM counts
        ``WAITING_FOR_REMOTE_KVS`` requests as waiting)."""
        return len(self._waiting) + len(self._loading)

    @property
    def host(self) -> HostCache | None:
        """The host KV tier (read-only use), or ``None``."""
        return self._host

    def host_resident_blocks(
        self, hashes: Sequence[int] | np.ndarray, stop: int, start: int = 0
    ) -> int:
        """Leading blocks of the chain ``hashes[:stop]`` ready in the host tier now (0 without
        one). ``start``: blocks the caller knows are ready (an earlier answer with the host's
        ``evicted`` unchanged since); the walk begins there."""
        host = self._host
        if host is None:
            return 0
        if self._now > -math.inf:
            host.complete(self._now)
        stop = min(stop, len(hashes))
        return host.run(hashes, min(start, stop), stop)

    @property
    def kv_usage(self) -> float:
        """Fraction of blocks held by requests (vLLM ``kv_cache_usage_perc``: free cached
        blocks count as free)."""
        return 1.0 - self._pool.num_free / self.num_gpu_blocks

    @property
    def kv_cached_blocks(self) -> int:
        """Blocks resident in the prefix cache (held by requests or free but not yet evicted)."""
        return self._pool.num_cached

    @property
    def evicted_blocks(self) -> int:
        """Blocks un-cached (evicted) so far; monotone. While it stays the same, every block
        that was resident is still resident, so a caller's resident-prefix answers stay lower
        bounds (see :meth:`resident_blocks`)."""
        return self._pool.evicted

    def evicted_since(self, mark: int) -> list[int] | None:
        """Block hashes evicted since :attr:`evicted_blocks` was ``mark``, oldest first, or
        ``None`` if that is too far back (the engine keeps the recent ones only)."""
        return self._pool.evicted_since(mark)

    @property
    def pool(self) -> BlockPool:
        """The block pool (read-only use: tests and diagnostics)."""
        return self._pool

    # -- API ---------------------------------------------------------------------------------------

    def submit(self, req: EngineRequest, now: float) -> None:
        """Queue ``req`` at ``now`` (FCFS); ``ValueError`` if it is malformed or can never fit."""
        if req.id in self._by_id:
            raise ValueError(f"request {req.id!r} is already in the engine")
        if not req.prompt:
            raise ValueError(f"request {req.id!r}: empty prompt")
        if req.max_tokens < 1:
            raise ValueError(f"request {req.id!r}: max_tokens must be >= 1, got {req.max_tokens}")
        output = req.output
        if output is None:
            output = generated_token_ids(req.id, req.max_tokens)
        elif len(output) != req.max_tokens:
            raise ValueError(
                f"request {req.id!r}: scripted output has {len(output)} tokens, "
                f"max_tokens is {req.max_tokens}"
            )
        need = len(req.prompt) + req.max_tokens
        if need > self.num_gpu_blocks * self.block_size:
            raise ValueError(
                f"request {req.id!r}: prompt + max_tokens = {need} tokens can never fit in "
                f"{self.num_gpu_blocks * self.block_size} KV tokens"
            )
        self._run_until(now)
        r = ReqState(req, output, now, self.block_size)
        self._seed_hashes(r)
        if not self._running and not self._waiting and not self._loading:
            self._clock = max(self._clock, now)
        self._by_id[r.id] = r
        self._waiting.append(r)

    def abort(self, request_id: str, now: float) -> None:
        """Drop ``request_id`` (client went away): free its blocks; unknown ids are ignored."""
        self._run_until(now)
        r = self._by_id.pop(request_id, None)
        if r is None:
            self._done = [c for c in self._done if c.request_id != request_id]
            return
        if r in self._running:
            self._running.remove(r)
        elif r in self._waiting:
            self._waiting.remove(r)
        else:
            load = next(x for x in self._loading if x[1] is r)
            self._loading.remove(load)
            assert self._host is not None
            self._host.unpin(r.hashes[load[2] : load[3]])
        self._pool.release_arr(r.blocks, r.nblocks)
        r.nblocks = 0

    def advance(self, now: float) -> list[Completion]:
        """Run up to ``now``; the requests finished at or before ``now``, in finishing order.

        ``now = math.inf`` runs until idle; the engine's time is then the last step's end."""
        self._run_until(now)
        ready = [c for c in self._done if c.finished_at <= now]
        if ready:
            self._done = [c for c in self._done if c.finished_at > now]
        return ready

    def next_event_time(self) -> float | None:
        """Earliest time after which a completion or a first token may be observed; ``None`` when
        idle. May be early (nothing observable then), never late."""
        cands = [c.finished_at for c in self._done]
        cands.extend(
            r.first_token_at
            for r in self._running
            if r.first_token_at is not None and r.first_token_at > self._now
        )
        if self._running or self._waiting or self._loading:
            cands.append(self._horizon())
        return min(cands) if cands else None

    def progress(self, request_id: str, now: float) -> tuple[int, float | None]:
        """(output tokens produced by ``now``, first-token time or ``None``) of a request not yet
        returned by :meth:`advance`; ``KeyError`` for an unknown one."""
        self._run_until(now)
        r = self._by_id.get(request_id)
        if r is not None:
            n = r.generated - (1 if r.last_token_at > now else 0)
            first = r.first_token_at
            return n, first if first is not None and first <= now else None
        for c in self._done:
            if c.request_id == request_id:
                n = c.completion_tokens - (1 if c.finished_at > now else 0)
                return n, c.first_token_at if c.first_token_at <= now else None
        raise KeyError(f"unknown request {request_id!r}")

    def resident_prefix(self, tokens: Sequence[int], session_id: str | None = None) -> int:
        """Leading tokens of ``tokens`` resident in the cache now (whole blocks). With
        ``session_id`` the session's remembered hashes are reused (faster, same answer)."""
        bs = self.block_size
        full = len(tokens) // bs
        n = 0
        parent = ROOT_HASH
        if session_id is not None:
            mh, m = self._memo_prefix(session_id, tokens)
            m = min(m, full)
            if m:
                n = self._pool.resident_run(mh, 0, m)
                if n < m:
                    return n * bs
                parent = int(mh[m - 1])
        for j in range(n, full):
            h = chain_hash(parent, tokens[j * bs : j * bs + bs])
            if self._pool.lookup(h) is None:
                break
            parent = h
            n += 1
        return n * bs

    def resident_blocks(self, hashes: Sequence[int], stop: int, start: int = 0) -> int:
        """Leading blocks of the chain ``hashes[:stop]`` (block hashes as :func:`chain_hash`
        chains them from ``ROOT_HASH``) resident now. ``start``: blocks the caller knows are
        resident (an earlier answer with :attr:`evicted_blocks` unchanged since); the walk
        begins there."""
        return self._pool.resident_run(hashes, min(start, stop), stop)

    def drain_kv_events(self) -> list[KVEvent]:
        """``BlockStored``/``BlockRemoved``/``AllBlocksCleared`` events since the last drain
        (with emit_kv_events); a ``BlockStored`` carries its block's ``token_ids``. The host
        tier's (medium ``"CPU"``) follow the GPU's, as in vLLM's batch (docs/kv-tier.md §4)."""
        events = self._pool.drain_events()
        if self._host is not None:
            events.extend(self._host.drain_events())
        return events

    def reset_prefix_cache(self, now: float) -> bool:
        """Drop the whole prefix cache at ``now`` (vLLM ``reset_prefix_cache``); ``False``, and
        nothing changes, while a running request holds blocks."""
        self._run_until(now)
        if not self._pool.reset_cache():
            return False
        self._hit_memo = None
        return True

    # -- hashing -----------------------------------------------------------------------------------

    def _memo_prefix(self, session_id: str, tokens: Sequence[int]) -> tuple[np.ndarray, int]:
        """Remembered block hashes of the session and how many of them are valid for
        ``tokens``."""
        memo = self._memo.get(session_id)
        if memo is None:
            return _NO_HASHES, 0
        mt, mh, mn = memo
        bs = self.block_size
        n = min(mn, len(tokens) // bs)
        head = tokens[: n * bs]
        if not isinstance(head, list):
            head = list(head)
        if head == mt[: n * bs]:
            return mh, n
        lo, hi = 0, n  # largest j with equal first j blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if head[: mid * bs] == mt[: mid * bs]:
                lo = mid
            else:
                hi = mid - 1
        return mh, lo

    def _seed_hashes(self, r: ReqState) -> None:
        mh, n = self._memo_prefix(r.session_id, r.tokens)
        if n:
            r.hashes[:n] = mh[:n]
        r.nhashes = n

    def _remember(self, r: ReqState) -> None:
        self._memo[r.session_id] = (r.tokens, r.hashes, r.nhashes)
        self._memo.move_to_end(r.session_id)
        if len(self._memo) > _MEMO_SESSIONS:
            self._memo.popitem(last=False)

    def _hash_upto(self, r: ReqState, nblocks: int) -> None:
        have = r.nhashes
        if have >= nblocks:
            return
        hs = r.hashes
        bs = self.block_size
        toks = r.tokens
        parent = int(hs[have - 1]) if have else ROOT_HASH
        if nblocks - have == 1:  # the decode path
            hs[have] = hash((parent, *toks[have * bs : have * bs + bs])) & _MASK64
        else:
            mask = _MASK64
            new: list[int] = []
            for j in range(have, nblocks):
                parent = hash((parent, *toks[j * bs : j * bs + bs])) & mask  # == chain_hash
                new.append(parent)
            hs[have:nblocks] = new
        r.nhashes = nblocks

    def _cache_upto(self, r: ReqState, ntokens: int) -> None:
        """Offer the request's blocks that are full within its first ``ntokens`` to the cache."""
        nfull = ntokens // self.block_size
        if nfull <= r.num_cached_blocks:
            return
        self._hash_upto(r, nfull)
        j = r.num_cached_blocks
        parent = int(r.hashes[j - 1]) if j and self._emit else ROOT_HASH  # events only
        self._pool.cache_arr(r.blocks, r.hashes, j, nfull, parent, r.tokens)
        r.num_cached_blocks = nfull

    # -- scheduling --------------------------------------------------------------------------------

    def _hits(self, r: ReqState) -> tuple[np.ndarray, int, int]:
        """Cached blocks of ``r``'s longest prefix hit (``blocks[:n]``, ``n``), never covering
        its last known token, and how many of them are free (evictable). Remembered for the
        last request asked until the pool changes (its generation) or the request's length
        does: the waiting head is asked again by every step and every decode-run check while
        it is blocked."""
        limit = (r.num_tokens - 1) // self.block_size
        pool = self._pool
        memo = self._hit_memo
        start = 0
        buf: np.ndarray | None = None
        if memo is not None and memo[0] is r and memo[2] == limit:
            if memo[1] == pool.generation:
                return memo[3], memo[4], memo[5]
            buf = memo[3]
            if memo[6] == pool.evicted:  # nothing un-cached since: the old hit still holds
                start = memo[4]
        if buf is None:
            buf = np.empty(limit, dtype=np.int64)
        self._hash_upto(r, limit)
        nhit = pool.hit_arr(r.hashes, start, limit, buf)
        evictable = pool.count_free_arr(buf, nhit)
        self._hit_memo = (r, pool.generation, limit, buf, nhit, evictable, pool.evicted)
        return buf, nhit, evictable

    def _admit_plan(self, r: ReqState, budget: int) -> tuple[np.ndarray, int, int, int, int] | None:
        """(hit blocks, hit length, new tokens, new blocks, host hit end) if ``r`` can be
        admitted now, else ``None``. A host hit (end > hit length) is a load: the request
        takes blocks for the GPU and host hits and computes nothing until the load ends."""
        hit, nhit, evictable = self._hits(r)
        if self._host is not None:
            end = self._host_run(r, nhit)
            if end > nhit:
                need = end - nhit
                if need + evictable > self._pool.num_free:
                    return None
                return hit, nhit, 0, need, end
        hit_tokens = nhit * self.block_size
        n = min(r.num_tokens - hit_tokens, budget)
        need = -(-(hit_tokens + n) // self.block_size) - nhit
        if need + evictable > self._pool.num_free:
            return None
        return hit, nhit, n, need, nhit

    def _host_run(self, r: ReqState, start: int) -> int:
        """End of ``r``'s host hit from block ``start`` (its GPU hit) on, never covering its
        last known token; remembered until the host or the request changes."""
        host = self._host
        assert host is not None
        limit = (r.num_tokens - 1) // self.block_size
        memo = self._host_memo
        if (
            memo is not None
            and memo[0] is r
            and memo[1] == host.generation
            and memo[2] == start
            and memo[3] == limit
        ):
            return memo[4]
        self._hash_upto(r, limit)
        end = host.run(r.hashes, start, limit)
        self._host_memo = (r, host.generation, start, limit, end)
        return end

    def _admissible(self, budget: int) -> bool:
        return (
            bool(self._waiting)
            and len(self._running) + len(self._loading) < self.profile.max_num_seqs
            and budget > 0
            and self._admit_plan(self._waiting[0], budget) is not None
        )

    def _allocate(self, r: ReqState, ntokens: int) -> bool:
        need = -(-ntokens // self.block_size) - r.nblocks
        if need > 0:
            if need > self._pool.num_free:
                return False
            self._pool.allocate_into(r.blocks, r.nblocks, need)
            r.nblocks += need
        self._cache_upto(r, ntokens)
        return True

    def _preempt(self, r: ReqState) -> None:
        self._pool.release_arr(r.blocks, r.nblocks)
        r.nblocks = 0
        r.num_computed = 0
        r.num_cached_blocks = 0
        self._waiting.appendleft(r)
        self.num_preemptions += 1

    def _finish(self, r: ReqState, t: float) -> None:
        self._pool.release_arr(r.blocks, r.nblocks)
        r.nblocks = 0
        if self._host is not None:  # its prompt blocks are re-ranked, head most recent
            self._host.touch(r.hashes[: min(r.nhashes, r.prompt_len // self.block_size)])
        del self._by_id[r.id]
        self._remember(r)
        first = r.first_token_at if r.first_token_at is not None else t
        self._done.append(
            Completion(
                request_id=r.id,
                session_id=r.session_id,
                arrived_at=r.arrived_at,
                first_token_at=first,
                finished_at=t,
                prompt_tokens=r.prompt_len,
                cached_tokens=max(r.cached_tokens, 0),
                completion_tokens=r.generated,
                output=tuple(r.tokens[r.prompt_len :]),
            )
        )

    def _run_until(self, now: float) -> None:
        if math.isnan(now):
            raise ValueError("now: must not be NaN")
        if now < self._now:
            raise ValueError(f"now: time went backwards ({now} < {self._now})")
        self._now = now
        while (self._running or self._waiting or self._loading) and self._clock <= now:
            if not (self.closed_form and self._try_run(now)):
                self._step()
        if now == math.inf:  # ran to idle: time stands at the last step's end
            self._now = self._clock
        if self._host is not None:
            self._host.complete(self._now)

    def _step(self) -> None:
        """Schedule and run one step starting at ``self._clock``."""
        p = self.profile
        pool = self._pool
        budget = p.max_batched_tokens
        sched: list[tuple[ReqState, int]] = []
        host = self._host
        if host is not None:
            host.complete(self._clock)
            if self._loading and self._loading[0][0] <= self._clock:
                self._promote_loads()
        loads: list[tuple[ReqState, int, int]] = []
        running = self._running
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.num_tokens - r.num_computed, budget)
            lost = False
            while not self._allocate(r, r.num_computed + n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    lost = True
                    break
            if lost:
                break
            sched.append((r, n))
            budget -= n
            i += 1
        if not preempted:
            while (
                self._waiting
                and len(running) + len(self._loading) + len(loads) < p.max_num_seqs
                and budget > 0
            ):
                r = self._waiting[0]
                plan = self._admit_plan(r, budget)
                if plan is None:
                    break
                hit, nhit, n, need, hend = plan
                self._waiting.popleft()
                blocks = r.blocks
                blocks[:nhit] = hit[:nhit]
                pool.touch_arr(blocks, nhit)
                pool.allocate_into(blocks, nhit, need)
                r.nblocks = nhit + need
                r.num_computed = nhit * self.block_size
                r.num_cached_blocks = nhit
                if r.cached_tokens < 0:
                    r.cached_tokens = max(nhit, hend) * self.block_size
                    self.prefix_cache_queries += r.prompt_len
                    self.prefix_cache_hits += r.num_computed
                    self.host_hit_tokens += (hend - nhit) * self.block_size
                if hend > nhit:  # a host hit: loaded after this step's forward (_promote_loads)
                    loads.append((r, nhit, hend))
                    continue
                self._cache_upto(r, r.num_computed + n)
                running.append(r)
                sched.append((r, n))
                budget -= n
        end = self._clock + (self._step_cost(sched) if sched else 0.0)
        if loads:  # each copy starts after this step's forward
            assert host is not None
            for r, lo, hi in loads:
                done = host.load(r.hashes[lo:hi], end)
                self._loading.append((done, r, lo, hi))
        if not sched:
            if preempted:
                return
            if self._loading:  # nothing to run until a load ends
                self._clock = max(self._clock, self._loading[0][0])
                return
            raise RuntimeError("engine made no progress (scheduler invariant broken)")
        finished = False
        for r, n in sched:
            if host is not None:  # write-through: its full prompt blocks, from the next step
                self._offer_host(r, min(r.num_computed + n, r.prompt_len), end)
            r.num_computed += n
            if r.num_computed == r.num_tokens:
                r.generated += 1
                r.last_token_at = end
                self.generation_tokens_total += 1
                if r.first_token_at is None:
                    r.first_token_at = end
                if r.generated == r.max_tokens:
                    self._finish(r, end)
                    finished = True
        if finished:
            self._running = [r for r in running if r.id in self._by_id]
        self._clock = end
        self.steps += 1

    def _step_cost(self, sched: list[tuple[ReqState, int]]) -> float:
        """Seconds of the forward pass that runs ``sched``; its prefill tokens are added to
        :attr:`prompt_tokens_total`."""
        chunks: list[tuple[int, int]] = []
        batch = 0
        context = 0
        for r, n in sched:
            if n == 1 and r.generated > 0 and r.num_computed == r.num_tokens - 1:
                batch += 1
                context += r.num_computed + 1
            else:
                chunks.append((n, r.num_computed))
                self.prompt_tokens_total += n
        return step_time(self.profile, tuple(chunks), batch, context)

    def _offer_host(self, r: ReqState, ntokens: int, at: float) -> None:
        """Offer ``r``'s full blocks within its first ``ntokens`` to the host tier, the copy
        starting at ``at``; not advanced when the host had no room (offered again next step)."""
        nfull = ntokens // self.block_size
        if nfull <= r.host_next:
            return
        assert self._host is not None
        self._hash_upto(r, nfull)
        if self._host.offer(r.hashes[r.host_next : nfull], at):
            r.host_next = nfull

    def _promote_loads(self) -> None:
        """Requests whose host load ended by this step's start: their loaded blocks enter the GPU
        prefix cache (announced on the GPU, as vLLM's ``cache_blocks`` after the load) and they
        run from the next chunk of their prompt."""
        host = self._host
        assert host is not None
        loading = self._loading
        i = 0
        while i < len(loading) and loading[i][0] <= self._clock:
            _, r, lo, hi = loading[i]
            host.unpin(r.hashes[lo:hi])
            r.num_computed = hi * self.block_size
            self._cache_upto(r, r.num_computed)
            r.host_next = max(r.host_next, hi)
            self._running.append(r)
            i += 1
        del loading[:i]

    def _decode_run(self, budget_ok: bool = True) -> tuple[int, int, int] | None:
        """(run length limit, batch, context) if the next steps are a pure decode run."""
        running = self._running
        if not running or len(running) > self.profile.max_batched_tokens:
            return None
        for r in running:
            if r.generated == 0 or r.num_computed != r.num_tokens - 1:
                return None
        batch = len(running)
        if budget_ok and self._admissible(self.profile.max_batched_tokens - batch):
            return None
        bs = self.block_size
        n = min(r.max_tokens - r.generated for r in running)
        n = self._stop_before_new_hit(n, self.profile.max_batched_tokens - batch)
        k0 = [bs * r.nblocks - r.num_computed for r in running]
        free = self._pool.num_free

        def allocs(m: int) -> int:
            return sum((m - k + bs - 1) // bs for k in k0 if m > k)

        if allocs(n) > free:
            lo, hi = 0, n
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if allocs(mid) <= free:
                    lo = mid
                else:
                    hi = mid - 1
            n = lo
        context = sum(r.num_computed + 1 for r in running)
        return n, batch, context

    def _stop_before_new_hit(self, n: int, budget: int) -> int:
        """Shorten a run of ``n`` steps so that it ends before a running request caches the block
        that would extend the blocked waiting head's prefix hit (it might then fit)."""
        if not self._waiting or len(self._running) >= self.profile.max_num_seqs or budget <= 0:
            return n
        head = self._waiting[0]
        bs = self.block_size
        hit = self._hits(head)[1]
        if hit >= (head.num_tokens - 1) // bs:
            return n
        missing = head.hashes[hit]
        for r in self._running:
            j = r.num_computed // bs + 1  # next block count to become full
            s = bs * j - 1 - r.num_computed  # the step after which block j-1 is full
            if s >= n:
                continue
            # blocks j-1, j, ... become full after steps s, s + bs, ... (< n). A chain hash
            # names its position (each block's hash covers its parent's), so only block `hit`
            # can equal the head's missing one: other requests are not even hashed.
            count = (n - s + bs - 1) // bs
            if not j - 1 <= hit < j - 1 + count:
                continue
            self._hash_upto(r, hit + 1)
            if r.hashes[hit] == missing:
                n = s + (hit - (j - 1)) * bs
        return n

    def _horizon(self) -> float:
        """Conservative time of the next observable change after the committed steps."""
        run = self._decode_run()
        if run is None or run[0] == 0:
            return self._clock
        n, batch, context = run
        # Sum of the n steps in closed form (the context grows by `batch` per step), shaded a
        # little early so float rounding can never make it late.
        p = self.profile
        total = n * step_time(p, (), batch, context) + p.decode_e * batch * n * (n - 1) / 2
        end = self._clock + total * (1.0 - 1e-9)
        if self._loading:  # a load that ends by the next step's start joins that step
            return min(end, max(self._loading[0][0], self._clock))
        return end

    def _try_run(self, now: float) -> bool:
        """Commit a run of identical decode steps starting at ``self._clock``; False if none."""
        run = self._decode_run()
        if run is None or run[0] == 0:
            return False
        n, batch, context = run
        p = self.profile
        t = self._clock
        stop = self._loading[0][0] if self._loading else math.inf  # a load ends: a general step
        k = 0
        while k < n and t <= now and t < stop:
            t += step_time(p, (), batch, context + k * batch)
            k += 1
        if k == 0:
            return False
        self._apply_run(k, t)
        return True

    def _apply_run(self, k: int, end: float) -> None:
        """Apply ``k`` decode steps to every running request; the last one ends at ``end``."""
        bs = self.block_size
        running = self._running
        events: list[tuple[int, int, int, int]] = []
        for i, r in enumerate(running):
            s = bs * r.nblocks - r.num_computed
            while s < k:
                events.append((s, i, 0, 0))
                s += bs
            j = (r.num_computed + 1 + bs - 1) // bs  # first block not yet full after step 0's KV
            s = bs * j - 1 - r.num_computed
            while s < k:
                events.append((s, i, 1, j))
                j += 1
                s += bs
        events.sort()
        pool = self._pool
        for _s, i, kind, j in events:
            r = running[i]
            if kind == 0:
                pool.allocate_into(r.blocks, r.nblocks, 1)
                r.nblocks += 1
            else:
                self._cache_upto(r, j * bs)
        finished = False
        for r in running:
            r.num_computed += k
            r.generated += k
            r.last_token_at = end
            if r.generated == r.max_tokens:
                self._finish(r, end)
                finished = True
        if finished:
            self._running = [r for r in running if r.id in self._by_id]
        self.generation_tokens_total += k * len(running)
        self._clock = end
        self.steps += k
