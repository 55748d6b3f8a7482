"""Dead letters: messages a subscriber could not handle, on ``tao.v1.dlq.<service>``.

The shell (``shared/infra``) catches a :class:`~shared.contracts.errors.ContractError` or a
handler failure, publishes a :class:`DeadLetter`, logs one warning and acks the original; a bad
message never crashes a subscriber.
"""

from __future__ import annotations

import msgspec

from .base import Message

__all__ = ["DeadLetter"]


class DeadLetter(Message, tag="DeadLetter", frozen=True, kw_only=True):
    """``service`` rejected the message received on ``subject`` at ``received_at``.

    ``payload`` holds the original bytes unchanged (base64 in JSON, as msgspec encodes
    ``bytes``); ``reason`` is the error message and ``error_type`` its class name.
    ``headers`` keeps the original NATS headers, if any.
    """

    subject: str
    reason: str
    payload: bytes
    received_at: float
    service: str
    error_type: str | None = None
    headers: dict[str, str] = msgspec.field(default_factory=dict)
