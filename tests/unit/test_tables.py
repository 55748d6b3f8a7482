"""shared.tables: the one table renderer (alignment, column blocks that fit, no -0.0)."""

from __future__ import annotations

import re

import pytest

from shared.tables import render, signed


@pytest.mark.parametrize(
    ("x", "digits", "text"),
    [(-0.04, 1, "+0.0"), (-0.0, 1, "+0.0"), (0.0, 1, "+0.0"), (-0.06, 1, "-0.1"),
     (2.345, 2, "+2.35"), (-12.0, 0, "-12")],
)  # fmt: skip
def test_signed_never_prints_minus_zero(x: float, digits: int, text: str) -> None:
    assert signed(x, digits) == text


def test_columns_align_under_their_labels() -> None:
    text = render(["policy", "latency s", "hit"], [["tao", "1.5", "0.9"], ["rr", "22.25", "x"]])
    head, *rows = text.splitlines()
    assert head == "policy  latency s  hit"
    assert rows == ["tao           1.5  0.9", "rr          22.25    x"]
    assert {len(r) for r in rows} == {len(head)}


def test_wide_table_splits_into_blocks_that_fit() -> None:
    header = ["policy", *(f"metric {i}" for i in range(12))]
    rows = [["thunderagent-ideal", *(f"{i}.0 ± 0.1" for i in range(12))]]
    text = render(header, rows, width=60)
    blocks = text.split("\n\n")
    assert len(blocks) > 1
    assert all(len(line) <= 60 for line in text.splitlines())
    seen = []
    for block in blocks:
        head, row = block.splitlines()
        assert head.startswith("policy") and row.startswith("thunderagent-ideal")
        seen += re.findall(r"metric \d+", head)
    assert seen == header[1:]


def test_markdown_marks_alignment() -> None:
    assert render(["a", "b"], [["x", "1"]], markdown=True) == "| a | b |\n|---|---:|\n| x | 1 |"


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match=r"rows\[0\]: 1 cells for 2 columns"):
        render(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align"):
        render(["a", "b"], [["x", "y"]], align="<^")
