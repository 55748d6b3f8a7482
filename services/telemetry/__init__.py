"""The telemetry service: node status (scraped vLLM metrics) and session residency."""

from services.telemetry.app import NAME, main, run
from services.telemetry.handlers import NodeScrapers
from services.telemetry.kvresidency import KvResidency
from services.telemetry.residency import ResidencySource, UsageResidency

__all__ = [
    "NAME",
    "KvResidency",
    "NodeScrapers",
    "ResidencySource",
    "UsageResidency",
    "main",
    "run",
]
