"""Example snapshots shipped with the package (``tao plan --example`` plans ``snapshot.json``)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def path(name: str = "snapshot.json") -> Path:
    """Filesystem path of a bundled example (package data, so it also works when installed)."""
    return Path(str(resources.files(__name__).joinpath(name)))


__all__ = ["path"]
