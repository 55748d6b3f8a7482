"""What the gateway reads from an incoming OpenAI request, and what it sends upstream (pure).

* **Session identity** (DESIGN §4, gateway; docs/harnesses.md): harnesses already name their
  session on every model request, so a harness with no TAO hook still keeps its session
  together. The first of these that is present (and not blank) wins:

  1. ``metadata.user_id``'s session uuid (``/v1/messages`` only; Claude Code, :mod:`.anthropic`);
  2. header ``X-Claude-Code-Session-Id`` (Claude Code since 2.1.86; the same uuid);
  3. header ``X-Session-ID`` (TAO's own: the OpenCode plugin, mini-swe-agent's
     ``extra_headers``, any client; OpenCode 1.x sends it itself as ``X-Session-Id``);
  4. header ``x-session-affinity`` (OpenCode 1.x, for providers other than its own);
  5. header ``X-SMG-Routing-Key`` (SGLang's model gateway routes a conversation by it);
  6. header ``X-Dynamo-Session-ID`` (NVIDIA Dynamo's session header; AIPerf sends it, set to
     its per-conversation correlation id, for Dynamo; docs/harnesses.md);
  7. header ``session-id``, then ``session_id`` (Codex CLI: its conversation id on every
     Responses request; 0.171.0 sends ``session-id`` and ``thread-id``, captured by
     tests/harness; earlier releases ``session_id``, codex-rs/codex-api/src/requests/headers.rs
     ``build_conversation_headers``);
  8. header ``X-Correlation-ID`` (AIPerf: one id per conversation, the same on all its turns;
     last among the headers, as other clients may send one per request);
  9. the body's ``session_id`` (OpenRouter's session field, the body form of its
     ``x-session-id`` header; Cline's OpenRouter provider sends its session id there on every
     request, docs/harnesses.md "Cline"), then the body's ``conversation_id`` (vLLM's
     multi-turn benchmark with ``--send-conversation-id``); strings, else 400
     (:data:`FIELD_TYPES`);
  10. ``previous_response_id`` (``/v1/responses``): the session of the response it names,
     which the gateway remembers for every response it served (:class:`ResponseIds`);
  11. the body's ``user`` (OpenAI's end-user field), then ``program_id`` (ThunderAgent's field);
  12. the conversation itself: a request that extends a live session's last request and answer
      joins that session (:mod:`.continuation`; the relay asks it, source ``continued``);
  13. none: a new session under a generated id. One whose conversation can be continued
      (chat, messages, responses) stays open for its continuation, and ends by TAO's idle
      timeout; one that cannot (``/v1/completions``) is one-turn, ended after its response.

  Claude Code's ids come first because its hook payloads report that same uuid, so requests
  and tool events meet in one session even when a client also sets ``X-Session-ID``. Explicit
  ids (1-11) always win over content (12). Every id is checked before any is used
  (:mod:`.ids`: length, control characters). Where a new key goes: a header among the headers,
  a body field after them, a per-conversation id before an end-user one (``user``). OpenAI's
  ``prompt_cache_key`` is not read: it names a cached prefix, which OpenAI's docs advise
  sharing across requests with a common prefix (docs/harnesses.md).
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
  ``program_id``, ``session_id`` and every ``tao_*`` field except ``tao_script``, which the
  sim node reads.
  Streaming requests ask the node for usage (``stream_options.include_usage``) so the gateway
  can report it; :attr:`RequestInfo.client_wants_usage` says whether the client asked itself.
  With ``token_ids`` the body asks for ``return_token_ids`` too (:mod:`.tokenids`).
* **Body** (:func:`read_body`, the one place a model request's body is decoded, for every
  endpoint and for the multi-domain router): strict JSON with orjson, so text is valid UTF-8
  with no lone surrogate (escaped or not) and every number is finite (``NaN``, ``Infinity``
  and ``1e400`` are refused); at most :data:`MAX_BODY_DEPTH` levels of arrays and objects
  and at most ``TAO_MAX_BODY_ITEMS`` items, both checked on the bytes before any parsing
  (:mod:`.jsonscan`); a JSON object whose fields the gateway reads have their types
  (:data:`FIELD_TYPES`; ``null`` counts as absent). Anything else is a :class:`BadRequest`
  (HTTP 400) whose message names the field, as a path like ``messages[0].content``, never a
  500.
* **Prompt size estimate**: characters / 4 of the message texts (or of the completion prompt),
  a common rule of thumb for English BPE tokenisers (OpenAI, "What are tokens and how to count
  them", help.openai.com: "1 token ~= 4 chars in English"). Token-id prompts count exactly. The
  node's usage replaces the estimate once the response arrives.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson

from services.gateway import jsonscan
from shared.harness.claude import SUB_AGENT_INFIX, sub_agent_session
from shared.infra.settings import DEFAULT_MAX_BODY_ITEMS

__all__ = [
    "AFFINITY_HEADER",
    "AGENT_HARNESSES",
    "CHARS_PER_TOKEN",
    "CLAUDE_AGENT_HEADER",
    "CLAUDE_SESSION_HEADER",
    "CODEX_SESSION_HEADER",
    "CONVERSATION_FIELD",
    "CORRELATION_HEADER",
    "DYNAMO_SESSION_HEADER",
    "FIELD_TYPES",
    "HARNESS_HEADER",
    "ID_BODY_FIELDS",
    "ID_HEADERS",
    "MAX_BODY_DEPTH",
    "MAX_HARNESS_CHARS",
    "MAX_ID_CHARS",
    "PARENT_HEADER",
    "SESSION_FIELD",
    "SESSION_HEADER",
    "SMG_HEADER",
    "BadRequest",
    "IdSource",
    "RequestInfo",
    "check_headers",
    "describe_request",
    "estimate_prompt_tokens",
    "harness_from_agent",
    "harness_of",
    "header",
    "json_path",
    "parent_session",
    "parse_body",
    "read_body",
    "read_json",
    "session_identity",
    "upstream_body",
]

SESSION_HEADER: Final = "X-Session-ID"
CLAUDE_SESSION_HEADER: Final = "X-Claude-Code-Session-Id"
AFFINITY_HEADER: Final = "x-session-affinity"
PARENT_HEADER: Final = "x-parent-session-id"
CLAUDE_AGENT_HEADER: Final = "x-claude-code-agent-id"
HARNESS_HEADER: Final = "X-TAO-Harness"
SMG_HEADER: Final = "X-SMG-Routing-Key"
DYNAMO_SESSION_HEADER: Final = "X-Dynamo-Session-ID"
CORRELATION_HEADER: Final = "X-Correlation-ID"
CODEX_SESSION_HEADER: Final = "session-id"
CODEX_LEGACY_SESSION_HEADER: Final = "session_id"
SESSION_FIELD: Final = "session_id"
"""The body field that names a session (OpenRouter's; sent by Cline's OpenRouter provider)."""
CONVERSATION_FIELD: Final = "conversation_id"
"""The body field vLLM's multi-turn benchmark names its conversation with."""
MAX_HARNESS_CHARS: Final = 128
MAX_ID_CHARS: Final = 512
"""Longest parent session id read (a subject token's limit, ``subjects.MAX_TOKEN_LEN``)."""
AGENT_HARNESSES: Final = (
    ("claude-cli/", "claude-code"),
    ("opencode/", "opencode"),
    ("codex_exec/", "codex"),
    ("codex_cli_rs/", "codex"),
)
"""``User-Agent`` prefixes that name a harness: Claude Code 2.1.197 sends ``claude-cli/<version>
(external, sdk-cli)``, OpenCode 1.18.33 ``opencode/<version> ai-sdk/…``, Codex CLI
``codex_exec/<version> …`` from ``codex exec`` and ``codex_cli_rs/<version> …`` interactive
(tests/harness)."""
CHARS_PER_TOKEN: Final = 4
_KEEP_PRIVATE: Final = frozenset({"tao_script"})
_GATEWAY_FIELDS: Final = frozenset({"program_id", SESSION_FIELD, CONVERSATION_FIELD})
"""Body fields the gateway reads and the node does not: removed upstream."""

IdSource = Literal[
    "header",
    "user",
    "program_id",
    "metadata",
    "claude_header",
    "affinity",
    "smg",
    "dynamo",
    "codex",
    "correlation",
    "session_field",
    "conversation_field",
    "previous_response",
    "continued",
    "generated",
]
"""Where a session id came from; ``metadata`` / ``claude_header``: Claude Code's
``metadata.user_id`` / ``X-Claude-Code-Session-Id`` (:mod:`.anthropic`); ``affinity``:
OpenCode's ``x-session-affinity``; ``smg``: ``X-SMG-Routing-Key``; ``dynamo``:
``X-Dynamo-Session-ID``; ``codex``: Codex's ``session_id`` header; ``correlation``:
``X-Correlation-ID``; ``session_field`` / ``conversation_field``: the body's ``session_id`` /
``conversation_id``; ``previous_response``: a
served response's session; ``continued``: the conversation's content (:mod:`.continuation`)."""


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


MAX_BODY_DEPTH: Final = 128
"""The deepest nesting of arrays and objects a request body may have (the body itself is
level 1). Agents' requests nest far less (a tool's JSON schema in a Claude Code request: about
ten levels); orjson, which encodes the body again for the node, refuses more than 254 levels,
and the gateway's own readers recurse at most this deep."""

_TOO_DEEP: Final = f"request body nests deeper than {MAX_BODY_DEPTH} levels of arrays and objects"
_INT64: Final = 2**63


def _positive_int(value: object) -> bool:
    return type(value) is int and 1 <= value < _INT64


def _session_name(value: object) -> bool:
    return type(value) is str or (type(value) is int and -_INT64 <= value < _INT64)


FIELD_TYPES: Final[tuple[tuple[str, str, Callable[[object], bool]], ...]] = (
    ("model", "a string", lambda v: type(v) is str),
    ("messages", "a list", lambda v: type(v) is list),
    ("prompt", "a string or a list", lambda v: type(v) in (str, list)),
    ("stream", "a boolean (true or false)", lambda v: type(v) is bool),
    ("stream_options", "an object", lambda v: type(v) is dict),
    ("max_tokens", f"an integer from 1 to {_INT64 - 1}", _positive_int),
    ("max_completion_tokens", f"an integer from 1 to {_INT64 - 1}", _positive_int),
    ("user", "a string", lambda v: type(v) is str),
    (SESSION_FIELD, "a string", lambda v: type(v) is str),
    (CONVERSATION_FIELD, "a string", lambda v: type(v) is str),
    ("program_id", "a string or an integer", _session_name),
    ("metadata", "an object", lambda v: type(v) is dict),
    ("return_token_ids", "a boolean (true or false)", lambda v: type(v) is bool),
    ("input", "a string or a list", lambda v: type(v) in (str, list)),
    ("instructions", "a string", lambda v: type(v) is str),
    ("max_output_tokens", f"an integer from 1 to {_INT64 - 1}", _positive_int),
    ("previous_response_id", "a string", lambda v: type(v) is str),
)
"""The body fields the gateway reads, what each must be, and its check (``null`` is absent).
The endpoint's own rules come after (:func:`describe_request`,
:func:`.anthropic.describe_messages`)."""


def _kind(value: object) -> str:
    """A JSON value's kind, for error messages."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int():
            return "an integer"
        case float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "a list"
        case dict():
            return "an object"
    return type(value).__name__


def parse_body(raw: object) -> dict[str, Any]:
    """The decoded JSON body as an object whose fields in :data:`FIELD_TYPES` have their
    types; raise :class:`BadRequest` naming the first field that does not."""
    if not isinstance(raw, dict):
        raise BadRequest(f"request body must be a JSON object, got {_kind(raw)}")
    for name, want, check in FIELD_TYPES:
        value = raw.get(name)
        if value is not None and not check(value):
            raise BadRequest(f"'{name}' must be {want}, got {_kind(value)}")
    metadata = raw.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if user_id is not None and type(user_id) is not str:
        raise BadRequest(f"'metadata.user_id' must be a string, got {_kind(user_id)}")
    return raw


def read_body(data: bytes) -> dict[str, Any]:
    """Decode and check a model request's body (module docstring, "Body"): the object, or
    :class:`BadRequest` naming what is wrong and where."""
    return parse_body(read_json(data))


def read_json(data: bytes, *, max_items: int = DEFAULT_MAX_BODY_ITEMS) -> object:
    """``data`` as strict JSON nesting at most :data:`MAX_BODY_DEPTH` levels and holding at
    most ``max_items`` items (a model request's or a hook's body), or :class:`BadRequest`
    naming what is wrong and where. The shape is checked on the bytes first
    (:func:`.jsonscan.scan`, stopping at the first violation), so a body past either limit
    is never parsed."""
    code, at = jsonscan.scan(data, MAX_BODY_DEPTH, max_items)
    if code != jsonscan.SCAN_OK:
        if code == jsonscan.TOO_DEEP:
            head = data[:at].decode("utf-8", "replace")
            raise BadRequest(_TOO_DEEP + _at(_path_at(head, len(head))))
        # Past max_items there are more tokens than items (each item has its comma or its
        # container's bracket), so from _PATH_SCAN_TOKENS items on the path walk would end
        # empty: not walked (it held the GIL 50-130 ms on a 30 MB body: benchmarks/body_work.py)
        where = ""
        if max_items < _PATH_SCAN_TOKENS:
            head = data[:at].decode("utf-8", "replace")
            where = _at(_path_at(head, len(head)))
        raise BadRequest(
            f"request body has more than {max_items} items (array elements and object "
            f"members; TAO_MAX_BODY_ITEMS){where}"
        )
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(_not_json(data, exc)) from None


_PATH_SHOWN: Final = 8
"""Path components an error message shows; a longer path ends in ``…``."""
_TOKEN: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{},:]')
"""A JSON string (closed or not: it may run to where decoding stopped) or a structural
character; what lies between (numbers, literals, blanks) does not move the path."""
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PATH_SCAN_TOKENS: Final = 200_000
"""Tokens :func:`_path_at` reads at most (tens of milliseconds), whatever the body's size."""


def json_path(path: Sequence[str | int]) -> str:
    """A path from the body's top as error messages write it: ``messages[0].content``, a key
    that is not a plain name quoted (``metadata["a b"]``)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _NAME.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{orjson.dumps(part).decode()}]"
    return out


def _at(path: list[str | int]) -> str:
    """`` at 'messages[0].content'`` (its first :data:`_PATH_SHOWN` parts), '' for the body."""
    if not path:
        return ""
    more = len(path) - _PATH_SHOWN
    tail = f"… ({more} levels more)" if more > 0 else ""
    return f" at '{json_path(path[:_PATH_SHOWN])}'{tail}"


def _path_at(text: str, pos: int) -> list[str | int]:
    """The path of the value being read at character ``pos`` of the JSON ``text`` (where a
    decoder stopped): the key or index of each array and object open there; ``[]`` past
    :data:`_PATH_SCAN_TOKENS` tokens (an error message is not worth more time)."""
    frames: list[list[Any]] = []  # [is_object, key or index, expecting a key]
    for n, match in enumerate(_TOKEN.finditer(text, 0, pos)):
        if n == _PATH_SCAN_TOKENS:
            return []
        token = match.group()
        if token == "{":
            frames.append([True, None, True])
        elif token == "[":
            frames.append([False, 0, False])
        elif token in "}]":
            if frames:
                frames.pop()
        elif not frames:
            continue
        elif token == ",":
            top = frames[-1]
            if top[0]:
                top[1], top[2] = None, True
            else:
                top[1] += 1
        elif token == ":":
            frames[-1][2] = False
        elif frames[-1][0] and frames[-1][2]:  # a key
            try:
                frames[-1][1] = orjson.loads(token)
            except orjson.JSONDecodeError:  # the bad text is in the key itself
                frames[-1][1] = token.strip('"')
    return [key for _, key, _ in frames if key is not None]


def _not_json(data: bytes, exc: orjson.JSONDecodeError) -> str:
    """Why ``data`` is not a body the gateway takes, and where (``exc``: orjson's refusal)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as bad:
        head = data[: bad.start].decode("utf-8", "surrogateescape")
        return (
            f"request body is not valid UTF-8: byte 0x{data[bad.start]:02x} at offset "
            f"{bad.start}{_at(_path_at(head, len(head)))}"
        )
    pos = min(max(exc.pos, 0), len(text))
    where = _at(_path_at(text, pos))
    reason = exc.msg
    if "surrogate" in reason:
        return f"request body has invalid Unicode (a lone surrogate escape){where}"
    if "infinity" in reason:
        return f"request body has a number too large to be finite{where}"
    if "depth" in reason:
        return _TOO_DEEP + where
    literal = re.match(r"NaN|Infinity", text[pos : pos + 8])
    if literal:
        sign = "-" if text[pos - 1 : pos] == "-" else ""
        return (
            f"request body has {sign}{literal.group()}, which is not JSON (numbers must be "
            f"finite){where}"
        )
    return f"request body is not JSON: {reason} (line {exc.lineno}, column {exc.colno}){where}"


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
    previous: Callable[[str], str | None] | None = None,
) -> tuple[str, IdSource]:
    """The session id of a request and where it came from (module docstring);
    ``claude_metadata`` is the session uuid of a Messages request's ``metadata.user_id``;
    ``previous`` maps a served response id to its session (``previous_response_id``)."""
    sid, source = _named_session(headers, body, claude_metadata, previous)
    if sid is None:
        return new_id(), "generated"
    agent = header(headers, CLAUDE_AGENT_HEADER) if source in _CLAUDE_SOURCES else ""
    return (sub_agent_session(sid, agent) if agent else sid), source


def _named_session(
    headers: Mapping[str, str],
    body: Mapping[str, Any],
    claude_metadata: str | None,
    previous: Callable[[str], str | None] | None = None,
) -> tuple[str | None, IdSource]:
    if claude_metadata:
        return claude_metadata, "metadata"
    for name, source in _ID_HEADERS:
        value = header(headers, name)
        if value:
            return value, source
    for field, field_source in _ID_FIELDS:
        named = body.get(field)
        if isinstance(named, str) and named.strip():
            return named.strip(), field_source
    chained = body.get("previous_response_id")
    if previous is not None and isinstance(chained, str) and chained.strip():
        found = previous(chained.strip())
        if found is not None:
            return found, "previous_response"
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
    (SMG_HEADER, "smg"),
    (DYNAMO_SESSION_HEADER, "dynamo"),
    (CODEX_SESSION_HEADER, "codex"),
    (CODEX_LEGACY_SESSION_HEADER, "codex"),
    (CORRELATION_HEADER, "correlation"),
)
ID_HEADERS: Final = tuple(name for name, _ in _ID_HEADERS)
"""The headers that name a session, in the order they are read."""
_ID_FIELDS: Final[tuple[tuple[str, IdSource], ...]] = (
    (SESSION_FIELD, "session_field"),
    (CONVERSATION_FIELD, "conversation_field"),
)
ID_BODY_FIELDS: Final = (SESSION_FIELD, CONVERSATION_FIELD, "user", "program_id")
"""The body fields that name a session (``previous_response_id`` names a response)."""
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


_READ_HEADERS: Final = (
    *ID_HEADERS,
    PARENT_HEADER,
    CLAUDE_AGENT_HEADER,
    HARNESS_HEADER,
)


def check_headers(headers: Mapping[str, str]) -> None:
    """Raise :class:`BadRequest` naming the first header the gateway reads whose value is not
    UTF-8 (the server passes such bytes on as lone surrogates, which no message can carry)."""
    for name in _READ_HEADERS:
        try:
            header(headers, name).encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"header {name} is not valid UTF-8") from None


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
        if k not in _GATEWAY_FIELDS and (not k.startswith("tao_") or k in _KEEP_PRIVATE)
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
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
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
    if chat and isinstance(messages, list):
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(message, dict) or not isinstance(content, str | list | None):
                raise BadRequest(
                    f"'messages[{i}]' must be an object whose 'content' is a string, a list "
                    f"or null, got {_kind(message if not isinstance(message, dict) else content)}"
                )
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
