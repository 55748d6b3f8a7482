"""Signed placements: what the gateway accepts, and what it rejects and why."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec
import pytest

from shared.contracts import Placement, decode, encode
from shared.infra.signing import (
    KeyFileError,
    PlacementVerifier,
    load_signer,
    load_verify_keys,
    new_key_files,
)
from tests.unit.cli.cli_util import tao

NOW = 1_000_000.0
P = Placement(kind="admit", session_id="s1", version=3, tick=7, gateway_id="gw0", node_id="n1")


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    new_key_files("k1", tmp_path / "k1.toml", tmp_path / "trusted.toml")
    return tmp_path / "k1.toml", tmp_path / "trusted.toml"


def verifier(trusted: Path, now: list[float]) -> PlacementVerifier:
    return PlacementVerifier(trusted, clock=lambda: now[0], every_s=0.0)


class TestVerdicts:
    def test_signed_placement_is_ok_and_survives_the_wire(self, keys: tuple[Path, Path]) -> None:
        private, trusted = keys
        signed = load_signer(private).sign(P, NOW)
        assert (signed.key_id, signed.issued_at) == ("k1", NOW) and signed.signature
        wire = decode(encode(signed), Placement)  # as the gateway receives it
        assert verifier(trusted, [NOW + 1]).verdict(wire) == "ok"

    @pytest.mark.parametrize(
        "change",
        [
            {"node_id": "n2"},
            {"session_id": "s2"},
            {"version": 4},
            {"kind": "revoke"},
            {"gateway_id": "gw1"},
            {"issued_at": NOW + 0.5},
            {"tick": 8},
        ],
    )
    def test_any_altered_field_is_forged(
        self, keys: tuple[Path, Path], change: dict[str, object]
    ) -> None:
        private, trusted = keys
        signed = load_signer(private).sign(P, NOW)
        forged = msgspec.structs.replace(signed, **change)
        assert verifier(trusted, [NOW]).verdict(forged) == "forged"

    def test_unsigned_unknown_key_and_garbage(
        self, keys: tuple[Path, Path], tmp_path: Path
    ) -> None:
        private, trusted = keys
        v = verifier(trusted, [NOW])
        assert v.verdict(P) == "unsigned"
        new_key_files("k2", tmp_path / "k2.toml", tmp_path / "other.toml")
        stranger = load_signer(tmp_path / "k2.toml").sign(P, NOW)
        assert v.verdict(stranger) == "unknown_key"
        # the stranger's signature under the trusted key's id
        claimed = msgspec.structs.replace(stranger, key_id="k1")
        assert v.verdict(claimed) == "forged"
        garbage = msgspec.structs.replace(load_signer(private).sign(P, NOW), signature="!!")
        assert v.verdict(garbage) == "forged"

    @pytest.mark.parametrize(("age", "verdict"), [(59.0, "ok"), (61.0, "expired"), (-4.0, "ok"),
                                                  (-6.0, "expired")])  # fmt: skip
    def test_old_or_future_placements_are_expired(
        self, keys: tuple[Path, Path], age: float, verdict: str
    ) -> None:
        private, trusted = keys
        signed = load_signer(private).sign(P, NOW)
        assert verifier(trusted, [NOW + age]).verdict(signed) == verdict


class TestRotation:
    def test_two_trusted_keys_then_the_old_one_removed(
        self, keys: tuple[Path, Path], tmp_path: Path
    ) -> None:
        old_private, trusted = keys
        now = [NOW]
        v = verifier(trusted, now)
        new_key_files("k2", tmp_path / "k2.toml", trusted)  # added while the gateway runs
        by_new = load_signer(tmp_path / "k2.toml").sign(P, NOW)
        by_old = load_signer(old_private).sign(P, NOW)
        assert v.verdict(by_new) == "ok" and v.verdict(by_old) == "ok"
        text = trusted.read_text()
        start = text.index('[[key]]\nid = "k1"')
        end = text.index("[[key]]", start + 1)
        trusted.write_text(text[:start] + text[end:])  # the old key removed
        assert v.verdict(by_old) == "unknown_key" and v.verdict(by_new) == "ok"

    def test_a_broken_file_keeps_the_last_good_keys(self, keys: tuple[Path, Path]) -> None:
        private, trusted = keys
        errors: list[KeyFileError] = []
        v = PlacementVerifier(trusted, clock=lambda: NOW, every_s=0.0, on_error=errors.append)
        trusted.write_text("[[key]\n")
        assert v.verdict(load_signer(private).sign(P, NOW)) == "ok"
        assert len(errors) == 1 and "not valid TOML" in errors[0].reason


class TestKeyFiles:
    def test_private_file_is_owner_only_and_never_overwritten(
        self, keys: tuple[Path, Path]
    ) -> None:
        private, trusted = keys
        assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
        with pytest.raises(FileExistsError):
            new_key_files("k9", private, trusted)
        assert list(load_verify_keys(trusted)) == ["k1"]

    @pytest.mark.parametrize(
        ("text", "reason"),
        [
            ('id = "k"\nprivate = "abc"\n', "private is not base64"),
            ('id = "k"\nprivate = "YWJj"\n', "private must be 32 bytes, got 3"),
            ('id = "a b"\nprivate = "' + "A" * 43 + '="\n', "id must match"),
            ('id = "k"\nprivate = "YWJj"\nextra = 1\n', "unknown key(s) extra"),
            ("id = \n", "not valid TOML"),
        ],
    )
    def test_signing_key_errors(self, tmp_path: Path, text: str, reason: str) -> None:
        path = tmp_path / "k.toml"
        path.write_text(text)
        with pytest.raises(KeyFileError) as err:
            load_signer(path)
        assert reason in err.value.reason and err.value.path == str(path)

    def test_trusted_keys_errors(self, tmp_path: Path) -> None:
        path = tmp_path / "t.toml"
        path.write_text('[[key]]\nid = "a"\npublic = "x"\n[[key]]\nid = "a"\npublic = "x"\n')
        with pytest.raises(KeyFileError, match="not base64"):
            load_verify_keys(path)
        with pytest.raises(KeyFileError, match="cannot read"):
            load_verify_keys(tmp_path / "missing.toml")

    def test_tao_keys_placement(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        files = ["--private", str(tmp_path / "p.toml"), "--public", str(tmp_path / "t.toml")]
        code, out, _ = tao(capsys, "keys", "placement", "--id", "p1", *files)
        assert code == 0 and "TAO_PLACEMENT_KEY" in out
        assert list(load_verify_keys(tmp_path / "t.toml")) == ["p1"]
        code, _, err = tao(capsys, "keys", "placement", "--id", "p2", *files)
        assert code == 2 and "never overwritten" in err and len(err.strip().splitlines()) == 1
