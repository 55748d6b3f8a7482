"""The tools service: session and tool events → session records, tool statistics, wake-ups."""

from services.tools.app import NAME, main, start
from services.tools.handlers import ToolsHandlers

__all__ = ["NAME", "ToolsHandlers", "main", "start"]
