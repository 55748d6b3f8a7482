"""The tenants file: parsing, its errors, digests, edits by ``tao keys``, and reloading."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shared.harness.hookclient import TENANT_HEADER as HOOK_TENANT_HEADER
from shared.harness.hookclient import hook_headers
from shared.infra.tenants import (
    TENANT_HEADER,
    TenantsFileError,
    TenantsWatch,
    add_secret,
    digest,
    load_tenants_file,
    new_secret,
    parse_tenants,
    qualify,
    remove_secret,
    render_tenants_file,
    unqualify,
)
from tests.unit.cli.cli_util import tao

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tenants.toml"
    path.write_text(text)
    return path


class TestParse:
    def test_reads_tenants_and_finds_them_by_secret(self) -> None:
        key, token = new_secret("api"), new_secret("hook")
        tenants = parse_tenants(
            {
                "tenant": [
                    {"name": "a", "api_keys": [digest(key)], "hook_tokens": [digest(token)]},
                    {"name": "b", "max_held": 4},
                ]
            }
        )
        a = tenants.find("api", key)
        assert a is not None and a.name == "a"
        hook = tenants.find("hook", token)
        assert hook is not None and hook.name == "a"
        # a key is no hook token and the other way round; unknown and empty secrets match none
        assert tenants.find("hook", key) is None and tenants.find("api", token) is None
        assert tenants.find("api", "tao-api-unknown") is None and tenants.find("api", "") is None
        b = tenants.get("b")
        assert b is not None and b.max_held == 4 and b.api_keys == ()

    @pytest.mark.parametrize(
        ("doc", "reason"),
        [
            ({"tenants": []}, "unknown top-level key(s) 'tenants'; expected [[tenant]] tables"),
            ({"tenant": {"name": "a"}}, "tenant must be an array of tables"),
            ({"tenant": [{"name": "a b"}]}, "tenant 1: name must match [A-Za-z0-9_-]{1,64}"),
            ({"tenant": [{"name": "a:b"}]}, "tenant 1: name must match"),
            ({"tenant": [{"name": "a", "keys": []}]}, "tenant 'a': unknown key(s) keys"),
            ({"tenant": [{"name": "a", "api_keys": "x"}]}, "api_keys must be a list of strings"),
            (
                {"tenant": [{"name": "a", "api_keys": ["tao-api-plaintext-key"]}]},
                "holds 'tao-api-plai…', not a 'sha256:<64 hex digits>' digest",
            ),
            ({"tenant": [{"name": "a", "max_held": 0}]}, "max_held must be an integer >= 1"),
            ({"tenant": [{"name": "a", "max_held": True}]}, "max_held must be an integer >= 1"),
            ({"tenant": [{"name": "a"}, {"name": "a"}]}, "tenant name 'a' appears twice"),
            (
                {"tenant": [{"name": "a", "api_keys": [D1]}, {"name": "b", "hook_tokens": [D1]}]},
                "appears twice (tenants 'a' and 'b')",
            ),
        ],
    )
    def test_errors_name_the_tenant_and_key(self, doc: dict[str, object], reason: str) -> None:
        with pytest.raises(ValueError) as info:
            parse_tenants(doc)
        assert reason in str(info.value)

    def test_file_errors_name_the_file(self, tmp_path: Path) -> None:
        with pytest.raises(TenantsFileError, match=r"tenants\.toml: not valid TOML"):
            load_tenants_file(write(tmp_path, "[[tenant]\n"))
        with pytest.raises(TenantsFileError, match=r"missing\.toml: cannot read"):
            load_tenants_file(tmp_path / "missing.toml")
        path = tmp_path / "tenants.toml"
        path.write_bytes(b'[[tenant]]\nname = "\xff"\n')
        with pytest.raises(TenantsFileError, match="not UTF-8 text"):
            load_tenants_file(path)

    def test_render_reads_back_unchanged(self, tmp_path: Path) -> None:
        tenants = parse_tenants(
            {"tenant": [{"name": "a", "api_keys": [D1], "max_held": 3}, {"name": "b"}]}
        )
        path = write(tmp_path, render_tenants_file(tenants))
        assert load_tenants_file(path).tenants == tenants.tenants


def test_ids_are_namespaced_per_tenant() -> None:
    assert qualify("a", "s1") == "a:s1"
    assert qualify("a", "b:s1") == "a:b:s1"  # a client id that looks qualified stays inside
    assert unqualify("a", qualify("a", "b:s1")) == "b:s1"
    assert qualify("a", "s1") != qualify("b", "s1")


def test_header_names_agree() -> None:
    """The hook process (stdlib only) spells the tenant header as the tools service reads it."""
    assert HOOK_TENANT_HEADER == TENANT_HEADER
    assert hook_headers(1.5, {"TAO_TENANT": " team-a "})[TENANT_HEADER] == "team-a"
    assert TENANT_HEADER not in hook_headers(1.5, {})


class TestEdits:
    def test_add_writes_only_the_digest(self, tmp_path: Path) -> None:
        path = tmp_path / "t.toml"
        key = add_secret(path, "team-a", "api")
        token = add_secret(path, "team-a", "hook", max_held=8)
        other = add_secret(path, "team-b", "api")
        text = path.read_text()
        assert key not in text and token not in text and other not in text
        tenants = load_tenants_file(path)
        assert [t.name for t in tenants.tenants] == ["team-a", "team-b"]
        a = tenants.get("team-a")
        assert a is not None and a.api_keys == (digest(key),) and a.max_held == 8
        assert a.hook_tokens == (digest(token),)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    def test_rotation_two_keys_then_remove_the_old(self, tmp_path: Path) -> None:
        path = tmp_path / "t.toml"
        old = add_secret(path, "a", "api")
        new = add_secret(path, "a", "api")
        both = load_tenants_file(path)
        assert both.find("api", old) is not None and both.find("api", new) is not None
        removed = remove_secret(path, "a", digest(old)[7:19])
        assert removed == digest(old)
        after = load_tenants_file(path)
        assert after.find("api", old) is None and after.find("api", new) is not None

    def test_remove_needs_exactly_one_match(self, tmp_path: Path) -> None:
        one = {"name": "a", "api_keys": [D1], "hook_tokens": [D2]}
        path = write(tmp_path, render_tenants_file(parse_tenants({"tenant": [one]})))
        with pytest.raises(ValueError, match="no digest of tenant 'a' start with 'sha256:c'"):
            remove_secret(path, "a", "c")
        with pytest.raises(ValueError, match="no tenant 'z'"):
            remove_secret(path, "z", "a")
        assert load_tenants_file(path).get("a") is not None  # nothing written


class TestWatch:
    def test_reloads_on_change_and_keeps_the_last_good(self, tmp_path: Path) -> None:
        now = [0.0]
        errors: list[TenantsFileError] = []
        path = tmp_path / "t.toml"
        key = add_secret(path, "a", "api")
        watch = TenantsWatch(path, clock=lambda: now[0], every_s=1.0, on_error=errors.append)
        assert watch.current().find("api", key) is not None
        second = add_secret(path, "b", "api")
        now[0] = 0.5  # not yet checked again
        assert watch.current().find("api", second) is None
        now[0] = 1.5
        assert watch.current().find("api", second) is not None and watch.reloads == 1
        path.write_text("[[tenant]\n")  # broken: the last good tenants stay
        now[0] = 3.0
        assert watch.current().find("api", second) is not None
        assert len(errors) == 1 and "not valid TOML" in errors[0].reason

    def test_invalid_at_start_raises(self, tmp_path: Path) -> None:
        with pytest.raises(TenantsFileError):
            TenantsWatch(write(tmp_path, "tenant = 1\n"), clock=lambda: 0.0)


class TestKeysCommand:
    def test_add_list_remove(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        path = tmp_path / "t.toml"
        monkeypatch.setenv("TAO_TENANTS_FILE", str(path))
        code, out, err = tao(capsys, "keys", "add", "--tenant", "team-a", "--kind", "api")
        assert code == 0 and out.startswith("tao-api-") and "shown only now" in err
        key = out.strip()
        assert load_tenants_file(path).find("api", key) is not None
        code, out, _ = tao(capsys, "keys", "list")
        assert code == 0 and "team-a" in out and digest(key)[7:19] in out
        prefix = digest(key)[7:19]
        code, out, _ = tao(capsys, "keys", "remove", "--tenant", "team-a", "--digest", prefix)
        assert code == 0 and digest(key) in out
        assert load_tenants_file(path).find("api", key) is None

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["keys", "add", "--tenant", "a b", "--kind", "api"], "tenant name must match"),
            (["keys", "add", "--tenant", "a", "--kind", "root"], "invalid choice: 'root'"),
            (["keys", "add", "--tenant", "a", "--kind", "api", "--max-held", "0"], "max-held"),
            (["keys", "remove", "--tenant", "a", "--digest", "ab"], "no tenant 'a'"),
            (["keys", "list", "--file", "/nonexistent/t.toml"], "cannot read"),
        ],
    )
    def test_bad_usage_is_one_line(
        self,
        capsys: pytest.CaptureFixture[str],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        argv: list[str],
        message: str,
    ) -> None:
        path = tmp_path / "t.toml"
        path.write_text("")
        monkeypatch.setenv("TAO_TENANTS_FILE", str(path))
        code, out, err = tao(capsys, *argv)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1 and message in err, err

    def test_no_file_is_one_line(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.delenv("TAO_TENANTS_FILE", raising=False)
        code, _, err = tao(capsys, "keys", "list")
        assert code == 2 and "no tenants file given" in err
