"""Helpers of the CLI unit tests."""

from __future__ import annotations

import pytest

from shared.cli.main import main


def tao(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``tao argv…`` in-process: exit code, stdout, stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err
