"""The gateway's view of which sessions are admitted where, from the Placements it received (pure).

``admit`` sets the session's node; ``interrupt`` and ``revoke`` clear it. Each Placement carries
the session record's version after the change (DESIGN §3.4); placements can arrive late or twice
(JetStream redelivery), so one whose version is not newer than the last applied for its session
is ignored. A request already forwarded keeps its node: an interrupt takes effect for the
session's next request, which holds again.

:meth:`PlacementMap.restore` records an admission read from the state store instead (a
placement this gateway missed, e.g. before a restart); the record's version orders it against
the placements exactly as a placement's would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.contracts import Placement

__all__ = ["Admission", "ApplyResult", "PlacementMap"]

ApplyResult = Literal["admitted", "released", "stale"]


@dataclass(frozen=True, slots=True)
class Admission:
    """The last applied placement of a session: its version and node (``None``: not admitted)."""

    version: int
    node_id: str | None


class PlacementMap:
    """Per-session admission state built from versioned placements."""

    def __init__(self) -> None:
        self._state: dict[str, Admission] = {}

    def apply(self, placement: Placement) -> ApplyResult:
        """Apply ``placement`` unless it is stale; say what it did."""
        current = self._state.get(placement.session_id)
        if current is not None and placement.version <= current.version:
            return "stale"
        if placement.kind == "admit" and placement.node_id:
            self._state[placement.session_id] = Admission(placement.version, placement.node_id)
            return "admitted"
        self._state[placement.session_id] = Admission(placement.version, None)
        return "released"

    def restore(self, session_id: str, version: int, node_id: str) -> ApplyResult:
        """Record that the stored session record of ``version`` is admitted on ``node_id``,
        unless a placement of that version or newer was applied already."""
        current = self._state.get(session_id)
        if current is not None and version <= current.version:
            return "stale"
        self._state[session_id] = Admission(version, node_id)
        return "admitted"

    def node_of(self, session_id: str) -> str | None:
        """The node the session is admitted on, or ``None``."""
        state = self._state.get(session_id)
        return state.node_id if state is not None else None

    def forget(self, session_id: str) -> None:
        """Drop the session (it ended): a later session with the same id starts afresh."""
        self._state.pop(session_id, None)

    def admitted_count(self) -> int:
        """How many sessions are admitted now."""
        return sum(1 for s in self._state.values() if s.node_id is not None)

    def __len__(self) -> int:
        return len(self._state)
