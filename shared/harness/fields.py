"""Field readers for hook payloads: each fault raises :class:`HookPayloadError` naming the field.

Shared by the Claude Code, OpenCode, OpenHands and mini-swe-agent mappers (pure: no I/O, no
clock). A :class:`Fields` is bound to one harness, so every error says whose payload was bad,
which field (as a dotted path, ``input.callID``) and what was wrong (``expected a string, got
int``).
Decoding the payload bytes (size, JSON, object) is the tools service's
(``services/tools/hooks.py`` ``decode_hook``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from shared.contracts.errors import SubjectError
from shared.contracts.subjects import escape_token

from .base import HookPayloadError

__all__ = ["Fields", "trim_oldest"]

_EMPTY: Final[Mapping[str, Any]] = {}


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


class Fields:
    """Readers of ``harness``'s payload fields. ``path`` is the dotted prefix of ``m``'s keys."""

    def __init__(self, harness: str) -> None:
        self.harness = harness

    def error(self, reason: str) -> HookPayloadError:
        return HookPayloadError(self.harness, reason)

    def bad(self, field: str, expected: str, value: object) -> HookPayloadError:
        return self.error(f"{field}: expected {expected}, got {_kind(value)}")

    def text(self, m: Mapping[str, Any], key: str, path: str = "") -> str:
        """A required non-empty string."""
        if key not in m:
            raise self.error(f"{path}{key}: missing")
        value = m[key]
        if not isinstance(value, str):
            raise self.bad(path + key, "a string", value)
        if not value:
            raise self.error(f"{path}{key}: empty")
        return value

    def opt_text(self, m: Mapping[str, Any], key: str, path: str = "") -> str | None:
        """An optional string (absent or null: None)."""
        value = m.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(path + key, "a string", value)
        return value

    def session(self, m: Mapping[str, Any], key: str, path: str = "") -> str:
        """A required session id that fits a subject token (``tao.v1.tool.<session>``)."""
        value = self.text(m, key, path)
        try:
            escape_token(value)
        except SubjectError as exc:
            raise self.error(f"{path}{key}: unusable as a session id: {exc.reason}") from exc
        return value

    def obj(self, m: Mapping[str, Any], key: str, path: str = "") -> Mapping[str, Any]:
        """A required object."""
        if key not in m:
            raise self.error(f"{path}{key}: missing")
        value = m[key]
        if not isinstance(value, Mapping):
            raise self.bad(path + key, "an object", value)
        return value

    def opt_obj(self, m: Mapping[str, Any], key: str, path: str = "") -> Mapping[str, Any]:
        """An optional object (absent or null: empty)."""
        value = m.get(key)
        if value is None:
            return _EMPTY
        if not isinstance(value, Mapping):
            raise self.bad(path + key, "an object", value)
        return value

    def number(self, m: Mapping[str, Any], key: str, path: str = "") -> float:
        """A required finite number >= 0."""
        if m.get(key) is None:
            raise self.error(f"{path}{key}: missing")
        value = self.opt_number(m, key, path)
        assert value is not None
        return value

    def opt_number(
        self, m: Mapping[str, Any], key: str, path: str = "", *, expected: str = "a number"
    ) -> float | None:
        """An optional finite number >= 0 (absent or null: None); ``expected`` names it in the
        error (``"a number of milliseconds"``)."""
        value = m.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.bad(path + key, expected, value)
        if not math.isfinite(value) or value < 0:
            raise self.error(f"{path}{key}: must be >= 0 and finite, got {value}")
        return float(value)

    def opt_int(self, m: Mapping[str, Any], key: str, path: str = "") -> int | None:
        """An optional integer, any sign (absent or null: None)."""
        value = m.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.bad(path + key, "an integer", value)
        return value

    def flag(self, m: Mapping[str, Any], key: str, path: str = "") -> bool:
        """An optional boolean (absent or null: false)."""
        value = m.get(key)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise self.bad(path + key, "a boolean", value)
        return value

    def millis(self, at: float, what: str) -> int:
        """``at`` (epoch seconds) in whole milliseconds, for ids made from times."""
        ms = at * 1000.0
        if not math.isfinite(ms):
            raise self.error(f"{what}: time out of range: {at}")
        return round(ms)


def trim_oldest(d: OrderedDict[Any, Any], limit: int) -> None:
    """Forget ``d``'s oldest entries until at most ``limit`` remain (bounded mapper memory)."""
    while len(d) > limit:
        d.popitem(last=False)
