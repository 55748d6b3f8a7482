"""The model APIs the gateway serves, and what differs between them.

Every model endpoint goes through the same relay (register, hold, forward, report); an
:class:`Api` says how to read its request, find its session, word its errors, ask for token
ids and read its answers:

=============  =========================  ==========  ==============================  =========
api            path                       errors      session id                      token ids
=============  =========================  ==========  ==============================  =========
chat           ``/v1/chat/completions``   OpenAI      headers, then user, program_id  asked
completions    ``/v1/completions``        OpenAI      headers, then user, program_id  asked
messages       ``/v1/messages``           Anthropic   ``metadata.user_id``, then chat  no
=============  =========================  ==========  ==============================  =========

The headers are ``X-Claude-Code-Session-Id``, ``X-Session-ID`` and ``x-session-affinity``, in
that order (:mod:`.requests`, which also reads the parent session and the harness).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from aiohttp import web

from .anthropic import (
    CLAUDE_CODE,
    MessageStreamStats,
    anthropic_error,
    claude_session_id,
    describe_messages,
    read_message_body,
)
from .proxy import BodyReader, Tracker, anthropic_error_event, openai_error_event
from .requests import (
    IdSource,
    RequestInfo,
    describe_request,
    harness_from_agent,
    session_identity,
    upstream_body,
)
from .responses import StreamStats, read_body
from .tokenids import client_wants_ids

__all__ = ["CHAT", "COMPLETIONS", "MESSAGES", "Api", "openai_error"]


def openai_error(
    status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
) -> web.Response:
    """An OpenAI-style error response: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return web.json_response(body, status=status, headers=headers)


def _strip_reader(strip: bool) -> BodyReader:
    return lambda data: read_body(data, strip_ids=strip)


@dataclass(frozen=True, slots=True)
class Api:
    """One model endpoint of the gateway (module docstring)."""

    name: Literal["chat", "completions", "messages"]
    """Also the ``endpoint`` label of the request metrics."""
    path: str

    @property
    def anthropic(self) -> bool:
        return self.name == "messages"

    @property
    def token_ids(self) -> bool:
        """Whether the node can be asked for token ids on this endpoint."""
        return not self.anthropic

    def describe(self, body: Mapping[str, Any]) -> RequestInfo:
        """The request's facts; :class:`.requests.BadRequest` names what is wrong."""
        if self.anthropic:
            return describe_messages(body)
        return describe_request(body, chat=self.name == "chat")

    def error(
        self, status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
    ) -> web.Response:
        """An error answer in this API's format."""
        make = anthropic_error if self.anthropic else openai_error
        return make(status, message, err_type, headers=headers)

    def error_event(self, message: str) -> bytes:
        """The SSE event telling a streaming client that the node broke off."""
        make = anthropic_error_event if self.anthropic else openai_error_event
        return make(message)

    def identity(
        self, headers: Mapping[str, str], body: Mapping[str, Any], new_id: Callable[[], str]
    ) -> tuple[str, IdSource]:
        """The session id and its source (:func:`.requests.session_identity`): for messages
        Claude Code's ``metadata.user_id`` first."""
        claude = claude_session_id(body.get("metadata")) if self.anthropic else None
        return session_identity(headers, body, new_id, claude_metadata=claude)

    @staticmethod
    def harness(
        named: str | None, source: IdSource, headers: Mapping[str, str] | None = None
    ) -> str | None:
        """The harness named by ``X-TAO-Harness`` (:func:`.requests.harness_of`), else
        ``claude-code`` when Claude Code's own id named the session, else the one the
        ``User-Agent`` names (:func:`.requests.harness_from_agent`)."""
        if named is not None:
            return named
        if source in ("metadata", "claude_header"):
            return CLAUDE_CODE
        return harness_from_agent(headers) if headers is not None else None

    def upstream(
        self, body: Mapping[str, Any], info: RequestInfo, *, token_ids: bool
    ) -> dict[str, Any]:
        """The body to send to the node (Anthropic streams carry usage without being asked)."""
        return upstream_body(
            body, stream=info.stream and not self.anthropic, token_ids=token_ids and self.token_ids
        )

    def reader(self, body: Mapping[str, Any], asked_ids: bool) -> BodyReader:
        """Reads a whole answer; strips the ids the gateway asked for on its own behalf."""
        if self.anthropic:
            return read_message_body
        return _strip_reader(asked_ids and not client_wants_ids(body))

    def tracker(self, body: Mapping[str, Any], info: RequestInfo, asked_ids: bool) -> Tracker:
        """Reads a streamed answer event by event."""
        if self.anthropic:
            return MessageStreamStats()
        return StreamStats(
            keep_usage_chunk=info.client_wants_usage,
            strip_ids=asked_ids and not client_wants_ids(body),
        )


CHAT: Final = Api("chat", "/v1/chat/completions")
COMPLETIONS: Final = Api("completions", "/v1/completions")
MESSAGES: Final = Api("messages", "/v1/messages")
