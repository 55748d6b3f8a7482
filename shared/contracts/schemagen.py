"""Generate ``schemas/`` (JSON Schema 2020-12) from the contract structs, or check for drift.

    python -m shared.contracts.schemagen            # write schemas/, remove stale files
    python -m shared.contracts.schemagen --check    # exit 1 listing files that differ

One file per top-level message, named ``<module>.<Class>.json`` (``tool.ToolStart.json``), with
nested types under ``$defs``. Output is deterministic: keys sorted, two-space indent, UTF-8,
trailing newline. Struct docstrings become ``description``s, so editing one is a schema change.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from .codec import MESSAGE_TYPES
from .kv import KVEventBatch

__all__ = ["SCHEMA_DIR", "TOP_LEVEL_TYPES", "check", "main", "render", "write"]

SCHEMA_DIR: Final = Path(__file__).resolve().parents[2] / "schemas"
TOP_LEVEL_TYPES: Final[tuple[type[msgspec.Struct], ...]] = (*MESSAGE_TYPES, KVEventBatch)
_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"


def _file_name(cls: type[msgspec.Struct]) -> str:
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}.json"


def render() -> dict[str, str]:
    """File name → exact file text, for every top-level type."""
    out: dict[str, str] = {}
    for cls in TOP_LEVEL_TYPES:
        schema: dict[str, Any] = msgspec.json.schema(cls)
        schema["$schema"] = _DIALECT
        schema["$comment"] = (
            f"Generated from {cls.__module__}.{cls.__name__} by "
            "`python -m shared.contracts.schemagen`; do not edit."
        )
        out[_file_name(cls)] = (
            json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        )
    return out


def check(directory: Path = SCHEMA_DIR) -> list[str]:
    """Names of files in ``directory`` that are missing, different or stale, sorted."""
    expected = render()
    present = {p.name for p in directory.glob("*.json")} if directory.is_dir() else set()
    drifted = [
        name
        for name, text in expected.items()
        if name not in present or (directory / name).read_text(encoding="utf-8") != text
    ]
    drifted.extend(present - expected.keys())
    return sorted(drifted)


def write(directory: Path = SCHEMA_DIR) -> list[str]:
    """Bring ``directory`` up to date; return the names of files written or removed."""
    changed = check(directory)
    expected = render()
    directory.mkdir(parents=True, exist_ok=True)
    for name in changed:
        path = directory / name
        if name in expected:
            path.write_text(expected[name], encoding="utf-8")
        else:
            path.unlink()
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.contracts.schemagen", description="Generate or check schemas/."
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if any file would change")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="schema directory")
    args = parser.parse_args(argv)
    directory: Path = args.dir
    if args.check:
        drifted = check(directory)
        for name in drifted:
            print(f"drifted: {directory / name}", file=sys.stderr)
        if drifted:
            print("run: python -m shared.contracts.schemagen", file=sys.stderr)
            return 1
        return 0
    for name in write(directory):
        print(f"updated: {directory / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
