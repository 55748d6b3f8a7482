"""The shape of a JSON body, read from its bytes before any tree is built.

A request body's cost to the gateway is set less by its size than by its shape: 33 MB of
``[{},{},…]`` is eleven million Python dicts once parsed (a second of parsing that holds the
GIL, a gigabyte of memory), where 33 MB of message text is a few strings. :func:`scan` walks
the bytes once and stops at the first place where the body nests deeper than ``max_depth``
levels or holds more than ``max_items`` items, so a body past either limit is refused without
being parsed. An *item* is an array element or an object member (a key and its value): the
values a parser would make, less the body itself.

The walk knows only what it needs for that: strings (with their escapes, so a bracket inside a
string is text) and the structural characters ``{ } [ ] ,``. It does not validate JSON: a body
that is not JSON is refused by the parser that runs after it, and whatever the walk reports of
such a body is a refusal too. The kernel is compiled with numba ``nogil``, so the gateway runs
it in a worker thread while its event loop goes on; :func:`scan_reference` is the slow, obvious
version tests compare it with.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np

__all__ = ["SCAN_OK", "TOO_DEEP", "TOO_MANY_ITEMS", "scan", "scan_reference", "warm"]

SCAN_OK: Final = 0
TOO_DEEP: Final = 1
"""An array or object opens deeper than ``max_depth`` levels (the body itself is level 1)."""
TOO_MANY_ITEMS: Final = 2
"""The ``max_items + 1``-th item starts."""

_QUOTE: Final = 0x22
_BACKSLASH: Final = 0x5C
_COMMA: Final = 0x2C
_OPENS: Final = (0x5B, 0x7B)  # [ {
_CLOSES: Final = (0x5D, 0x7D)  # ] }
_BLANKS: Final = (0x20, 0x09, 0x0A, 0x0D)


@numba.njit(cache=True, nogil=True)
def _scan(data: np.ndarray, max_depth: int, max_items: int) -> tuple[int, int]:  # pragma: no cover
    depth = 0
    items = 0
    first = False  # an array or object just opened: its first item has not started
    i = 0
    n = data.shape[0]
    while i < n:
        c = data[i]
        if c == 0x20 or c == 0x09 or c == 0x0A or c == 0x0D:
            i += 1
            continue
        if first:
            first = False
            if c != 0x5D and c != 0x7D:
                items += 1
                if items > max_items:
                    return 2, i
        if c == 0x22:  # a string: skip to its closing quote, escapes included
            i += 1
            while i < n:
                d = data[i]
                if d == 0x5C:
                    i += 2
                    continue
                if d == 0x22:
                    break
                i += 1
        elif c == 0x5B or c == 0x7B:
            depth += 1
            if depth > max_depth:
                return 1, i
            first = True
        elif c == 0x5D or c == 0x7D:
            depth -= 1
        elif c == 0x2C:
            items += 1
            if items > max_items:
                return 2, i
        i += 1
    return 0, n


def scan(data: bytes, max_depth: int, max_items: int) -> tuple[int, int]:
    """``(SCAN_OK, len(data))``, or the first violation as ``(TOO_DEEP, offset of the bracket
    that opens too deep)`` or ``(TOO_MANY_ITEMS, offset where the item past the limit
    starts)`` (module docstring). Releases the GIL while it runs (compiled)."""
    code, at = _scan(np.frombuffer(data, dtype=np.uint8), max_depth, max_items)
    return int(code), int(at)


def scan_reference(data: bytes, max_depth: int, max_items: int) -> tuple[int, int]:
    """:func:`scan` written plainly, character by character (the oracle of its tests)."""
    depth = items = 0
    first = in_string = escaped = False
    for i, c in enumerate(data):
        if in_string:
            if escaped:
                escaped = False
            elif c == _BACKSLASH:
                escaped = True
            elif c == _QUOTE:
                in_string = False
            continue
        if c in _BLANKS:
            continue
        if first:
            first = False
            if c not in _CLOSES:
                items += 1
                if items > max_items:
                    return TOO_MANY_ITEMS, i
        if c == _QUOTE:
            in_string = True
        elif c in _OPENS:
            depth += 1
            if depth > max_depth:
                return TOO_DEEP, i
            first = True
        elif c in _CLOSES:
            depth -= 1
        elif c == _COMMA:
            items += 1
            if items > max_items:
                return TOO_MANY_ITEMS, i
    return SCAN_OK, len(data)


def warm() -> None:
    """Compile the kernel (or load it from numba's cache) now, not on the first request."""
    scan(b'{"a":[1]}', 2, 2)
