"""The model APIs the gateway serves, and what differs between them.

Every model endpoint goes through the same relay (register, hold, forward, report); an
:class:`Api` says how to read its request, find its session, word its errors, ask for token
ids and read its answers:

=============  =========================  ==========  ===============================  =========
api            path                       errors      session id                       token ids
=============  =========================  ==========  ===============================  =========
chat           ``/v1/chat/completions``   OpenAI      headers, body ``session_id``,    asked
                                                      then user, program_id
completions    ``/v1/completions``        OpenAI      as chat                          asked
messages       ``/v1/messages``           Anthropic   ``metadata.user_id``, then chat  no
responses      ``/v1/responses``          OpenAI      headers, body ``session_id``,    no
                                                      ``previous_response_id``, then
                                                      user, program_id
=============  =========================  ==========  ===============================  =========

The headers are ``X-Claude-Code-Session-Id``, ``X-Session-ID``, ``x-session-affinity``,
``X-SMG-Routing-Key``, ``X-Dynamo-Session-ID``, Codex's ``session-id`` / ``session_id`` and
AIPerf's ``X-Correlation-ID``, in that order; the body's ``session_id`` is OpenRouter's field
(Cline's OpenRouter provider), ``conversation_id`` vLLM's multi-turn benchmark's
(:mod:`.requests`, which
also reads the parent session and the harness). With none of them, chat, messages and responses
requests join the session their conversation continues (:meth:`Api.items`,
:mod:`.continuation`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from aiohttp import web

from services.gateway.anthropic import (
    CLAUDE_CODE,
    MessageStreamStats,
    anthropic_error,
    claude_session_id,
    describe_messages,
    read_message_body,
)
from services.gateway.continuation import Item, anthropic_items, chat_items, responses_items
from services.gateway.ids import check_ids
from services.gateway.openai_responses import (
    ResponsesStreamStats,
    describe_responses,
    read_responses_body,
    responses_error_event,
)
from services.gateway.proxy import BodyReader, Tracker, anthropic_error_event, openai_error_event
from services.gateway.requests import (
    IdSource,
    RequestInfo,
    describe_request,
    harness_from_agent,
    session_identity,
    upstream_body,
)
from services.gateway.responses import StreamStats, read_body
from services.gateway.tokenids import client_wants_ids

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "MESSAGES",
    "RESPONSES",
    "AnthropicApi",
    "Api",
    "OpenAIApi",
    "ResponsesApi",
    "openai_error",
]


CODEX: Final = "codex"
"""The harness reported for a request that Codex's ``session_id`` header identified."""


def openai_error(
    status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
) -> web.Response:
    """An OpenAI-style error response: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
    return web.json_response(body, status=status, headers=headers)


def _strip_reader(strip: bool) -> BodyReader:
    return lambda data: read_body(data, strip_ids=strip)


class _SameHarness:
    """What both APIs read alike: the harness that sent a request."""

    __slots__ = ()

    def harness(
        self, named: str | None, source: IdSource, headers: Mapping[str, str] | None = None
    ) -> str | None:
        """The harness named by ``X-TAO-Harness`` (:func:`.requests.harness_of`), else
        ``claude-code`` when Claude Code's own id named the session, else the one the
        ``User-Agent`` names (:func:`.requests.harness_from_agent`)."""
        if named is not None:
            return named
        if source in ("metadata", "claude_header"):
            return CLAUDE_CODE
        if source == "codex":
            return CODEX
        return harness_from_agent(headers) if headers is not None else None


class Api(Protocol):
    """One model endpoint of the gateway (module docstring): :class:`OpenAIApi` or
    :class:`AnthropicApi`."""

    @property
    def name(self) -> Literal["chat", "completions", "messages", "responses"]:
        """Also the ``endpoint`` label of the request metrics."""
        ...

    @property
    def path(self) -> str: ...

    @property
    def token_ids(self) -> bool:
        """Whether the node can be asked for token ids on this endpoint."""
        ...

    @property
    def auth_error_type(self) -> str:
        """The error type of a 401 in this API's format."""
        ...

    def describe(self, body: Mapping[str, Any]) -> RequestInfo:
        """The request's facts; :class:`.requests.BadRequest` names what is wrong."""
        ...

    def error(
        self, status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
    ) -> web.Response:
        """An error answer in this API's format."""
        ...

    def error_event(self, message: str) -> bytes:
        """The SSE event telling a streaming client that the node broke off."""
        ...

    def identity(
        self,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        new_id: Callable[[], str],
        previous: Callable[[str], str | None] | None = None,
    ) -> tuple[str, IdSource]:
        """The session id and its source (:func:`.requests.session_identity`); ``previous``
        maps a served response id to its session. Every id the request names is checked
        first (:func:`.ids.check_ids`: :class:`~.requests.BadRequest` for a bad one)."""
        ...

    def items(self, body: Mapping[str, Any]) -> list[Item] | None:
        """The conversation's items (:mod:`.continuation`); ``None``: the API has none."""
        ...

    def harness(
        self, named: str | None, source: IdSource, headers: Mapping[str, str] | None = None
    ) -> str | None:
        """The harness that sent the request (:meth:`_SameHarness.harness`)."""
        ...

    def upstream(
        self, body: Mapping[str, Any], info: RequestInfo, *, token_ids: bool
    ) -> dict[str, Any]:
        """The body to send to the node."""
        ...

    def reader(self, body: Mapping[str, Any], asked_ids: bool) -> BodyReader:
        """Reads a whole answer; strips the ids the gateway asked for on its own behalf."""
        ...

    def tracker(self, body: Mapping[str, Any], info: RequestInfo, asked_ids: bool) -> Tracker:
        """Reads a streamed answer event by event."""
        ...


@dataclass(frozen=True, slots=True)
class OpenAIApi(_SameHarness):
    """Chat Completions or Completions: OpenAI's errors, the session from the headers, then the
    body's ``session_id``, ``user`` or ``program_id``; the node may be asked for token ids."""

    name: Literal["chat", "completions"]
    path: str
    token_ids: bool = True
    auth_error_type: str = "invalid_request_error"

    def describe(self, body: Mapping[str, Any]) -> RequestInfo:
        return describe_request(body, chat=self.name == "chat")

    def error(
        self, status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
    ) -> web.Response:
        return openai_error(status, message, err_type, headers=headers)

    def error_event(self, message: str) -> bytes:
        return openai_error_event(message)

    def identity(
        self,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        new_id: Callable[[], str],
        previous: Callable[[str], str | None] | None = None,
    ) -> tuple[str, IdSource]:
        check_ids(headers, body)
        return session_identity(headers, body, new_id)

    def items(self, body: Mapping[str, Any]) -> list[Item] | None:
        return chat_items(body) if self.name == "chat" else None

    def upstream(
        self, body: Mapping[str, Any], info: RequestInfo, *, token_ids: bool
    ) -> dict[str, Any]:
        """A stream asks for usage (the gateway reads it even when the client does not)."""
        return upstream_body(body, stream=info.stream, token_ids=token_ids)

    def reader(self, body: Mapping[str, Any], asked_ids: bool) -> BodyReader:
        return _strip_reader(asked_ids and not client_wants_ids(body))

    def tracker(self, body: Mapping[str, Any], info: RequestInfo, asked_ids: bool) -> Tracker:
        return StreamStats(
            keep_usage_chunk=info.client_wants_usage,
            strip_ids=asked_ids and not client_wants_ids(body),
        )


@dataclass(frozen=True, slots=True)
class AnthropicApi(_SameHarness):
    """Messages: Anthropic's errors, the session from Claude Code's ``metadata.user_id``
    first; no token ids (the endpoint has none), and streams carry usage unasked."""

    name: Literal["messages"] = "messages"
    path: str = "/v1/messages"
    token_ids: bool = False
    auth_error_type: str = "authentication_error"

    def describe(self, body: Mapping[str, Any]) -> RequestInfo:
        return describe_messages(body)

    def error(
        self, status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
    ) -> web.Response:
        return anthropic_error(status, message, err_type, headers=headers)

    def error_event(self, message: str) -> bytes:
        return anthropic_error_event(message)

    def identity(
        self,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        new_id: Callable[[], str],
        previous: Callable[[str], str | None] | None = None,
    ) -> tuple[str, IdSource]:
        claude = claude_session_id(body.get("metadata"))
        check_ids(headers, body, claude_metadata=claude)
        return session_identity(headers, body, new_id, claude_metadata=claude)

    def items(self, body: Mapping[str, Any]) -> list[Item] | None:
        return anthropic_items(body)

    def upstream(
        self, body: Mapping[str, Any], info: RequestInfo, *, token_ids: bool
    ) -> dict[str, Any]:
        del token_ids  # the Messages endpoint has no token ids to ask for
        return upstream_body(body, stream=False, token_ids=False)

    def reader(self, body: Mapping[str, Any], asked_ids: bool) -> BodyReader:
        return read_message_body

    def tracker(self, body: Mapping[str, Any], info: RequestInfo, asked_ids: bool) -> Tracker:
        return MessageStreamStats()


@dataclass(frozen=True, slots=True)
class ResponsesApi(_SameHarness):
    """Responses (:mod:`.openai_responses`): OpenAI's errors, the session from the headers,
    then the body's ``session_id``, ``previous_response_id``, ``user`` or ``program_id``; no
    token ids (vLLM's Responses endpoint has no ``return_token_ids``), and streams carry usage
    unasked (in ``response.completed``)."""

    name: Literal["responses"] = "responses"
    path: str = "/v1/responses"
    token_ids: bool = False
    auth_error_type: str = "invalid_request_error"

    def describe(self, body: Mapping[str, Any]) -> RequestInfo:
        return describe_responses(body)

    def error(
        self, status: int, message: str, err_type: str, *, headers: dict[str, str] | None = None
    ) -> web.Response:
        return openai_error(status, message, err_type, headers=headers)

    def error_event(self, message: str) -> bytes:
        return responses_error_event(message)

    def identity(
        self,
        headers: Mapping[str, str],
        body: Mapping[str, Any],
        new_id: Callable[[], str],
        previous: Callable[[str], str | None] | None = None,
    ) -> tuple[str, IdSource]:
        check_ids(headers, body)
        return session_identity(headers, body, new_id, previous=previous)

    def items(self, body: Mapping[str, Any]) -> list[Item] | None:
        return responses_items(body)

    def upstream(
        self, body: Mapping[str, Any], info: RequestInfo, *, token_ids: bool
    ) -> dict[str, Any]:
        del token_ids  # the Responses endpoint has no token ids to ask for
        return upstream_body(body, stream=False, token_ids=False)

    def reader(self, body: Mapping[str, Any], asked_ids: bool) -> BodyReader:
        return read_responses_body

    def tracker(self, body: Mapping[str, Any], info: RequestInfo, asked_ids: bool) -> Tracker:
        return ResponsesStreamStats()


CHAT: Final = OpenAIApi("chat", "/v1/chat/completions")
COMPLETIONS: Final = OpenAIApi("completions", "/v1/completions")
MESSAGES: Final = AnthropicApi()
RESPONSES: Final = ResponsesApi()
