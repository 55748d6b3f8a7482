"""The planner service: solve the newest snapshot, verify-and-apply, publish placements."""

from services.planner.app import NAME, build, main, run
from services.planner.handlers import Planner, Snapshot, decode_snapshot
from services.planner.mapping import from_wire, to_wire

__all__ = [
    "NAME",
    "Planner",
    "Snapshot",
    "build",
    "decode_snapshot",
    "from_wire",
    "main",
    "run",
    "to_wire",
]
