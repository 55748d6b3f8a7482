"""The byte-level shape check of request bodies (services/gateway/jsonscan.py)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.jsonscan import SCAN_OK, TOO_DEEP, TOO_MANY_ITEMS, scan, scan_reference

_TEXT = st.text(alphabet=st.sampled_from('ab"\\[]{},: \n\u00e9'), max_size=8)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_TEXT, inner, max_size=5),
    max_leaves=40,
)


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def depth(value: Any) -> int:
    """Levels of arrays and objects (the outermost is level 1; a scalar is 0)."""
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


def items(value: Any) -> int:
    """Array elements and object members, at every level."""
    if isinstance(value, list):
        return len(value) + sum(items(v) for v in value)
    if isinstance(value, dict):
        return len(value) + sum(items(v) for v in value.values())
    return 0


class TestAgainstTheParsedTree:
    """On any JSON document the scan counts exactly what a parser builds: it passes at the
    document's own depth and item count, and refuses one less of either."""

    @settings(max_examples=300, deadline=None)
    @given(doc=_JSON, pretty=st.booleans())
    def test_limits_at_and_below_the_documents_own(self, doc: Any, pretty: bool) -> None:
        data = json.dumps(doc, indent=1 if pretty else None).encode()
        d, n = depth(doc), items(doc)
        assert scan(data, max(d, 1), n) == (SCAN_OK, len(data))
        if d > 1:
            code, at = scan(data, d - 1, n)
            assert code == TOO_DEEP and data[at : at + 1] in (b"[", b"{")
        if n > 0:
            code, _ = scan(data, max(d, 1), n - 1)
            assert code == TOO_MANY_ITEMS

    @settings(max_examples=300, deadline=None)
    @given(
        data=st.binary(max_size=64) | _JSON.map(lambda d: json.dumps(d).encode()),
        d=st.integers(1, 6),
    )
    def test_the_compiled_kernel_is_the_reference(self, data: bytes, d: int) -> None:
        """Any bytes at all (JSON or not): the kernel and the plain loop agree."""
        for n in (0, 1, 3, 10):
            assert scan(data, d, n) == scan_reference(data, d, n)


class TestStopsAtTheFirstViolation:
    """The scan reports where the body first goes past a limit, not where it ends."""

    def test_wide_body_is_refused_at_the_item_past_the_limit(self) -> None:
        body = b'{"messages":{},"x":[' + b",".join([b"{}"] * 1000) + b"]}"
        code, at = scan(body, 128, 100)
        assert code == TOO_MANY_ITEMS
        # items: messages, x, then x's elements; the 101st item is x's 99th element, which
        # starts at the comma after the 98th (and the "messages" value is one {} more)
        assert body[:at].count(b"{}") == 1 + 98 and body[at : at + 1] == b","

    def test_brackets_inside_strings_are_text(self) -> None:
        body = b'{"a":"[[[[{{{{\\"]]]]"}'
        assert scan(body, 1, 1) == (SCAN_OK, len(body))
