"""Trace import: real agent logs → the session-trace JSONL of docs/evaluation.md."""

from __future__ import annotations

from shared.trace.claude_code import from_claude_code
from shared.trace.miniswe import from_miniswe
from shared.trace.model import (
    ImportResult,
    ModelCall,
    ToolCall,
    TraceImportError,
    TraceSession,
)
from shared.trace.opencode import from_opencode

__all__ = [
    "IMPORTERS",
    "ImportResult",
    "ModelCall",
    "ToolCall",
    "TraceImportError",
    "TraceSession",
    "from_claude_code",
    "from_miniswe",
    "from_opencode",
]

IMPORTERS = {
    "mini-swe-agent": from_miniswe,
    "claude-code": from_claude_code,
    "opencode": from_opencode,
}
