"""Secure by default beyond loopback: which listen address and settings need the gateway key,
where a generated key is kept, and that it is shown once."""

from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest

from services.gateway.gatewaykey import (
    KEY_FILE_NAME,
    announce,
    default_state_dir,
    is_loopback,
    resolve,
)
from shared.infra.errors import SettingsError
from shared.infra.settings import Settings


def settings_of(env: dict[str, str], state: Path) -> Settings:
    return Settings.from_env({"TAO_STATE_DIR": str(state), **env})


class TestLoopback:
    @pytest.mark.parametrize(
        ("host", "loopback"),
        [
            ("127.0.0.1", True),
            ("127.3.2.1", True),
            ("::1", True),
            ("[::1]", True),
            ("localhost", True),
            ("LOCALHOST", True),
            ("0.0.0.0", False),
            ("::", False),
            ("", False),
            ("10.0.0.5", False),
            ("gateway.example.com", False),
        ],
    )
    def test_only_addresses_of_this_machine_are_loopback(self, host: str, loopback: bool) -> None:
        """A wildcard, an interface address or a host name listens beyond this machine."""
        assert is_loopback(host) is loopback


class TestResolve:
    @pytest.mark.parametrize(
        ("env", "mode"),
        [
            ({}, "open"),
            ({"TAO_GATEWAY_HOST": "localhost"}, "open"),
            ({"TAO_GATEWAY_HOST": "0.0.0.0"}, "key"),
            ({"TAO_GATEWAY_HOST": "::"}, "key"),
            ({"TAO_GATEWAY_HOST": "10.1.2.3"}, "key"),
            ({"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_GATEWAY_AUTH": "off"}, "off"),
            ({"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_GATEWAY_AUTH": "OFF"}, "off"),
            ({"TAO_GATEWAY_AUTH": "on"}, "key"),
            ({"TAO_GATEWAY_KEY": "k-1"}, "key"),
            ({"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_GATEWAY_KEY": "k-1"}, "key"),
            ({"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_TENANTS_FILE": "/x/tenants.toml"}, "tenants"),
            ({"TAO_TENANTS_FILE": "/x/tenants.toml"}, "tenants"),
        ],
        ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else v,
    )
    def test_host_and_settings_decide_whether_a_key_is_needed(
        self, tmp_path: Path, env: dict[str, str], mode: str
    ) -> None:
        """Loopback stays open by default; beyond it a key is needed unless a tenants file
        takes over or TAO_GATEWAY_AUTH=off says otherwise; a key given on loopback is used."""
        policy = resolve(settings_of(env, tmp_path))
        assert policy.mode == mode
        assert policy.needs_key is (mode in ("key", "tenants"))
        assert (policy.key is not None) is (mode == "key")

    def test_the_key_from_the_environment_wins(self, tmp_path: Path) -> None:
        key_file = tmp_path / "secret"
        key_file.write_text("from-file\n")
        env = {"TAO_GATEWAY_KEY": "from-env", "TAO_GATEWAY_KEY_FILE": str(key_file)}
        policy = resolve(settings_of({"TAO_GATEWAY_HOST": "0.0.0.0", **env}, tmp_path))
        assert (policy.key, policy.source, policy.generated) == (
            "from-env",
            "TAO_GATEWAY_KEY",
            False,
        )
        assert not (tmp_path / KEY_FILE_NAME).exists()

    def test_a_key_file_is_read_stripped(self, tmp_path: Path) -> None:
        key_file = tmp_path / "secret"
        key_file.write_text("  my-key\n")
        env = {"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_GATEWAY_KEY_FILE": str(key_file)}
        policy = resolve(settings_of(env, tmp_path))
        assert (policy.key, policy.source, policy.path) == (
            "my-key",
            "TAO_GATEWAY_KEY_FILE",
            key_file,
        )

    @pytest.mark.parametrize(
        "content", [None, "", "two words\n"], ids=["missing", "empty", "spaces"]
    )
    def test_an_unusable_key_file_names_the_variable(
        self, tmp_path: Path, content: str | None
    ) -> None:
        key_file = tmp_path / "secret"
        if content is not None:
            key_file.write_text(content)
        env = {"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_GATEWAY_KEY_FILE": str(key_file)}
        with pytest.raises(SettingsError, match=r"^TAO_GATEWAY_KEY_FILE: "):
            resolve(settings_of(env, tmp_path))

    def test_a_key_beside_a_tenants_file_is_refused(self, tmp_path: Path) -> None:
        env = {"TAO_TENANTS_FILE": "/x/t.toml", "TAO_GATEWAY_KEY": "k"}
        with pytest.raises(SettingsError, match=r"^TAO_GATEWAY_KEY: set either TAO_TENANTS_FILE"):
            resolve(settings_of(env, tmp_path))

    def test_a_bad_auth_value_names_the_variable(self, tmp_path: Path) -> None:
        with pytest.raises(SettingsError, match=r"^TAO_GATEWAY_AUTH: must be one of auto, on, off"):
            settings_of({"TAO_GATEWAY_AUTH": "maybe"}, tmp_path)


class TestGeneratedKey:
    def test_first_start_generates_an_owner_only_file_later_starts_reuse_it(
        self, tmp_path: Path
    ) -> None:
        state = tmp_path / "state" / "tao"
        settings = settings_of({"TAO_GATEWAY_HOST": "0.0.0.0"}, state)
        first = resolve(settings)
        path = state / KEY_FILE_NAME
        assert (first.generated, first.source, first.path) == (True, "generated", path)
        assert first.key is not None and first.key.startswith("tao-gw-") and len(first.key) > 40
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() == first.key
        again = resolve(settings)
        assert (again.generated, again.source, again.key) == (False, "state dir", first.key)

    def test_the_key_is_printed_once(self, tmp_path: Path) -> None:
        """Like Jupyter's token: the start that made the key prints it, later starts do not."""
        settings = settings_of({"TAO_GATEWAY_HOST": "0.0.0.0"}, tmp_path)
        outs = []
        for _ in range(2):
            out = io.StringIO()
            policy = resolve(settings)
            announce(policy, "http://0.0.0.0:8000", out)
            outs.append(out.getvalue())
        assert policy.key is not None
        assert policy.key in outs[0] and str(tmp_path / KEY_FILE_NAME) in outs[0]
        assert "TAO_GATEWAY_AUTH=off" in outs[0] and "TAO_GATEWAY_KEY" in outs[0]
        assert outs[1] == ""

    def test_a_key_given_by_the_operator_is_never_printed(self, tmp_path: Path) -> None:
        out = io.StringIO()
        env = {"TAO_GATEWAY_HOST": "0.0.0.0", "TAO_GATEWAY_KEY": "secret-key"}
        announce(resolve(settings_of(env, tmp_path)), "http://x", out)
        assert out.getvalue() == ""

    def test_a_generated_file_others_can_read_stops_the_start(self, tmp_path: Path) -> None:
        settings = settings_of({"TAO_GATEWAY_HOST": "0.0.0.0"}, tmp_path)
        resolve(settings)
        (tmp_path / KEY_FILE_NAME).chmod(0o644)
        with pytest.raises(SettingsError, match="mode 0644, readable by others: chmod 600"):
            resolve(settings)

    def test_the_state_dir_defaults_to_xdg_then_home(self, tmp_path: Path) -> None:
        assert default_state_dir({"XDG_STATE_HOME": "/xdg"}) == Path("/xdg/tao")
        assert default_state_dir({"HOME": "/home/u"}) == Path("/home/u/.local/state/tao")
