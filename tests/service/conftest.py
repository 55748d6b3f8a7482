"""Fixtures shared by the service tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import structlog


@pytest.fixture
def info_lines_kept() -> Iterator[None]:
    """Let info lines through whatever level an earlier test configured (``capture_logs``
    swaps the processors only; a filtering wrapper set to warning drops info before them)."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(**saved)
