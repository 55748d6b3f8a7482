"""The harnesses TAO hears from: their names, subject tokens, and mappers.

Each harness has a name (``claude-code``, as messages' ``harness`` field and ``tao hooks
install`` spell it) and a subject token (``claude``: ``tao hook claude``, ``POST
/hooks/claude``, subject ``tao.v1.hook.claude``); either one finds it. Mappers are imported on
first use by their import path, so this module stays cheap to import (``tao hook`` resolves
names through it before anything heavy is loaded) and a harness whose module is missing fails
only when it is used.

``command_hooks`` marks harnesses whose hooks are processes that run ``tao hook <token>``
(Claude Code, OpenHands); the others report through a plugin (OpenCode) or a wrapper
(mini-swe-agent) that publishes on the same subject.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .base import HookMapper

__all__ = [
    "HARNESSES",
    "HARNESS_NAMES",
    "Harness",
    "UnknownHarnessError",
    "find",
    "mapper_for",
]


class Harness(NamedTuple):
    """One agent harness: ``name``, subject ``token``, mapper ``module:Class``, and whether its
    hooks run ``tao hook <token>``."""

    name: str
    token: str
    mapper: str
    command_hooks: bool


HARNESSES: tuple[Harness, ...] = (
    Harness("claude-code", "claude", "shared.harness.claude:ClaudeMapper", True),
    Harness("opencode", "opencode", "shared.harness.opencode:OpenCodeMapper", False),
    Harness("openhands", "openhands", "shared.harness.openhands:OpenHandsMapper", True),
    Harness("mini-swe-agent", "miniswe", "shared.harness.miniswe:MiniSweMapper", False),
)
HARNESS_NAMES: tuple[str, ...] = tuple(h.name for h in HARNESSES)

_BY_KEY: dict[str, Harness] = {k: h for h in HARNESSES for k in (h.name, h.token)}


class UnknownHarnessError(ValueError):
    """``harness`` names no known harness, or its mapper cannot be loaded (``reason``)."""

    def __init__(self, harness: str, reason: str) -> None:
        self.harness = harness
        self.reason = reason
        super().__init__(f"harness {harness!r}: {reason}")


def find(harness: str) -> Harness:
    """The harness named ``harness`` (its name or its subject token)."""
    found = _BY_KEY.get(harness)
    if found is None:
        known = ", ".join(HARNESS_NAMES)
        raise UnknownHarnessError(harness, f"unknown; known: {known}")
    return found


def mapper_for(harness: str) -> HookMapper:
    """A fresh mapper (its own state) for ``harness`` (name or token)."""
    h = find(harness)
    module, _, cls = h.mapper.partition(":")
    try:
        factory = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as exc:
        raise UnknownHarnessError(harness, f"mapper {h.mapper} unavailable: {exc}") from exc
    mapper: HookMapper = factory()
    return mapper
