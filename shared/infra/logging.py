"""Structured logging for every service: JSON lines on stderr, configured once at start-up.

One line per unit of work (a handled message, a tick) with its fields; ``service`` is bound for
every line. The console format is for people at a terminal (``TAO_LOG_FORMAT=console``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import orjson
import structlog
import structlog.tracebacks
from structlog.typing import FilteringBoundLogger

from .settings import LOG_FORMATS, LOG_LEVELS, Settings

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {name: getattr(logging, name.upper()) for name in LOG_LEVELS}


def _orjson_dumps(obj: Any, default: Any = None) -> str:
    return orjson.dumps(obj, default=default).decode()


class _ServiceAdder:
    """Processor adding ``service`` to every event (unless the event sets its own)."""

    def __init__(self, service: str | None) -> None:
        self.service = service

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        if self.service is not None:
            event.setdefault("service", self.service)
        return event


def configure_logging(
    settings: Settings | None = None,
    *,
    service: str | None = None,
    level: str | None = None,
    fmt: str | None = None,
    stream: TextIO | None = None,
) -> None:
    """Configure structlog for this process; later calls replace the configuration.

    Explicit arguments override ``settings``; ``settings.service_name`` overrides ``service``.
    """
    s = settings if settings is not None else Settings()
    level = (level or s.log_level).lower()
    fmt = (fmt or s.log_format).lower()
    if level not in _LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    name = s.service_name or service
    # No local variables in tracebacks: a crashing frame's locals hold settings with the NATS
    # and Redis URLs (passwords included) and auth arguments, which must never reach a log.
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        _ServiceAdder(name),
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        processors.append(
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        )
    processors.append(renderer)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str | None = None, **bound: Any) -> FilteringBoundLogger:
    """A structlog logger, with ``component=name`` and ``bound`` fields on every line."""
    if name is not None:
        bound["component"] = name
    # A lazy proxy: it binds on each use, so module-level loggers follow a later configure.
    logger: FilteringBoundLogger = structlog.get_logger(**bound)
    return logger
