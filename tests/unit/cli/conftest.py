"""Fixtures of the CLI unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake HOME (without ``XDG_CONFIG_HOME``) and a working directory, the project."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path / "proj")
    return tmp_path / "home"
