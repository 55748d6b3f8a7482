"""TOML configuration files: one reader with one error per file kind, and reloading on change.

:func:`read_toml` reads a file into a document or raises the caller's
:class:`~shared.infra.errors.ConfigFileError` subclass naming the file and what is wrong
(unreadable, not UTF-8, not TOML). :class:`Reloading` keeps what a loader made of a file and
makes it again when the file's modification time or size changes (checked at most every
``every_s`` seconds); a file that turns invalid keeps the last good value and reports the
error once through ``on_error`` — so a key rotation is a file edit, never a restart.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from .errors import ConfigFileError

__all__ = ["Reloading", "read_toml", "tables"]

T = TypeVar("T")
E = TypeVar("E", bound=ConfigFileError)


def read_toml(path: str | Path, error: type[ConfigFileError]) -> dict[str, Any]:
    """The TOML document at ``path``; ``error(path, reason)`` when it cannot be read."""
    name = str(path)
    try:
        with open(Path(path).expanduser(), "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise error(name, f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(name, f"not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # tomllib decodes the bytes first
        raise error(name, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def tables(doc: Mapping[str, Any], name: str) -> list[Any]:
    """The ``[[name]]`` tables of a document that holds nothing else; :class:`ValueError`
    names an unknown top-level key, or a ``name`` that is no array of tables."""
    extra = sorted(set(doc) - {name})
    if extra:
        keys = ", ".join(repr(k) for k in extra)
        raise ValueError(f"unknown top-level key(s) {keys}; expected [[{name}]] tables")
    found = doc.get(name, [])
    if not isinstance(found, list):
        raise ValueError(f"{name} must be an array of tables ([[{name}]])")
    return found


class Reloading(Generic[T]):
    """``load(path)``, made again when the file changes (module docstring). The first load's
    error is the caller's to handle; later ones keep the last good value."""

    def __init__(
        self,
        path: str | Path,
        load: Callable[[Path], T],
        *,
        clock: Callable[[], float],
        every_s: float = 1.0,
        on_error: Callable[[ConfigFileError], None] | None = None,
    ) -> None:
        self.path = Path(path).expanduser()
        self.load = load
        self.clock = clock
        self.every_s = every_s
        self.on_error = on_error
        self.value = load(self.path)
        self._stamp = self._stat()
        self._checked = clock()
        self.reloads = 0

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def current(self) -> T:
        now = self.clock()
        if now - self._checked < self.every_s:
            return self.value
        self._checked = now
        stamp = self._stat()
        if stamp == self._stamp:
            return self.value
        self._stamp = stamp
        try:
            self.value = self.load(self.path)
            self.reloads += 1
        except ConfigFileError as exc:
            if self.on_error is not None:
                self.on_error(exc)
        return self.value
