"""Settings parsing: defaults, every kind of value, and errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.infra import NodeSpec, Settings, SettingsError
from shared.infra.settings import VARIABLES


class TestDefaults:
    def test_empty_environment_gives_the_documented_defaults(self) -> None:
        """With no TAO_* variables every field has its default and no servers are configured."""
        s = Settings.from_env({})
        assert s == Settings()
        assert s.nats_url is None and s.redis_url is None
        assert (s.domain, s.tick_s, s.debounce_s, s.policy) == ("default", 1.0, 0.0005, "tao")
        assert (s.gateway_id, s.gateway_host, s.gateway_port) == ("gw0", "127.0.0.1", 8000)
        assert (s.max_deliver, s.log_format, s.nodes) == (5, "json", ())

    def test_empty_strings_count_as_unset(self) -> None:
        """A variable set to '' (or spaces) keeps the default."""
        assert Settings.from_env({"TAO_TICK_S": "", "TAO_POLICY": "  "}) == Settings()

    def test_every_variable_is_documented_in_the_module_docstring(self) -> None:
        """The README table is copied from the docstring, so it must list every variable."""
        import shared.infra.settings as module

        assert module.__doc__ is not None
        missing = [v for v in VARIABLES if f"| {v} " not in module.__doc__]
        assert missing == []

    def test_the_readme_table_is_the_docstrings(self) -> None:
        """README "Settings" shows the same table, row for row."""
        import shared.infra.settings as module

        def rows(text: str, first: str) -> list[str]:
            lines = text.splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith(first))
            end = start
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            return lines[start:end]

        readme = (Path(__file__).parents[3] / "README.md").read_text()
        assert module.__doc__ is not None
        header = "| Variable                  | Default"
        assert rows(readme, header) == rows(module.__doc__, header)


class TestParsing:
    def test_values_are_parsed_to_their_types(self) -> None:
        """Numbers, names, URLs, choices and the node list are parsed from strings."""
        s = Settings.from_env(
            {
                "TAO_NATS_URL": "nats://10.0.0.1:4222",
                "TAO_REDIS_URL": "redis://r:6379/0",
                "TAO_TICK_S": "0.5",
                "TAO_QUANTUM": "1024",
                "TAO_POLICY": "kv-aware",
                "TAO_LOG_LEVEL": "DEBUG",
                "TAO_GATEWAY_PORT": "0",
                "TAO_NODES": "n1=http://a:8000/, n2=http://b:8000",
                "TAO_NAMESPACE": "staging",
            }
        )
        assert s.nats_url == "nats://10.0.0.1:4222" and s.redis_url == "redis://r:6379/0"
        assert s.tick_s == 0.5 and s.quantum == 1024 and s.policy == "kv-aware"
        assert s.log_level == "debug" and s.gateway_port == 0 and s.namespace == "staging"
        assert s.nodes == (NodeSpec("n1", "http://a:8000"), NodeSpec("n2", "http://b:8000"))

    def test_scrape_period(self) -> None:
        """TAO_SCRAPE_S defaults to 1 s, parses a positive number and refuses 0."""
        assert Settings.from_env({}).scrape_s == 1.0
        assert Settings.from_env({"TAO_SCRAPE_S": "0.25"}).scrape_s == 0.25
        with pytest.raises(SettingsError, match="TAO_SCRAPE_S: must be a number > 0"):
            Settings.from_env({"TAO_SCRAPE_S": "0"})

    def test_settings_are_frozen(self) -> None:
        """A Settings object cannot be changed; replace() makes a changed copy."""
        s = Settings()
        with pytest.raises(AttributeError):
            s.tick_s = 2.0  # type: ignore[misc]
        assert s.replace(tick_s=2.0).tick_s == 2.0 and s.tick_s == 1.0


class TestErrors:
    @pytest.mark.parametrize(
        ("variable", "value", "message"),
        [
            ("TAO_TICK_S", "abc", "TAO_TICK_S: must be a number > 0, got 'abc'"),
            ("TAO_TICK_S", "0", "TAO_TICK_S: must be a number > 0, got '0'"),
            ("TAO_TICK_S", "nan", "TAO_TICK_S: must be a number > 0, got 'nan'"),
            ("TAO_DEBOUNCE_S", "-1", "TAO_DEBOUNCE_S: must be a number >= 0, got '-1'"),
            ("TAO_TARGET_UTILISATION", "1.5", "TAO_TARGET_UTILISATION: must be a number in (0, 1]"),
            ("TAO_QUANTUM", "1.5", "TAO_QUANTUM: must be an integer >= 1, got '1.5'"),
            ("TAO_GATEWAY_PORT", "70000", "TAO_GATEWAY_PORT: must be an integer in [0, 65535]"),
            ("TAO_POLICY", "fifo", "TAO_POLICY: must be one of tao, "),
            ("TAO_LOG_FORMAT", "xml", "TAO_LOG_FORMAT: must be one of json, console"),
            ("TAO_GATEWAY_ID", "gw.1", "TAO_GATEWAY_ID: must match [A-Za-z0-9_-]{1,128}"),
            ("TAO_DOMAIN", "a{b}", "TAO_DOMAIN: must match"),
            ("TAO_NATS_URL", "localhost:4222", "TAO_NATS_URL: must be a URL with scheme nats"),
            ("TAO_REDIS_URL", "http://x", "TAO_REDIS_URL: must be a URL with scheme redis"),
            ("TAO_NODES", "n1:http://a", "TAO_NODES: entry 'n1:http://a' is not id=url"),
            ("TAO_NODES", "n1=http://a,n1=http://b", "TAO_NODES: node id 'n1' appears twice"),
            ("TAO_MAX_DELIVER", "0", "TAO_MAX_DELIVER: must be an integer >= 1, got '0'"),
        ],
    )
    def test_bad_value_names_the_variable_and_the_problem(
        self, variable: str, value: str, message: str
    ) -> None:
        """A bad value raises SettingsError whose message starts with the variable name."""
        with pytest.raises(SettingsError) as info:
            Settings.from_env({variable: value})
        assert str(info.value).startswith(message)
        assert info.value.variable == variable and info.value.value == value

    def test_settings_error_is_a_value_error(self) -> None:
        """Callers that catch ValueError also catch a settings error."""
        with pytest.raises(ValueError, match="TAO_HALF_LIFE_S"):
            Settings.from_env({"TAO_HALF_LIFE_S": "-3"})
