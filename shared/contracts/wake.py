"""Wake-ups on ``tao.v1.wake``: a state change worth an early tick (DESIGN 4, valuation).

The tools service publishes one after it has written a tool end or a new request to the store,
and the planner one after the verify-and-apply step discarded its plan (``replan``: the snapshot
was older than the records, often because the previous plan's admissions moved them, and no
other change may come to ask for a fresh one); the valuation service, which otherwise ticks once
per period, runs a debounced early tick. Core NATS, fire-and-forget: a lost wake-up only delays
the change to the next periodic tick.
"""

from __future__ import annotations

from typing import Final

from .base import Message

__all__ = ["WAKE_ARRIVAL", "WAKE_CANCEL", "WAKE_END", "WAKE_REPLAN", "WAKE_TOOL_END", "Wake"]

WAKE_TOOL_END: Final = "tool_end"
WAKE_ARRIVAL: Final = "arrival"
WAKE_CANCEL: Final = "cancel"
WAKE_END: Final = "end"
WAKE_REPLAN: Final = "replan"


class Wake(Message, tag="Wake", frozen=True, kw_only=True):
    """Session ``session_id`` changed at ``ts`` for ``reason`` (one of the ``WAKE_*``)."""

    reason: str
    ts: float
    session_id: str | None = None
