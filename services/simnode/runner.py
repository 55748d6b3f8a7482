"""Drives the pure engine model in real time for the sim node.

Virtual engine time = (monotonic wall time since start) × ``time_scale``. One driver task
advances the engine, hands finished requests to their waiters, refreshes the token counts of
streaming requests, then sleeps until the engine's next event (scaled to wall time), a short
streaming tick, or a new submission, whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable

from shared.core.engine import Completion, Engine, EngineRequest

__all__ = ["EngineRunner", "Waiter"]


class Waiter:
    """What a handler awaits: token progress and, at the end, the completion."""

    __slots__ = ("changed", "completion", "error", "request_id", "streaming", "tokens")

    def __init__(self, request_id: str, *, streaming: bool) -> None:
        self.request_id = request_id
        self.streaming = streaming
        self.tokens = 0
        self.completion: Completion | None = None
        self.error: BaseException | None = None
        self.changed = asyncio.Event()

    @property
    def done(self) -> bool:
        """The request finished (or failed)."""
        return self.completion is not None or self.error is not None


class EngineRunner:
    """Owns the engine; every engine call goes through here with the current virtual time."""

    def __init__(
        self,
        engine: Engine,
        *,
        time_scale: float = 1.0,
        stream_tick_s: float = 0.02,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0 or not math.isfinite(time_scale):
            raise ValueError(f"time_scale: must be finite and > 0, got {time_scale}")
        self.engine = engine
        self.time_scale = time_scale
        self.stream_tick_s = stream_tick_s
        self._clock = clock
        self._t0 = clock()
        self._wake = asyncio.Event()
        self._waiters: dict[str, Waiter] = {}
        self._task: asyncio.Task[None] | None = None
        self.requests_finished = 0
        self.requests_aborted = 0
        self.aborted = asyncio.Event()
        """Set on every abort (tests await it instead of sleeping)."""
        self.after_tick: Callable[[], object] | None = None
        """Called after every engine advance (the KV-event publisher drains the engine here)."""

    def vnow(self) -> float:
        """Current virtual engine time, seconds."""
        return (self._clock() - self._t0) * self.time_scale

    def start(self) -> None:
        """Start the driver task (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="simnode-driver")

    async def stop(self) -> None:
        """Stop the driver and fail whoever still waits."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for w in self._waiters.values():
            w.error = RuntimeError("sim node stopped")
            w.changed.set()
        self._waiters.clear()

    def submit(self, req: EngineRequest, *, streaming: bool) -> Waiter:
        """Queue ``req`` now; ``ValueError`` from the engine when it can never run."""
        self.engine.submit(req, self.vnow())
        w = Waiter(req.id, streaming=streaming)
        self._waiters[req.id] = w
        self._wake.set()
        return w

    def abort(self, request_id: str) -> None:
        """Client went away: drop the request and free its blocks."""
        self._waiters.pop(request_id, None)
        self.engine.abort(request_id, self.vnow())
        self.requests_aborted += 1
        self.aborted.set()
        self._wake.set()

    def _tick(self) -> float | None:
        """Advance to now; wall seconds to sleep before the next tick (None: until woken)."""
        now = self.vnow()
        for c in self.engine.advance(now):
            self.requests_finished += 1
            w = self._waiters.pop(c.request_id, None)
            if w is not None:
                w.completion = c
                w.tokens = c.completion_tokens
                w.changed.set()
        streaming = False
        for w in self._waiters.values():
            if w.streaming:
                streaming = True
                n, _first = self.engine.progress(w.request_id, now)
                if n != w.tokens:
                    w.tokens = n
                    w.changed.set()
        if self.after_tick is not None:
            self.after_tick()
        nxt = self.engine.next_event_time()
        sleep = None if nxt is None else max(0.0, (nxt - now) / self.time_scale)
        if streaming and self._waiters:
            sleep = self.stream_tick_s if sleep is None else min(sleep, self.stream_tick_s)
        return sleep

    async def _run(self) -> None:
        while True:
            try:
                sleep = self._tick()
            except Exception as exc:  # a bug in the model must not hang every client
                for w in self._waiters.values():
                    w.error = exc
                    w.changed.set()
                self._waiters.clear()
                sleep = None
            self._wake.clear()
            if sleep is None:
                await self._wake.wait()
            elif sleep > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), sleep)
            else:
                await asyncio.sleep(0)
