"""Session messages the gateway publishes on ``tao.v1.session.<kind>.<session_id>``.

A session is one agent task (a chain of model requests and tool calls). The gateway reports each
model request when it is registered (:class:`SessionRequest`), each response when it completes
(:class:`SessionResponse`) and the end of the session (:class:`SessionEnd`). A response that
carries ``tool_calls`` starts a tool; the session's next request ends it (DESIGN §4, tools).
"""

from __future__ import annotations

from typing import Final

import msgspec

from .base import Message, Record

__all__ = [
    "END_CLIENT_CLOSED",
    "END_COMPLETED",
    "END_ERROR",
    "END_IDLE_TIMEOUT",
    "END_WAIT_TIMEOUT",
    "SessionCancel",
    "SessionEnd",
    "SessionEvent",
    "SessionRequest",
    "SessionResponse",
    "ToolCallInfo",
    "Usage",
]

# Known SessionEnd reasons. The field is a plain string so a newer gateway may add reasons.
END_COMPLETED: Final = "completed"
END_CLIENT_CLOSED: Final = "client_closed"
END_IDLE_TIMEOUT: Final = "idle_timeout"
END_WAIT_TIMEOUT: Final = "wait_timeout"
END_ERROR: Final = "error"


class SessionRequest(Message, tag="SessionRequest", frozen=True, kw_only=True):
    """A model request of a session was registered by a gateway and now waits for admission.

    ``prompt_tokens_estimate`` is the gateway's estimate of the prompt size before the node
    counts it (0 when unknown); ``messages_count`` is the length of the chat ``messages`` list.
    ``harness`` names the agent harness when the request says (``X-TAO-Harness``, Claude Code's
    ids, a harness's ``User-Agent``). ``parent_session_id`` is the session that started this
    one as a sub-agent (OpenCode's ``x-parent-session-id``), ``None`` for a top-level session.
    """

    session_id: str
    request_id: str
    model: str
    arrived_at: float
    gateway_id: str
    prompt_tokens_estimate: int = 0
    messages_count: int = 0
    stream: bool = False
    max_tokens: int | None = None
    harness: str | None = None
    parent_session_id: str | None = None


class Usage(Record, frozen=True, kw_only=True):
    """Token usage as the node reported it (OpenAI ``usage``; ``cached_tokens`` from
    ``prompt_tokens_details.cached_tokens``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    total_tokens: int = 0


class ToolCallInfo(Record, frozen=True, kw_only=True):
    """One tool call the model asked for: its id, tool name and argument size in bytes."""

    id: str
    name: str
    arguments_bytes: int = 0


class SessionResponse(Message, tag="SessionResponse", frozen=True, kw_only=True):
    """A model request of a session completed on ``node_id``.

    ``finish_reason`` is OpenAI's (``stop``, ``length``, ``tool_calls``, …) or ``None`` when the
    stream broke off; ``error`` is set when the request failed. ``ttft_s`` and ``duration_s``
    are measured by the gateway from forwarding to first token and to the last byte.

    ``block_keys`` are TAO's own keys (:func:`shared.core.blockkeys.chain_keys`) of the full
    ``block_size``-token blocks of the request's prompt + completion token ids, when the node
    returned them (vLLM ``return_token_ids``); telemetry walks them against the node's KV
    events to find the session's resident prefix. ``None``: no token ids, so residency falls
    back to the usage-based observation.

    ``model`` is the request's model as its ``SessionRequest`` named it (``None`` from a
    gateway older than the field): the scope in which the tools service counts the keys that
    sessions share (:mod:`shared.core.sharedprefix`).
    """

    session_id: str
    request_id: str
    node_id: str
    gateway_id: str
    finished_at: float
    usage: Usage = Usage()
    finish_reason: str | None = None
    tool_calls: list[ToolCallInfo] = msgspec.field(default_factory=list)
    ttft_s: float | None = None
    duration_s: float | None = None
    error: str | None = None
    block_size: int | None = None
    block_keys: list[int] | None = None
    model: str | None = None


class SessionEnd(Message, tag="SessionEnd", frozen=True, kw_only=True):
    """The session is over and its admission and state can be released.

    ``reason`` is one of the ``END_*`` constants of this module, or a newer string.
    """

    session_id: str
    ended_at: float
    reason: str = END_COMPLETED
    gateway_id: str | None = None


class SessionCancel(Message, tag="SessionCancel", frozen=True, kw_only=True):
    """Request ``request_id`` of a session was withdrawn before a node served it.

    The gateway publishes it when a held request is released: the client disconnected
    (``reason`` = ``client_closed``) or the hold outlived its limit (``wait_timeout``, answered
    with 503 and ``Retry-After``). The session stays alive; it just has no pending request.
    """

    session_id: str
    request_id: str
    cancelled_at: float
    reason: str = END_CLIENT_CLOSED
    gateway_id: str | None = None


SessionEvent = SessionRequest | SessionResponse | SessionCancel | SessionEnd
"""Everything published under ``tao.v1.session.>``."""
