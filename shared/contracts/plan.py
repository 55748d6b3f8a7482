"""Planner outputs: the :class:`Plan` of a tick and the :class:`Placement` orders to gateways.

The planner publishes its plan on ``tao.v1.plan`` (for observation and replay) and, after the
signature check (DESIGN §3.4), one :class:`Placement` per applied decision on
``tao.v1.placement.<gateway>``: the gateway that holds the session's pending request acts on it.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from .base import Message, Record

__all__ = [
    "PLACEMENT_KINDS",
    "Placement",
    "PlacementKind",
    "Plan",
    "WireAssignment",
    "WireObjective",
]


class WireAssignment(msgspec.Struct, array_like=True, frozen=True):
    """Session ``session`` goes to (or, for an interrupt, leaves) node ``node``.

    Encoded as a pair ``["<session>", "<node>"]``, the plan's ``[(session, node)]`` shape.
    """

    session: str
    node: str


class WireObjective(Record, frozen=True, kw_only=True):
    """The plan's lexicographic objective (Σk, Σr, Σt, admitted), compared as a tuple."""

    credit: int = 0
    ready: int = 0
    tokens: int = 0
    admitted: int = 0


class Plan(Message, tag="Plan", frozen=True, kw_only=True):
    """What policy ``policy`` decided at tick ``tick``.

    ``assignments`` are ordered most valuable first, so any prefix is a sensible partial plan;
    ``interrupts`` are the sessions released by the interrupt rule. ``exact`` is true only when
    the objective is proven optimal on the discretised snapshot; ``method`` names the solver
    (``dp``, ``bfd``, …) and ``reason`` says why the result is not exact. ``states`` counts DP
    states explored (0 for heuristics); ``elapsed_ms`` is the solve time.
    """

    tick: int
    policy: str
    assignments: list[WireAssignment] = msgspec.field(default_factory=list)
    interrupts: list[WireAssignment] = msgspec.field(default_factory=list)
    objective: WireObjective = WireObjective()
    exact: bool = True
    method: str = "dp"
    states: int = 0
    elapsed_ms: float = 0.0
    reason: str | None = None


PlacementKind = Literal["admit", "interrupt", "revoke"]
PLACEMENT_KINDS: Final[tuple[PlacementKind, ...]] = ("admit", "interrupt", "revoke")


class Placement(Message, tag="Placement", frozen=True, kw_only=True):
    """An applied decision for one session, addressed to the gateway ``gateway_id``.

    ``admit``: forward the session's requests to ``node_id``. ``interrupt``: the session's
    admission on ``node_id`` is released; it rejoins the pool. ``revoke``: an earlier admit
    for this session is withdrawn (``node_id`` names it when known). ``version`` is the session
    record version after the change; a gateway ignores a placement older than one it applied.
    ``key_id`` and ``signature`` (base64 Ed25519 over the encoding with ``signature`` empty)
    are set when the planner signs placements (:mod:`shared.infra.signing`).
    """

    kind: PlacementKind
    session_id: str
    version: int
    tick: int
    gateway_id: str
    node_id: str | None = None
    issued_at: float | None = None
    key_id: str | None = None
    signature: str | None = None
