"""The ids a client names, checked before the gateway remembers or forwards any of them (pure).

A session id reaches the bus as a subject token, the node as an ``X-Session-ID`` header, and
several of the gateway's maps as a key (the domain router, the hook limiter, the response-id
table). So every id a request names is checked first, whether or not it is the one that wins
(:mod:`.requests`, "Session identity"), and a bad one is a 400 that names where it was:

* at most :data:`~.requests.MAX_ID_CHARS` (512) characters, the longest subject token
  (``shared.contracts.subjects.MAX_TOKEN_LEN``);
* no control character (Unicode category ``Cc``: C0 controls including NUL, tab, CR and LF;
  DEL; C1 controls). aiohttp refuses a header value with CR, LF or NUL, so such an id gave a
  500 while forwarding, after the session was registered; a control character never belongs
  in an id, so none is taken.

The ids checked: every session header the gateway reads (:data:`~.requests.ID_HEADERS`), the
parent and sub-agent headers, the body's ``session_id``, ``conversation_id``, ``user`` and
``program_id``, a Messages request's ``metadata.user_id`` session, and the id in
``DELETE /v1/sessions/{id}`` and in a hook post. A parent header longer than the cap is
ignored, as before (:func:`.requests.parent_session`), but one with a control character is
refused. Blank ids are not errors: they name nothing and the next source is read.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from services.gateway.requests import (
    CLAUDE_AGENT_HEADER,
    ID_BODY_FIELDS,
    ID_HEADERS,
    MAX_ID_CHARS,
    PARENT_HEADER,
    BadRequest,
    header,
)

__all__ = ["check_id", "check_ids", "id_problem"]

_SHOWN: Final = 40
"""Characters of a refused id quoted in the message (an id may be a megabyte)."""


def id_problem(value: str, *, limit: int | None = MAX_ID_CHARS) -> str | None:
    """Why ``value`` is no id (too long, or a control character and where), else ``None``;
    ``limit`` ``None``: no length cap."""
    if limit is not None and len(value) > limit:
        return f"must be at most {limit} characters, got {len(value)}"
    for i, ch in enumerate(value):
        if unicodedata.category(ch) == "Cc":
            return f"must not contain control characters, got U+{ord(ch):04X} at position {i}"
    return None


def check_id(value: str, where: str, *, limit: int | None = MAX_ID_CHARS) -> None:
    """Raise :class:`BadRequest` naming ``where`` (``header X-Session-ID``, ``'user'``) when
    ``value`` is no id (:func:`id_problem`)."""
    problem = id_problem(value, limit=limit)
    if problem is not None:
        head = value[:_SHOWN].encode("unicode_escape").decode("ascii")
        more = "…" if len(value) > _SHOWN else ""
        raise BadRequest(f"{where} {problem} ('{head}{more}')")


def check_ids(
    headers: Mapping[str, str], body: Mapping[str, Any], *, claude_metadata: str | None = None
) -> None:
    """Check every id a model request names (module docstring); raise :class:`BadRequest`
    naming the first that is bad. ``claude_metadata``: the session uuid read from a Messages
    request's ``metadata.user_id``."""
    if claude_metadata:
        check_id(claude_metadata, "'metadata.user_id' session")
    for name in (*ID_HEADERS, CLAUDE_AGENT_HEADER):
        value = header(headers, name)
        if value:
            check_id(value, f"header {name}")
    parent = header(headers, PARENT_HEADER)
    if parent:
        check_id(parent, f"header {PARENT_HEADER}", limit=None)
    for name in ID_BODY_FIELDS:
        raw = body.get(name)
        if isinstance(raw, str | int) and not isinstance(raw, bool):
            text = str(raw).strip()
            if text:
                check_id(text, f"'{name}'")
