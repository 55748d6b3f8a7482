"""Tables for people: one renderer for every table the CLI prints (plain text or Markdown).

Columns are as wide as their widest cell; the first column is left-aligned and the rest
right-aligned unless ``align`` says otherwise. A plain table wider than ``width`` characters
is cut into blocks of columns that fit, each block repeating the first (key) column, so no
line wraps in an 80–100 column terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["render", "signed"]

_GAP = "  "


def signed(x: float, digits: int = 1) -> str:
    """``x`` with its sign and ``digits`` decimals; never ``-0.0`` (a value that rounds to
    zero prints as ``+0.0``)."""
    text = f"{x:+.{digits}f}"
    return "+" + text[1:] if text.startswith("-") and float(text) == 0 else text


def render(
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    align: Sequence[str] | None = None,
    markdown: bool = False,
    width: int | None = None,
) -> str:
    """``rows`` under ``header`` (every row as long as the header; ValueError otherwise).
    ``align`` holds ``"<"`` or ``">"`` per column; ``width`` splits a plain table into column
    blocks of at most that many characters (a single column wider than it stays whole)."""
    n = len(header)
    for i, r in enumerate(rows):
        if len(r) != n:
            raise ValueError(f"rows[{i}]: {len(r)} cells for {n} columns")
    aligns = list(align) if align is not None else ["<", *([">"] * (n - 1))]
    if len(aligns) != n or any(a not in "<>" for a in aligns):
        raise ValueError(f"align: one of '<' or '>' per column, got {aligns!r}")
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "".join(
            "---|" if a == "<" else "---:|" for a in aligns
        )]  # fmt: skip
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    table = [list(header), *(list(r) for r in rows)]
    widths = [max(len(r[j]) for r in table) for j in range(n)]
    blocks: list[list[int]] = []
    for j in range(1, n) if n > 1 else ():
        used = widths[0] + sum(len(_GAP) + widths[k] for k in blocks[-1]) if blocks else None
        if used is None or (width is not None and used + len(_GAP) + widths[j] > width):
            blocks.append([j])
        else:
            blocks[-1].append(j)
    out: list[str] = []
    for cols in blocks or [[]]:
        keep = [0, *cols]
        for r in table:
            cells = [r[j].ljust(widths[j]) if aligns[j] == "<" else r[j].rjust(widths[j])
                     for j in keep]  # fmt: skip
            out.append(_GAP.join(cells).rstrip())
        out.append("")
    return "\n".join(out[:-1])
