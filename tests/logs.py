"""What a failed multi-process test reports from its children's logs (the e2e and scale tiers):
their warning and error lines, since CI keeps no log folders."""

from __future__ import annotations

from pathlib import Path

__all__ = ["telling_lines"]

_TELLING = (b'"level":"warning"', b'"level":"error"', b'"level":"critical"', b"Traceback")
_TELLING_LINES = 60


def telling_lines(log_dir: Path) -> str:
    """The warning and error lines (and tracebacks' first lines) of every child's log under
    ``log_dir``, the last :data:`_TELLING_LINES` of each, or ``""`` when there are none."""
    out: list[str] = []
    for log in sorted(log_dir.glob("*.log")):
        lines = [ln for ln in log.read_bytes().splitlines() if any(t in ln for t in _TELLING)]
        if lines:
            out.append(f"-- {log.name}")
            out.extend(ln.decode(errors="replace") for ln in lines[-_TELLING_LINES:])
    return "\n".join(out)
