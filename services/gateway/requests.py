"""What the gateway reads from an incoming OpenAI request, and what it sends upstream (pure).

* **Session identity** (DESIGN §4, gateway; docs/harnesses.md): harnesses already name their
  session on every model request, so a harness with no TAO hook still keeps its session
  together. The first of these that is present (and not blank) wins:

  1. ``metadata.user_id``'s session uuid (``/v1/messages`` only; Claude Code, :mod:`.anthropic`);
  2. header ``X-Claude-Code-Session-Id`` (Claude Code since 2.1.86; the same uuid);
  3. header ``X-Session-ID`` (TAO's own: the OpenCode plugin, mini-swe-agent's
     ``extra_headers``, any client; OpenCode 1.x sends it itself as ``X-Session-Id``);
  4. header ``x-session-affinity`` (OpenCode 1.x, for providers other than its own);
  5. the body's ``user`` (OpenAI's end-user field), then ``program_id`` (ThunderAgent's field).

  Claude Code's ids come first because its hook payloads report that same uuid, so requests
  and tool events meet in one session even when a client also sets ``X-Session-ID``. A request
  with none of them is a one-turn session under a generated id, ended by the gateway after its
  response. OpenAI's ``previous_response_id`` would chain Responses API turns, but the gateway
  does not serve ``/v1/responses`` (a 404), so nothing maps it.
* **Sub-agents** get sessions of their own, linked to their parent's, so a parent waiting in
  its sub-agent tool call stays in that call while the sub-agent's turns run:

  * OpenCode 1.x gives a sub-agent its own session id and sends ``x-parent-session-id`` (the
    session that started it) on the sub-agent's requests;
  * Claude Code 2.1.197 sends the parent's session id and ``x-claude-code-agent-id``; when
    Claude Code's id named the session, the session is
    :func:`shared.harness.claude.sub_agent_session` (``<session>-agent-<agent id>``, the one
    its hooks map the sub-agent's ``agent_id`` payloads to) and the parent is that id.

  The parent is reported as :attr:`SessionRequest.parent_session_id`; a blank one, one longer
  than :data:`MAX_ID_CHARS` or the session itself is ignored.
* **Harness**: header ``X-TAO-Harness`` (set by harness hooks/clients, e.g. ``claude-code``)
  names the agent harness; it is reported as :attr:`SessionRequest.harness` and not forwarded.
  Without it, a ``User-Agent`` that a harness always sends names it (``claude-cli/…`` →
  ``claude-code``, ``opencode/…`` → ``opencode``; :data:`AGENT_HARNESSES`).
* **Upstream body**: vLLM's request models accept unknown fields (pydantic ``extra="allow"``)
  but log a warning for each, so the gateway removes the fields only it understands:
  ``program_id`` and every ``tao_*`` field except ``tao_script``, which the sim node reads.
  Streaming requests ask the node for usage (``stream_options.include_usage``) so the gateway
  can report it; :attr:`RequestInfo.client_wants_usage` says whether the client asked itself.
  With ``token_ids`` the body asks for ``return_token_ids`` too (:mod:`.tokenids`).
* **Prompt size estimate**: characters / 4 of the message texts (or of the completion prompt),
  a common rule of thumb for English BPE tokenisers (OpenAI, "What are tokens and how to count
  them", help.openai.com: "1 token ~= 4 chars in English"). Token-id prompts count exactly. The
  node's usage replaces the estimate once the response arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from shared.harness.claude import SUB_AGENT_INFIX, sub_agent_session

__all__ = [
    "AFFINITY_HEADER",
    "AGENT_HARNESSES",
    "CHARS_PER_TOKEN",
    "CLAUDE_AGENT_HEADER",
    "CLAUDE_SESSION_HEADER",
    "HARNESS_HEADER",
    "MAX_HARNESS_CHARS",
    "MAX_ID_CHARS",
    "PARENT_HEADER",
    "SESSION_HEADER",
    "BadRequest",
    "IdSource",
    "RequestInfo",
    "describe_request",
    "estimate_prompt_tokens",
    "harness_from_agent",
    "harness_of",
    "header",
    "parent_session",
    "parse_body",
    "session_identity",
    "upstream_body",
]

SESSION_HEADER: Final = "X-Session-ID"
CLAUDE_SESSION_HEADER: Final = "X-Claude-Code-Session-Id"
AFFINITY_HEADER: Final = "x-session-affinity"
PARENT_HEADER: Final = "x-parent-session-id"
CLAUDE_AGENT_HEADER: Final = "x-claude-code-agent-id"
HARNESS_HEADER: Final = "X-TAO-Harness"
MAX_HARNESS_CHARS: Final = 128
MAX_ID_CHARS: Final = 512
"""Longest parent session id read (a subject token's limit, ``subjects.MAX_TOKEN_LEN``)."""
AGENT_HARNESSES: Final = (("claude-cli/", "claude-code"), ("opencode/", "opencode"))
"""``User-Agent`` prefixes that name a harness: Claude Code 2.1.197 sends ``claude-cli/<version>
(external, sdk-cli)``, OpenCode 1.18.33 ``opencode/<version> ai-sdk/…`` (tests/harness)."""
CHARS_PER_TOKEN: Final = 4
_KEEP_PRIVATE: Final = frozenset({"tao_script"})

IdSource = Literal[
    "header", "user", "program_id", "metadata", "claude_header", "affinity", "generated"
]
"""Where a session id came from; ``metadata`` / ``claude_header``: Claude Code's
``metadata.user_id`` / ``X-Claude-Code-Session-Id`` (:mod:`.anthropic`); ``affinity``:
OpenCode's ``x-session-affinity``."""


class BadRequest(ValueError):
    """The request body cannot be served; ``message`` is shown to the client (HTTP 400)."""

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """The facts of one model request the gateway reports and acts on."""

    model: str
    stream: bool
    max_tokens: int | None
    messages_count: int
    prompt_tokens_estimate: int
    client_wants_usage: bool


def parse_body(raw: object) -> dict[str, Any]:
    """Check the decoded JSON body is an object; raise :class:`BadRequest` otherwise."""
    if not isinstance(raw, dict):
        raise BadRequest(f"request body must be a JSON object, got {type(raw).__name__}")
    return raw


def _id_value(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int):
        text = str(value).strip()
        return text or None
    return None


def header(headers: Mapping[str, str], name: str) -> str:
    """Header ``name``, stripped ('' when absent), matched case-insensitively even when
    ``headers`` is a plain dict (aiohttp's are case-insensitive already)."""
    value = headers.get(name)
    if value is None:
        low = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == low), "")
    return value.strip()


def session_identity(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    new_id: Callable[[], str],
    *,
    claude_metadata: str | None = None,
) -> tuple[str, IdSource]:
    """The session id of a request and where it came from (module docstring);
    ``claude_metadata`` is the session uuid of a Messages request's ``metadata.user_id``."""
    sid, source = _named_session(headers, body, claude_metadata)
    if sid is None:
        return new_id(), "generated"
    agent = header(headers, CLAUDE_AGENT_HEADER) if source in _CLAUDE_SOURCES else ""
    return (sub_agent_session(sid, agent) if agent else sid), source


def _named_session(
    headers: Mapping[str, str], body: Mapping[str, Any], claude_metadata: str | None
) -> tuple[str | None, IdSource]:
    if claude_metadata:
        return claude_metadata, "metadata"
    for name, source in _ID_HEADERS:
        value = header(headers, name)
        if value:
            return value, source
    user = _id_value(body.get("user"))
    if user is not None:
        return user, "user"
    program = _id_value(body.get("program_id"))
    if program is not None:
        return program, "program_id"
    return None, "generated"


_ID_HEADERS: Final[tuple[tuple[str, IdSource], ...]] = (
    (CLAUDE_SESSION_HEADER, "claude_header"),
    (SESSION_HEADER, "header"),
    (AFFINITY_HEADER, "affinity"),
)
_CLAUDE_SOURCES: Final = frozenset({"metadata", "claude_header"})


def parent_session(headers: Mapping[str, str], session_id: str) -> str | None:
    """The session that started ``session_id`` as a sub-agent (module docstring), else
    ``None``: OpenCode's ``x-parent-session-id``, or the Claude Code session a sub-agent
    session was made from."""
    parent = header(headers, PARENT_HEADER)
    agent = header(headers, CLAUDE_AGENT_HEADER)
    suffix = SUB_AGENT_INFIX + agent
    if not parent and agent and session_id.endswith(suffix):
        parent = session_id[: -len(suffix)]
    if not parent or len(parent) > MAX_ID_CHARS or parent == session_id:
        return None
    return parent


def harness_from_agent(headers: Mapping[str, str]) -> str | None:
    """The harness a ``User-Agent`` names (:data:`AGENT_HARNESSES`), else ``None``."""
    agent = header(headers, "User-Agent")
    return next((h for prefix, h in AGENT_HARNESSES if agent.startswith(prefix)), None)


def harness_of(headers: Mapping[str, str]) -> str | None:
    """The harness named by ``X-TAO-Harness`` (stripped), ``None`` when absent or blank;
    raise :class:`BadRequest` when it is longer than :data:`MAX_HARNESS_CHARS`."""
    value = header(headers, HARNESS_HEADER)
    if len(value) > MAX_HARNESS_CHARS:
        raise BadRequest(
            f"header {HARNESS_HEADER} must be at most {MAX_HARNESS_CHARS} characters, "
            f"got {len(value)}"
        )
    return value or None


def upstream_body(
    body: Mapping[str, Any], *, stream: bool, token_ids: bool = False
) -> dict[str, Any]:
    """The body to forward: gateway-only fields removed, usage requested when ``stream``, and
    ``return_token_ids`` set when ``token_ids``."""
    out = {
        k: v
        for k, v in body.items()
        if k != "program_id" and (not k.startswith("tao_") or k in _KEEP_PRIVATE)
    }
    if stream:
        options = out.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        if not options.get("include_usage"):
            options["include_usage"] = True
        out["stream_options"] = options
    if token_ids:
        out["return_token_ids"] = True
    return out


def _text_chars(content: object) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                total += len(text) if isinstance(text, str) else 0
            elif isinstance(part, str):
                total += len(part)
        return total
    return 0


def _message_chars(message: object) -> int:
    if not isinstance(message, dict):
        return 0
    total = _text_chars(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict):
                total += _text_chars(fn.get("name")) + _text_chars(fn.get("arguments"))
    return total


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Prompt size in tokens, estimated as characters / 4 (module docstring); 0 if unknown."""
    messages = body.get("messages")
    if isinstance(messages, list):
        chars = sum(_message_chars(m) for m in messages)
        return -(-chars // CHARS_PER_TOKEN)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return -(-len(prompt) // CHARS_PER_TOKEN)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return len(prompt)  # token ids: exact
        if all(isinstance(t, list) for t in prompt):
            return sum(len(t) for t in prompt)
        return -(-sum(_text_chars(p) for p in prompt) // CHARS_PER_TOKEN)
    return 0


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def describe_request(body: Mapping[str, Any], *, chat: bool) -> RequestInfo:
    """Read model, stream flag, limits and size from a chat (``chat``) or completions body."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"'model' must be a string, got {type(model).__name__}")
    messages = body.get("messages")
    if chat and not isinstance(messages, list):
        raise BadRequest("'messages' must be a list of messages")
    if not chat and "prompt" not in body:
        raise BadRequest("'prompt' is required")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    return RequestInfo(
        model=model or "",
        stream=stream,
        max_tokens=_max_tokens(body),
        messages_count=len(messages) if isinstance(messages, list) else 0,
        prompt_tokens_estimate=estimate_prompt_tokens(body),
        client_wants_usage=wants_usage,
    )
