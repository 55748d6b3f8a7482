"""A scheduling domain's load on ``tao.v1.domain.load``, for the gateway's upper-level choice.

The domain's valuation leader publishes one each tick (core NATS, fire-and-forget: the next
tick supersedes a lost one). A gateway that serves several domains routes each new session to
the one least loaded after it, by ``demand / capacity`` (:mod:`shared.core.domains`,
docs/scale-out.md).
"""

from __future__ import annotations

from .base import Message

__all__ = ["DomainLoadReport"]


class DomainLoadReport(Message, tag="DomainLoadReport", frozen=True, kw_only=True):
    """Domain ``domain`` at ``ts`` (its valuation's tick ``tick``): ``capacity`` usable KV
    tokens on its healthy nodes, ``demand`` tokens its sessions hold (the nodes' reserved
    totals) or wait for (each pooled session's weight if it were admitted now), and the
    ``models`` its nodes serve (``None``: a node did not say)."""

    domain: str
    ts: float
    tick: int
    capacity: int
    demand: int
    models: list[str] | None = None
