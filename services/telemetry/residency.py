"""Where sessions' KV prefixes live: the :class:`ResidencySource` boundary and its first source.

A residency source keeps the store's per-(session, node) ``(k0, t_obs)`` current (DESIGN 3.1).
:class:`UsageResidency` infers it from the gateway's responses: when a request of a session
ends on node N, its prompt + completion tokens were in N's KV cache at ``finished_at`` (vLLM
keeps a finished request's blocks cached until evicted). Only the serving node is written; older
observations on other nodes decay by the half-life. A source fed by vLLM KV events
(``BlockStored`` / ``BlockRemoved`` on ``TAO_V1_KV``) implements the same Protocol and replaces
it without touching the telemetry app.
"""

from __future__ import annotations

from typing import Protocol

from structlog.typing import FilteringBoundLogger

from shared.contracts import subjects
from shared.contracts.codec import decode
from shared.contracts.session import SessionResponse
from shared.infra.busapi import Delivery, MessageBus, Subscription
from shared.infra.store_types import StateStore

__all__ = ["ResidencySource", "UsageResidency", "decode_response"]


class ResidencySource(Protocol):
    """Something that keeps residency in the store current once started."""

    name: str

    async def start(self, bus: MessageBus, service: str) -> list[Subscription]:
        """Start consuming; return the subscriptions (stopped by the bus on drain)."""
        ...


def decode_response(data: bytes) -> SessionResponse:
    """Decode a response and check its node and session ids (a bad one is a contract error:
    dead-letter at once)."""
    ev = decode(data, SessionResponse)
    subjects.check_name(ev.node_id, "node id")
    subjects.escape_token(ev.session_id)
    return ev


class UsageResidency:
    """Residency from response usage (prompt + completion tokens on the serving node)."""

    name = "usage"

    def __init__(self, store: StateStore, log: FilteringBoundLogger) -> None:
        self.store = store
        self.log = log
        self.written = 0

    async def start(self, bus: MessageBus, service: str) -> list[Subscription]:
        sub = await bus.consume(
            subjects.STREAM_SESSION,
            service,
            decode_response,
            self.on_response,
            filter_subject=subjects.session_events("response"),
        )
        return [sub]

    async def on_response(self, ev: SessionResponse, d: Delivery) -> None:
        """A request ended on ``ev.node_id``: its tokens are resident there at ``finished_at``."""
        tokens = usage_tokens(ev)
        skipped = usage_skip(ev)
        if skipped is None:
            await self.store.put_residency(ev.session_id, ev.node_id, tokens, ev.finished_at)
            self.written += 1
        self.log.info(
            "residency",
            source=self.name,
            session=ev.session_id,
            node=ev.node_id,
            tokens=tokens,
            t_obs=ev.finished_at,
            skipped=skipped,
        )


def usage_tokens(ev: SessionResponse) -> int:
    """The tokens a response's usage says are resident on its node."""
    u = ev.usage
    return (u.prompt_tokens + u.completion_tokens) or u.total_tokens


def usage_skip(ev: SessionResponse) -> str | None:
    """Why usage-based residency writes nothing for ``ev`` (``error``, ``no usage``), or None."""
    if ev.error is not None:
        return "error"
    return "no usage" if usage_tokens(ev) <= 0 else None
