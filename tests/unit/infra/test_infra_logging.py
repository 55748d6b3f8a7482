"""Logging: JSON lines with timestamp, level and service; filtering by level."""

from __future__ import annotations

import io

import orjson

from shared.infra import Settings, configure_logging, get_logger


class TestJsonLines:
    def test_one_json_object_per_line_with_service_level_and_time(self) -> None:
        """An info event renders as one JSON line with ISO timestamp, level, service and fields."""
        out = io.StringIO()
        configure_logging(Settings(), service="tools", stream=out)
        get_logger("t").info("handled", session="s1", n=3)
        line = orjson.loads(out.getvalue().strip())
        assert line["event"] == "handled" and line["level"] == "info"
        assert line["service"] == "tools" and line["component"] == "t"
        assert line["session"] == "s1" and line["n"] == 3
        assert line["timestamp"].endswith("Z") and "T" in line["timestamp"]

    def test_loggers_made_before_configure_follow_it(self) -> None:
        """A module-level logger created at import time uses the configuration made later."""
        early = get_logger("early")
        out = io.StringIO()
        configure_logging(Settings(), service="late", stream=out)
        early.warning("after")
        line = orjson.loads(out.getvalue().strip())
        assert line["service"] == "late" and line["component"] == "early"

    def test_level_filters_lower_events(self) -> None:
        """With TAO_LOG_LEVEL=warning, info lines are dropped and warnings kept."""
        out = io.StringIO()
        configure_logging(Settings(log_level="warning"), service="x", stream=out)
        log = get_logger()
        log.info("quiet")
        log.warning("loud")
        lines = [orjson.loads(x) for x in out.getvalue().splitlines()]
        assert [x["event"] for x in lines] == ["loud"]


class TestNoSecretsInTracebacks:
    """A crash's traceback carries no local variables: a frame's locals hold the settings with
    the NATS and Redis URLs, passwords included (found in a compose run's service_crashed)."""

    @staticmethod
    def _crash(fmt: str) -> str:
        import pytest

        out = io.StringIO()
        configure_logging(Settings(log_format=fmt), service="gateway", stream=out)
        redis_url = "redis://gateway:s3cret-pw@redis:6379/0"
        try:
            raise RuntimeError(f"cannot connect ({len(redis_url)} chars)")
        except RuntimeError:
            get_logger("t").exception("service_crashed")
        text = out.getvalue()
        if "cannot connect" not in text:
            pytest.fail(f"the exception is not in the log: {text!r}")
        return text

    def test_json(self) -> None:
        text = self._crash("json")
        line = orjson.loads(text.strip())
        assert line["exception"][0]["exc_type"] == "RuntimeError"
        assert "s3cret-pw" not in text

    def test_console(self) -> None:
        assert "s3cret-pw" not in self._crash("console")
