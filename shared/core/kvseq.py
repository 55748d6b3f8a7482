"""The sequence rule for one vLLM KV-event stream (DESIGN §5), as a pure state machine.

vLLM numbers the batches of a publisher 0, 1, 2, … (an 8-byte big-endian ``seq`` frame). A
subscriber that last applied ``last`` classifies the next ``seq`` it sees:

* ``next``: ``seq == last + 1`` (or the first batch ever seen): apply it;
* ``gap``: ``seq > last + 1``: batches ``last + 1 … seq - 1`` were missed; replay them (from the
  ROUTER replay socket) before applying ``seq``;
* ``restart``: ``seq <= last``: the sequence went backwards, so the engine restarted (a new
  publisher numbers from 0 again): clear what is known about the node, start a new incarnation
  (:meth:`SeqTracker.restart`) and apply ``seq``.

PUB/SUB never delivers a batch twice, so the only duplicates a subscriber can meet are the
overlap between a replay and the live batches queued while it ran; the feed that did the replay
drops those (``seq`` at or below the last replayed one) before they reach the tracker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["SeqAction", "SeqTracker"]

SeqAction = Literal["next", "gap", "restart"]


@dataclass(slots=True)
class SeqTracker:
    """Tracks the last applied ``seq`` of one stream and its incarnation (restarts seen)."""

    last: int | None = None
    incarnation: int = 0

    def classify(self, seq: int) -> SeqAction:
        """What to do with ``seq`` (does not change the tracker)."""
        last = self.last
        if last is None or seq == last + 1:
            return "next"
        return "gap" if seq > last + 1 else "restart"

    def accept(self, seq: int) -> None:
        """Record that ``seq`` was applied."""
        self.last = seq

    def restart(self) -> int:
        """Start a new incarnation (the node was cleared); return its number."""
        self.last = None
        self.incarnation += 1
        return self.incarnation
