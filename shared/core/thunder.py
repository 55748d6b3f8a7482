"""ThunderAgent's TR scheduler as its code runs it: one state machine, events in, moves out.

The full account: docs/internals.md, section ``shared/core/thunder.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Final, Literal

__all__ = [
    "BUFFER_PER_PROGRAM",
    "DECAY",
    "DECAY_HALF_LIFE_S",
    "FAITHFUL",
    "IDEAL",
    "SCHEDULER_INTERVAL_S",
    "VARIANTS",
    "WAIT_TIMEOUT_S",
    "Check",
    "Program",
    "ThunderAgent",
    "Variant",
    "variant_for",
]

BUFFER_PER_PROGRAM: Final = 100
"""state.py:23: tokens counted per active program for decode headroom."""
SCHEDULER_INTERVAL_S: Final = 5.0
"""router.py:65: seconds between periodic checks (``--scheduler-interval``)."""
WAIT_TIMEOUT_S: Final = 1800.0
"""router.py:846: seconds a blocked request waits before its program is force-resumed."""
DECAY_HALF_LIFE_S: Final = 1.0
"""state.py:207: with ``use_acting_token_decay`` an ACTING program's tokens weigh ``2 ** -t``,
``t`` its seconds in ACTING: a half-life of 1 s, fixed in the code (no option sets it)."""


@dataclass(frozen=True, slots=True)
class Variant:
    """``resume_on_event``: resume whenever a program waits, pauses or leaves (else only in
    the periodic check); ``mark_until_safe``: marks count as releasing their tokens in the
    pause loop (else the code's loop, which marks every REASONING program);
    ``shared_tokens``: each check sets a backend's ``shared_tokens`` from the engine's own
    KV usage (``update_shared_tokens``, state.py:126–133, which the released code never calls)
    so a prefix the engine holds once counts once; ``decay_half_life_s``: the resume's
    capacity weighs ACTING tokens by ``2 ** (-t / h)`` (``use_acting_token_decay``,
    config.py:29; None: off)."""

    name: str
    resume_on_event: bool
    mark_until_safe: bool
    interval_s: float = SCHEDULER_INTERVAL_S
    acting_weight: float = 1.0
    shared_tokens: bool = False
    decay_half_life_s: float | None = None


FAITHFUL: Final = Variant("thunderagent", resume_on_event=False, mark_until_safe=False)
IDEAL: Final = Variant(
    "thunderagent-ideal", resume_on_event=True, mark_until_safe=True, shared_tokens=True
)
DECAY: Final = Variant("thunderagent-decay", False, False, decay_half_life_s=DECAY_HALF_LIFE_S)
"""The released code run with ``--use-acting-token-decay`` (__main__.py:32–33)."""
VARIANTS: Final[dict[str, Variant]] = {v.name: v for v in (FAITHFUL, IDEAL, DECAY)}
"""Every ThunderAgent policy name and its variant."""


def variant_for(
    policy: str,
    interval_s: float = SCHEDULER_INTERVAL_S,
    decay_half_life_s: float | None = None,
) -> Variant:
    """The variant a policy name runs (a key of :data:`VARIANTS`), with its check every
    ``interval_s``; ``decay_half_life_s`` overrides the decay's half-life of a decaying
    variant (a sweep; the code's is :data:`DECAY_HALF_LIFE_S`)."""
    v = VARIANTS.get(policy)
    if v is None:
        raise ValueError(f"policy: not a ThunderAgent variant: {policy!r}")
    if not interval_s > 0:
        raise ValueError(f"interval_s: must be > 0, got {interval_s}")
    v = replace(v, interval_s=interval_s)
    if decay_half_life_s is not None and v.decay_half_life_s is not None:
        if not decay_half_life_s > 0:
            raise ValueError(f"decay_half_life_s: must be > 0, got {decay_half_life_s}")
        v = replace(v, decay_half_life_s=decay_half_life_s)
    return v


@dataclass(slots=True)
class Program:
    """program.py:33–47: ``status`` REASONING / ACTING, ``state`` ACTIVE / PAUSED."""

    id: str
    backend: str | None = None
    origin: str | None = None
    status: Literal["reasoning", "acting"] = "reasoning"
    paused: bool = False
    tokens: int = 0
    steps: int = 0
    marked: bool = False
    blocked: bool = False
    """A request is blocked waiting for its program's resume (``waiting_event`` awaited)."""
    paused_tokens: int = 0
    """``PausedInfo.total_tokens``: the tokens when it was queued (the resume order's key)."""
    queued_at: int = 0
    """Insertion order into the global queue (``dict`` order, router.py:485)."""
    acting_since: float | None = None
    """program.py:47: when it turned ACTING (router.py:391); None while REASONING
    (router.py:331–371). Kept through a pause and resume."""


@dataclass(frozen=True, slots=True)
class Check:
    """What one resume / pause pass did: ``resumed`` (program, backend) in placement order,
    ``paused`` ACTING programs taken off their backend, ``marked`` REASONING programs marked."""

    resumed: tuple[tuple[str, str], ...] = ()
    paused: tuple[str, ...] = ()
    marked: tuple[str, ...] = ()


@dataclass(slots=True)
class ThunderAgent:
    """The router's program and backend state (``MultiBackendRouter``); see the module doc."""

    capacity: dict[str, int]
    variant: Variant = FAITHFUL
    healthy: dict[str, bool] = field(default_factory=dict)
    programs: dict[str, Program] = field(default_factory=dict)
    queue: dict[str, None] = field(default_factory=dict)
    """The global waiting queue's program ids, in insertion order (router.py:93)."""
    shared: dict[str, int] = field(default_factory=dict)
    """``BackendState.shared_tokens`` per backend (state.py:54; 0 unless ``shared_tokens``)."""
    _seq: int = 0

    # -- accounting ----------------------------------------------------------------------

    def _on(self, backend: str) -> list[Program]:
        return [p for p in self.programs.values() if p.backend == backend and not p.paused]

    def active_tokens(self, backend: str) -> float:
        """state.py:101–104: REASONING tokens + w × ACTING tokens."""
        w = self.variant.acting_weight
        return sum(p.tokens if p.status == "reasoning" else w * p.tokens for p in self._on(backend))

    def remaining(self, backend: str) -> float:
        """state.py:182–191: ``capacity − (int(active) − shared + 100 × programs)``."""
        progs = self._on(backend)
        w = self.variant.acting_weight
        used = sum(p.tokens if p.status == "reasoning" else w * p.tokens for p in progs)
        held = int(used) - self.shared.get(backend, 0) + BUFFER_PER_PROGRAM * len(progs)
        return self.capacity[backend] - held

    def remaining_decayed(self, backend: str, now: float) -> float:
        """state.py:193–211: as :meth:`remaining`, each ACTING program's tokens weighed
        ``2 ** (-t / h)`` (no acting weight; one with no ``acting_since`` weighs 0)."""
        h = self.variant.decay_half_life_s or DECAY_HALF_LIFE_S
        progs = self._on(backend)
        eff = 0.0
        for p in progs:
            if p.status == "reasoning":
                eff += p.tokens
            elif p.acting_since is not None:
                eff += p.tokens * 2.0 ** (-(now - p.acting_since) / h)
        held = int(eff) - self.shared.get(backend, 0) + BUFFER_PER_PROGRAM * len(progs)
        return self.capacity[backend] - held

    def observe_used(
        self,
        used: Mapping[str, int | None],
        holding: Mapping[str, Collection[str]] | None = None,
    ) -> None:
        """The engines' KV in use (``kv_cache_usage_perc × capacity``, tokens) per backend:
        ``shared_tokens = max(0, REASONING tokens − used)`` (state.py:126–133,
        vllm_metrics.py:294–311); ``None``: no measure, 0 (vllm_metrics.py:305–306). With
        ``holding`` (backend → the programs whose requests hold KV there) only those programs'
        tokens are summed: a request queued in the engine holds no block, and counting its
        program's tokens as shared over-admits (docs/evaluation.md, "Agents within an SLO").
        A no-op unless the variant has ``shared_tokens``."""
        if not self.variant.shared_tokens:
            return
        for b, u in used.items():
            if u is None:
                self.shared[b] = 0
                continue
            held = None if holding is None else holding.get(b, ())
            reasoning = sum(
                p.tokens
                for p in self._on(b)
                if p.status == "reasoning" and (held is None or p.id in held)
            )
            self.shared[b] = max(0, reasoning - int(u))

    def _healthy(self, backend: str) -> bool:
        return self.healthy.get(backend, True)

    # -- events ----------------------------------------------------------------------------

    def on_request(self, pid: str, tokens: int) -> str | None:
        """A request of ``pid`` with an estimated ``tokens``: the backend it goes to now, or
        ``None`` when it blocks until a resume (router.py:290–372)."""
        p = self.programs.get(pid)
        if p is None:
            p = self.programs[pid] = Program(pid)
        p.steps += 1
        p.tokens = tokens
        p.status = "reasoning"
        p.acting_since = None
        if p.paused:
            p.blocked = True
            return None
        if p.steps == 1 and p.backend is None:
            backend = self._direct(tokens)
            if backend is None:
                self._enqueue(p)
                p.blocked = True
                return None
            p.backend = backend
            return backend
        return p.backend

    def _direct(self, tokens: int) -> str | None:
        """router.py:249–281: a new program's backend, when the queue is empty and one fits."""
        if self.queue:
            return None
        best: str | None = None
        least = float("inf")
        for b in self.capacity:
            if not self._healthy(b) or self.remaining(b) < tokens + BUFFER_PER_PROGRAM:
                continue
            active = self.active_tokens(b)
            if active < least:
                best, least = b, active
        return best

    def on_response(self, pid: str, total_tokens: int, now: float = 0.0) -> bool:
        """The call ended at ``now`` with ``usage.total_tokens``: ACTING; a marked program is
        paused now (router.py:374–412). Returns whether it was paused."""
        p = self.programs[pid]
        p.status = "acting"
        p.acting_since = now
        p.tokens = total_tokens
        if p.marked:
            p.marked = False
            self._pause(p)
            return True
        return False

    def release(self, pid: str) -> None:
        """The program ended (router.py:428–461)."""
        p = self.programs.pop(pid, None)
        if p is not None:
            self.queue.pop(pid, None)

    def force(self, pid: str) -> str | None:
        """A request blocked ``WAIT_TIMEOUT_S``: resume regardless of capacity, on the origin
        backend or (a new program) the backend with the fewest programs (router.py:846–868,
        171–190). Returns the backend, or ``None`` when the program is no longer queued."""
        p = self.programs.get(pid)
        if p is None or not p.paused or pid not in self.queue:
            return None
        del self.queue[pid]
        target = p.origin if p.origin in self.capacity else None
        if target is None:
            counts = {b: 0 for b in self.capacity}
            for q in self.programs.values():
                if q.backend in counts:
                    counts[q.backend] += 1
            healthy = [b for b in self.capacity if self._healthy(b)] or list(self.capacity)
            target = min(healthy, key=lambda b: counts[b])
        self._resume(p, target)
        return target

    # -- the periodic check ----------------------------------------------------------------

    def check(
        self,
        now: float = 0.0,
        used: Mapping[str, int | None] | None = None,
        holding: Mapping[str, Collection[str]] | None = None,
    ) -> Check:
        """``_scheduled_check`` (router.py:671–683) at ``now``: fresh metrics (``used``, the
        engines' KV in use, sets ``shared_tokens`` under ``shared_tokens``, as the commits
        that called ``update_shared_tokens`` did after their fetch, d37e825b router.py:
        656–659; ``holding``: :meth:`observe_used`), then resume, then pause every over-full
        backend."""
        if used is not None:
            self.observe_used(used, holding)
        resumed = self.resume(now)
        paused: list[str] = []
        marked: list[str] = []
        for b in self.capacity:
            if self.remaining(b) < 0:
                pa, ma = self._pause_until_safe(b)
                paused += pa
                marked += ma
        return Check(resumed.resumed, tuple(paused), tuple(marked))

    def resume(self, now: float = 0.0) -> Check:
        """``_greedy_resume`` (router.py:719–844); with decay the backends' room is
        :meth:`remaining_decayed` (router.py:747–749)."""
        caps: list[tuple[str, int]] = []
        total = 0
        decay = self.variant.decay_half_life_s is not None
        for b in self.capacity:
            if not self._healthy(b):
                continue
            rem = int(self.remaining_decayed(b, now) if decay else self.remaining(b))
            if rem > BUFFER_PER_PROGRAM:
                caps.append((b, rem))
                total += rem
        if not caps or total <= 0 or not self.queue:
            return Check()
        queued = sorted(
            (self.programs[pid] for pid in self.queue if pid in self.programs),
            key=lambda p: p.paused_tokens,  # stable: ties keep queue order (router.py:505)
        )
        reasoning = [p for p in queued if p.steps != 1 and p.status == "reasoning"]
        new = [p for p in queued if p.steps == 1]
        acting = [p for p in queued if p.steps != 1 and p.status != "reasoning"]
        selected: list[Program] = []
        cumulative = 0
        for p in reasoning + new + acting:
            need = p.tokens + BUFFER_PER_PROGRAM
            if cumulative + need <= total:
                selected.append(p)
                cumulative += need
        if not selected:
            return Check()
        selected.sort(key=lambda p: -p.tokens)
        caps.sort(key=lambda x: -x[1])
        smallest = selected[-1].tokens + BUFFER_PER_PROGRAM
        out: list[tuple[str, str]] = []
        for p in selected:
            if not caps:
                break
            need = p.tokens + BUFFER_PER_PROGRAM
            if smallest > caps[0][1]:
                break
            if need > caps[0][1]:
                continue
            b, rem = caps[0]
            self.queue.pop(p.id, None)
            self._resume(p, b)
            out.append((p.id, b))
            left = rem - need
            if left > BUFFER_PER_PROGRAM:
                caps[0] = (b, left)
                caps.sort(key=lambda x: -x[1])
            else:
                caps.pop(0)
        return Check(resumed=tuple(out))

    def _pause_until_safe(self, b: str) -> tuple[list[str], list[str]]:
        """router.py:685–714; with ``mark_until_safe`` the marks' tokens count as released."""
        paused: list[str] = []
        marked: list[str] = []
        future = 0
        while self.remaining(b) + (future if self.variant.mark_until_safe else 0) < 0:
            acting = sorted(
                (p for p in self._on(b) if p.status == "acting"), key=lambda p: p.tokens
            )
            if acting:
                self._pause(acting[0])
                paused.append(acting[0].id)
                continue
            reasoning = sorted(
                (p for p in self._on(b) if p.status == "reasoning" and not p.marked),
                key=lambda p: p.tokens,
            )
            if reasoning:
                reasoning[0].marked = True
                future += reasoning[0].tokens
                marked.append(reasoning[0].id)
                continue
            break
        return paused, marked

    def _pause(self, p: Program) -> None:
        """router.py:545–572."""
        p.origin = p.backend
        p.backend = None
        p.paused = True
        self._enqueue(p)

    def _enqueue(self, p: Program) -> None:
        """router.py:474–485: ``PausedInfo.total_tokens`` is the tokens now."""
        p.paused = True
        p.paused_tokens = p.tokens
        self._seq += 1
        p.queued_at = self._seq
        self.queue[p.id] = None

    def _resume(self, p: Program, b: str) -> None:
        """router.py:606–639: registered on ``b``; a blocked request proceeds."""
        p.backend = b
        p.origin = None
        p.paused = False
        p.blocked = False
