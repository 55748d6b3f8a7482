"""What every harness integration maps to: one hook payload in, TAO messages out (pure).

Harness hooks and plugins (Claude Code, OpenCode, OpenHands, mini-swe-agent) forward their
payloads unparsed on ``tao.v1.hook.<harness>`` (the ``Tao-Received-At`` header carries the time
the hook or the gateway received it, because hook payloads have no timestamp of their own). The
tools service decodes the JSON and hands it to that harness's :class:`HookMapper`, which returns
the :class:`~shared.contracts.tool.ToolStart` / ``ToolEnd`` / ``ToolProgress`` and
:class:`~shared.contracts.session.SessionEnd` messages it implies. A mapper may keep state (for
example OpenHands, which has no call id, pairs starts and ends in order); it does no I/O and
reads no clock: ``received_at`` is an argument.

A payload a mapper cannot read raises :class:`HookPayloadError` naming the field and what was
wrong; the tools service dead-letters it with that reason. A well-formed payload for an event
TAO does not use maps to ``[]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Protocol

from shared.contracts.base import Message
from shared.contracts.errors import ContractError
from shared.contracts.subjects import RECEIVED_AT_HEADER

__all__ = ["MAX_HOOK_BYTES", "RECEIVED_AT_HEADER", "HookMapper", "HookPayloadError"]

MAX_HOOK_BYTES: Final = 1 << 20
"""Largest hook payload forwarded or accepted (1 MiB, the NATS default max payload)."""


class HookPayloadError(ContractError):
    """A ``harness`` hook payload that cannot be mapped: ``reason`` names the field and fault."""

    def __init__(self, harness: str, reason: str) -> None:
        self.harness = harness
        self.reason = reason
        super().__init__(f"cannot map {harness} hook payload: {reason}")


class HookMapper(Protocol):
    """Maps one harness's decoded hook payloads to TAO messages, in arrival order."""

    harness: str

    def map(self, body: Mapping[str, Any], received_at: float) -> list[Message]:
        """The messages ``body`` implies (``[]`` for events TAO ignores).

        Raises :class:`HookPayloadError` for a payload that claims to be a known event but has
        a missing or wrongly typed field.
        """
        ...
