"""Base classes shared by every TAO wire message.

Conventions (one set, kept everywhere in this package):

* A top-level message subclasses :class:`Message`: a msgspec Struct tagged with
  ``tag_field="type"`` and an explicit tag equal to its class name (``{"type": "ToolStart"}``).
  ``type`` is the field vLLM's own KV events use, so TAO messages and the mirrored vLLM events
  read alike; the tag is spelled out so renaming a class never changes the wire.
* A nested value (usage counters, a node row) subclasses :class:`Record`: untagged.
* Both are ``frozen`` (a decoded message is a value) and ``kw_only`` (construction names every
  field, so adding a defaulted field never shifts a positional argument). Subclasses repeat
  ``frozen=True, kw_only=True``: msgspec inherits them, but type checkers do not.
* Empty containers default through ``msgspec.field(default_factory=...)``.
* Unknown fields are tolerated (``forbid_unknown_fields`` is never set): an older reader skips
  what a newer writer adds. New fields get defaults; a field never changes its meaning; a
  breaking change gets a new subject version (``tao.v2.…``, see :mod:`.subjects`).
* Times are epoch seconds as ``float`` (``time.time()`` in the shell); durations end in ``_s``
  or ``_ms``; token counts are ``int``.
"""

from __future__ import annotations

import msgspec

__all__ = ["Message", "Record"]


class Message(msgspec.Struct, tag_field="type", frozen=True, kw_only=True):
    """Base of every top-level TAO message (tagged by ``type``)."""


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """Base of nested, untagged values inside a message."""
