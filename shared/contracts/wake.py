"""Wake-ups on ``tao.v1.wake``: a state change worth an early tick (DESIGN 4, valuation).

The tools service publishes one after it has written a tool end or a new request to the store,
and the planner one after the verify-and-apply step discarded its plan (``replan``: the snapshot
was older than the records, often because the previous plan's admissions moved them, and no
other change may come to ask for a fresh one); the valuation service, which otherwise ticks once
per period, runs a debounced early tick. The tools service's ``shared`` wake-up names the
sessions whose shared prefix it changed (which moved their weights): the valuation reads them
at its next tick, admitted or not, for its nodes' shared prefix, and ticks no earlier for it.
Core NATS, fire-and-forget: a lost wake-up only delays the change to the next periodic tick.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from .base import Message

__all__ = [
    "WAKE_ARRIVAL",
    "WAKE_CANCEL",
    "WAKE_END",
    "WAKE_NAMES_MAX",
    "WAKE_REPLAN",
    "WAKE_SHARED",
    "WAKE_TOOL_END",
    "Wake",
    "wake_for",
]

WAKE_TOOL_END: Final = "tool_end"
WAKE_ARRIVAL: Final = "arrival"
WAKE_CANCEL: Final = "cancel"
WAKE_END: Final = "end"
WAKE_REPLAN: Final = "replan"
WAKE_SHARED: Final = "shared"


WAKE_NAMES_MAX: Final = 256
"""Most sessions one wake-up names; a change of more names none (the valuation reads its
whole pool)."""


class Wake(Message, tag="Wake", frozen=True, kw_only=True):
    """Session ``session_id`` (one) or the sessions ``session_ids`` (several) changed at ``ts``
    for ``reason`` (one of the ``WAKE_*``). A wake-up that names no session says that something
    changed that the valuation must read its whole pool to see."""

    reason: str
    ts: float
    session_id: str | None = None
    session_ids: list[str] | None = None

    def names(self) -> frozenset[str] | None:
        """The sessions this wake-up names, or ``None`` when it names none."""
        if self.session_id is None and self.session_ids is None:
            return None
        one = () if self.session_id is None else (self.session_id,)
        return frozenset((*one, *(self.session_ids or ())))


def wake_for(reason: str, ts: float, sids: Collection[str]) -> Wake:
    """The wake-up for a change of ``sids``: ``session_id`` for one, ``session_ids`` (sorted)
    for up to :data:`WAKE_NAMES_MAX`, no name for none or more."""
    if len(sids) == 1:
        return Wake(reason=reason, ts=ts, session_id=next(iter(sids)))
    if 1 < len(sids) <= WAKE_NAMES_MAX:
        return Wake(reason=reason, ts=ts, session_ids=sorted(sids))
    return Wake(reason=reason, ts=ts)
