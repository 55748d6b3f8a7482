"""Every NATS subject and JetStream stream name TAO uses, built by small functions.

All subjects start with the versioned prefix ``tao.v1``; a breaking wire change gets ``tao.v2``.

    tao.v1.tool.<session>                  ToolStart | ToolEnd | ToolProgress   (stream TAO_V1_TOOL)
    tao.v1.session.<kind>.<session>        request | response | cancel | end  (TAO_V1_SESSION)
    tao.v1.node.status.<node>              NodeStatus                          (core NATS)
    tao.v1.kv.<node>                       vLLM KV-event payload bytes, as sent (stream TAO_V1_KV)
    tao.v1.hook.<harness>                  harness hook payload bytes, as sent (stream TAO_V1_HOOK)
    tao.v1.inspect.<what>                  request/reply to telemetry (`tao inspect`) (core NATS)
    tao.v1.valuation.snapshot              ValuationSnapshot                   (core NATS)
    tao.v1.plan                            Plan                                (core NATS)
    tao.v1.wake                            Wake                                (core NATS)
    tao.v1.domain.load                     DomainLoadReport                    (core NATS)
    tao.v1.placement.<gateway>             Placement                   (stream TAO_V1_PLACEMENT)
    tao.v1.dlq.<service>                   DeadLetter                          (stream TAO_V1_DLQ)

Leader election uses the JetStream KV bucket ``TAO_V1_LEASE`` (:data:`LEASE_BUCKET`; namespaced
like the streams), key ``<role>.<domain>`` (shared/infra/lease.py).

Streams hold what must not be lost (tool and session events, KV events, placements, dead
letters); durable consumers let a restarted service resume. Node status, snapshots and plans are
superseded every tick and go over core NATS.

Tokens. A subject token may not contain ``.``, ``*``, ``>`` or whitespace. Two rules:

* **Session ids are escaped**, because they come from outside (``X-Session-ID``, the OpenAI
  ``user`` field, harness ids) and may be anything. :func:`escape_token` keeps
  ``[A-Za-z0-9_-]`` and writes every other character as ``~XX`` per UTF-8 byte (upper-case hex;
  ``~`` itself becomes ``~7E``), so the mapping is deterministic and reversible
  (:func:`unescape_token`): ``alice@example.com`` → ``alice~40example~2Ecom``. UUIDs and
  ``ses_…`` ids pass unchanged. Messages still carry the raw id in their body.
* **Configured names are checked** (node, gateway and service ids, session-event kinds): they
  must match ``[A-Za-z0-9_-]{1,128}``; anything else raises
  :class:`~shared.contracts.errors.SubjectError`, so a misconfiguration fails at start-up.
"""

from __future__ import annotations

import re
from typing import Final, Literal, NamedTuple, get_args

from .base import Message
from .deadletter import DeadLetter
from .domain import DomainLoadReport
from .errors import SubjectError
from .node import NodeStatus
from .plan import Placement, Plan
from .session import SessionCancel, SessionEnd, SessionRequest, SessionResponse
from .tool import ToolEnd, ToolProgress, ToolStart
from .valuation import ValuationSnapshot
from .wake import Wake

__all__ = [
    "ALL_STREAMS",
    "KV_SEQ_HEADER",
    "LEASE_BUCKET",
    "PREFIX",
    "RECEIVED_AT_HEADER",
    "STREAM_DLQ",
    "STREAM_HOOK",
    "STREAM_KV",
    "STREAM_PLACEMENT",
    "STREAM_SESSION",
    "STREAM_TOOL",
    "SessionEventKind",
    "Stream",
    "check_name",
    "dead_letter",
    "dead_letters",
    "domain_load",
    "durable_name",
    "escape_token",
    "hook_events",
    "hook_events_all",
    "inspect",
    "kv_events",
    "kv_events_all",
    "lease_bucket",
    "node_status",
    "node_statuses",
    "placement",
    "placements",
    "plan",
    "session_event",
    "session_events",
    "subject_for",
    "tool_event",
    "tool_events",
    "unescape_token",
    "valuation_snapshot",
    "wake",
]

PREFIX: Final = "tao.v1"
LEASE_BUCKET: Final = "TAO_V1_LEASE"
"""The leader-election KV bucket (``<namespace>_TAO_V1_LEASE`` on a namespaced bus)."""


def lease_bucket(namespace: str) -> str:
    """The lease bucket's name on a bus with ``namespace`` (prefixed as stream names are)."""
    return f"{namespace}_{LEASE_BUCKET}" if namespace else LEASE_BUCKET


MAX_TOKEN_LEN: Final = 512

RECEIVED_AT_HEADER: Final = "Tao-Received-At"
"""NATS header: when the forwarder (the hook process, the gateway's ``/hooks``, ``tao
kv-bridge``) received the payload, as epoch seconds in decimal. Consumers read it with
:func:`shared.infra.busapi.received_at`, which falls back to the delivery time for a missing or
implausible value. ``shared/harness/hookclient.py`` (stdlib only) repeats the literal; a test
keeps it equal."""
KV_SEQ_HEADER: Final = "Tao-KV-Seq"
"""NATS header of a bridged KV-event payload on :func:`kv_events`: the engine's ``seq`` of the
batch, in decimal (vLLM numbers a publisher's batches 0, 1, 2, …)."""

SessionEventKind = Literal["request", "response", "cancel", "end"]
_SESSION_KINDS: Final[frozenset[str]] = frozenset(get_args(SessionEventKind))

_NAME_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,128}")
_SAFE: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPE_RE: Final = re.compile(r"~([0-9A-F]{2})")
_ESCAPED_RE: Final = re.compile(r"(?:[A-Za-z0-9_-]|~[0-9A-F]{2})+")
_SAFE_RE: Final = re.compile(r"[A-Za-z0-9_-]+")
"""Every character in :data:`_SAFE` (one C call, where a generator over the characters is
a Python step per character: twice per tool event in the tools service)."""


# --- tokens ---------------------------------------------------------------------------------


def escape_token(value: str, what: str = "session id") -> str:
    """Escape an external id into one subject token (see the module docstring)."""
    if not value:
        raise SubjectError(what, value, "empty")
    if _SAFE_RE.fullmatch(value):
        token = value
    else:
        token = "".join(
            c if c in _SAFE else "".join(f"~{b:02X}" for b in c.encode()) for c in value
        )
    if len(token) > MAX_TOKEN_LEN:
        raise SubjectError(what, value, f"escaped token longer than {MAX_TOKEN_LEN} characters")
    return token


def unescape_token(token: str, what: str = "session id") -> str:
    """Invert :func:`escape_token`; raise :class:`SubjectError` for a token it cannot produce."""
    if not _ESCAPED_RE.fullmatch(token):
        raise SubjectError(what, token, "not an escaped token")
    parts = _ESCAPE_RE.split(token)  # literal, hex, literal, hex, …, literal
    raw = b"".join(
        bytes.fromhex(part) if i % 2 else part.encode("ascii") for i, part in enumerate(parts)
    )
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubjectError(what, token, "escapes are not valid UTF-8") from exc
    if escape_token(value, what) != token:
        raise SubjectError(what, token, "not in canonical escaped form")
    return value


def check_name(value: str, what: str = "name") -> str:
    """Return ``value`` if it is a valid configured name (``[A-Za-z0-9_-]{1,128}``), else raise."""
    if not _NAME_RE.fullmatch(value):
        raise SubjectError(what, value, "must match [A-Za-z0-9_-]{1,128}")
    return value


# --- subjects -------------------------------------------------------------------------------


def tool_event(session_id: str) -> str:
    """``tao.v1.tool.<session>``: tool start/end/progress of one session."""
    return f"{PREFIX}.tool.{escape_token(session_id)}"


def tool_events() -> str:
    """Wildcard for every session's tool events."""
    return f"{PREFIX}.tool.*"


def session_event(kind: SessionEventKind, session_id: str) -> str:
    """``tao.v1.session.<kind>.<session>``; kind: request, response, cancel or end."""
    if kind not in _SESSION_KINDS:
        raise SubjectError("session event kind", kind, f"must be one of {sorted(_SESSION_KINDS)}")
    return f"{PREFIX}.session.{kind}.{escape_token(session_id)}"


def session_events(kind: SessionEventKind | None = None) -> str:
    """Wildcard for session events, of one ``kind`` or of all kinds."""
    if kind is None:
        return f"{PREFIX}.session.*.*"
    if kind not in _SESSION_KINDS:
        raise SubjectError("session event kind", kind, f"must be one of {sorted(_SESSION_KINDS)}")
    return f"{PREFIX}.session.{kind}.*"


def node_status(node_id: str) -> str:
    """``tao.v1.node.status.<node>``."""
    return f"{PREFIX}.node.status.{check_name(node_id, 'node id')}"


def node_statuses() -> str:
    """Wildcard for every node's status."""
    return f"{PREFIX}.node.status.*"


def kv_events(node_id: str) -> str:
    """``tao.v1.kv.<node>``: one node's vLLM KV-event payloads bridged from ZMQ, bytes unchanged."""
    return f"{PREFIX}.kv.{check_name(node_id, 'node id')}"


def kv_events_all() -> str:
    """Wildcard for every node's bridged KV events."""
    return f"{PREFIX}.kv.*"


def hook_events(harness: str) -> str:
    """``tao.v1.hook.<harness>``: a harness's hook payload, bytes as the harness wrote them.

    The hook process or the gateway's ``POST /hooks/<harness>`` forwards the body unparsed (with
    the receive time in the ``Tao-Received-At`` header); the tools service maps it to tool and
    session events and dead-letters what it cannot read.
    """
    return f"{PREFIX}.hook.{check_name(harness, 'harness')}"


def hook_events_all() -> str:
    """Wildcard for every harness's hook payloads."""
    return f"{PREFIX}.hook.*"


def inspect(what: str) -> str:
    """``tao.v1.inspect.<what>``: a request answered by the telemetry service (core NATS)."""
    return f"{PREFIX}.inspect.{check_name(what, 'inspect target')}"


def valuation_snapshot() -> str:
    """``tao.v1.valuation.snapshot``."""
    return f"{PREFIX}.valuation.snapshot"


def plan() -> str:
    """``tao.v1.plan``."""
    return f"{PREFIX}.plan"


def wake() -> str:
    """``tao.v1.wake``: a change worth an early tick (tool end, arrival)."""
    return f"{PREFIX}.wake"


def domain_load() -> str:
    """``tao.v1.domain.load``: the domain's load each valuation tick (the gateway's choice)."""
    return f"{PREFIX}.domain.load"


def placement(gateway_id: str) -> str:
    """``tao.v1.placement.<gateway>``: placements for the sessions this gateway holds."""
    return f"{PREFIX}.placement.{check_name(gateway_id, 'gateway id')}"


def placements() -> str:
    """Wildcard for every gateway's placements."""
    return f"{PREFIX}.placement.*"


def dead_letter(service: str) -> str:
    """``tao.v1.dlq.<service>``: messages ``service`` rejected."""
    return f"{PREFIX}.dlq.{check_name(service, 'service')}"


def dead_letters() -> str:
    """Wildcard for every service's dead letters."""
    return f"{PREFIX}.dlq.*"


_SESSION_KIND_OF: Final[dict[type[Message], SessionEventKind]] = {
    SessionRequest: "request",
    SessionResponse: "response",
    SessionCancel: "cancel",
    SessionEnd: "end",
}


def subject_for(msg: Message) -> str:
    """The subject a message is published on, derived from its type and fields."""
    match msg:
        case ToolStart() | ToolEnd() | ToolProgress():
            return tool_event(msg.session_id)
        case SessionRequest() | SessionResponse() | SessionCancel() | SessionEnd():
            return session_event(_SESSION_KIND_OF[type(msg)], msg.session_id)
        case NodeStatus():
            return node_status(msg.node_id)
        case ValuationSnapshot():
            return valuation_snapshot()
        case Plan():
            return plan()
        case Placement():
            return placement(msg.gateway_id)
        case DeadLetter():
            return dead_letter(msg.service)
        case Wake():
            return wake()
        case DomainLoadReport():
            return domain_load()
    raise TypeError(f"no subject for {type(msg).__name__}")


# --- JetStream ------------------------------------------------------------------------------


class Stream(NamedTuple):
    """A JetStream stream: its name and the subjects it captures."""

    name: str
    subjects: tuple[str, ...]


STREAM_TOOL: Final = Stream("TAO_V1_TOOL", (tool_events(),))
STREAM_SESSION: Final = Stream("TAO_V1_SESSION", (session_events(),))
STREAM_KV: Final = Stream("TAO_V1_KV", (kv_events_all(),))
STREAM_HOOK: Final = Stream("TAO_V1_HOOK", (hook_events_all(),))
STREAM_PLACEMENT: Final = Stream("TAO_V1_PLACEMENT", (placements(),))
STREAM_DLQ: Final = Stream("TAO_V1_DLQ", (dead_letters(),))
ALL_STREAMS: Final = (
    STREAM_TOOL,
    STREAM_SESSION,
    STREAM_KV,
    STREAM_HOOK,
    STREAM_PLACEMENT,
    STREAM_DLQ,
)


def durable_name(service: str, stream: Stream) -> str:
    """The durable consumer name of ``service`` on ``stream``, e.g. ``tools-TAO_V1_TOOL``."""
    return f"{check_name(service, 'service')}-{stream.name}"
