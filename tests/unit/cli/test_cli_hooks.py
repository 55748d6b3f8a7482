"""``tao hooks install|uninstall claude-code``: merge, idempotence, backup, dry run, round trip."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.cli.hooks import (
    BACKUP_SUFFIX,
    claude_settings_path,
    command_note,
    default_command,
    runs_tao_hook,
)
from tests.unit.cli.cli_util import tao

CMD = "/opt/tao/bin/tao hook claude"
EVENTS = (
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "SessionStart",
    "SessionEnd",
    "Stop",
    "UserPromptSubmit",
)
# A user's settings with hooks of their own (4-space indent, other keys, one event we also use).
THEIRS = """{
    "model": "opus",
    "hooks": {
        "PreToolUse": [
            {
                "matcher": "Bash",
                "hooks": [{"type": "command", "command": "~/bin/audit.sh", "timeout": 30}]
            }
        ],
        "Notification": [
            {"hooks": [{"type": "command", "command": "notify-send claude"}]}
        ]
    },
    "permissions": {"allow": ["Bash(git log:*)"]}
}
"""


def install(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    return tao(capsys, "hooks", "install", "claude-code", "--command", CMD, *extra)


def ours(settings: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per event, our entries."""
    return {
        event: [e for g in groups for e in g["hooks"] if e.get("command") == CMD]
        for event, groups in settings.get("hooks", {}).items()
    }


class TestInstall:
    """Install merges one entry per event into the user settings, keeping everything else."""

    def test_into_existing_settings(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Their hooks and keys stay; ours are added once per event; a backup is written."""
        path = home / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(THEIRS)
        code, out, err = install(capsys)
        assert (code, err) == (0, "")
        assert f"installed in {path}" in out
        assert (path.parent / f"settings.json{BACKUP_SUFFIX}").read_text() == THEIRS
        settings = json.loads(path.read_text())
        assert settings["model"] == "opus"
        assert settings["permissions"] == {"allow": ["Bash(git log:*)"]}
        assert settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"] == "~/bin/audit.sh"
        assert settings["hooks"]["Notification"] == json.loads(THEIRS)["hooks"]["Notification"]
        found = ours(settings)
        assert {e: len(found.get(e, [])) for e in EVENTS} == dict.fromkeys(EVENTS, 1)
        assert found["PreToolUse"] == [
            {"type": "command", "command": CMD, "timeout": 5, "async": True}
        ]
        assert "async" not in found["SessionEnd"][0]
        groups = {e: settings["hooks"][e][-1] for e in EVENTS}
        assert groups["PreToolUse"]["matcher"] == "*"
        assert "matcher" not in groups["Stop"] and "matcher" not in groups["UserPromptSubmit"]
        assert path.read_text().startswith('{\n    "model"')  # their indentation kept

    def test_twice_adds_once(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A second install changes nothing and says so."""
        path = home / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(THEIRS)
        install(capsys)
        first = path.read_text()
        code, out, _ = install(capsys)
        assert code == 0 and "already installed" in out
        assert path.read_text() == first
        assert all(len(v) <= 1 for v in ours(json.loads(first)).values())

    def test_new_command_replaces_old(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Installing with another tao path replaces our old entries instead of adding."""
        install(capsys, "--command", "/old/tao hook claude")
        install(capsys)
        text = (home / ".claude" / "settings.json").read_text()
        assert "/old/tao" not in text
        assert text.count(CMD) == len(EVENTS)

    def test_dry_run_writes_nothing(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--dry-run prints the diff of the file it would write."""
        code, out, _ = install(capsys, "--dry-run")
        assert code == 0
        assert out.startswith("--- /dev/null\n+++ ")
        assert f'+            "command": "{CMD}",' in out
        assert not (home / ".claude").exists()

    @pytest.mark.parametrize(
        ("scope", "parts"),
        [
            ("user", ("home", ".claude", "settings.json")),
            ("project", ("proj", ".claude", "settings.json")),
            ("local", ("proj", ".claude", "settings.local.json")),
        ],
    )
    def test_scopes(
        self,
        home: Path,
        capsys: pytest.CaptureFixture[str],
        scope: str,
        parts: tuple[str, ...],
    ) -> None:
        """Each scope writes its own settings file."""
        assert install(capsys, "--scope", scope)[0] == 0
        path = home.parent.joinpath(*parts)
        assert path == claude_settings_path(scope, home.parent / "proj", home)  # type: ignore[arg-type]
        assert len(ours(json.loads(path.read_text()))) == len(EVENTS)


class TestUninstall:
    """Uninstall removes exactly our entries."""

    def test_round_trip_restores_the_file(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """install, install, uninstall: byte for byte the original."""
        path = home / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(THEIRS)
        install(capsys)
        install(capsys)
        code, out, err = tao(capsys, "hooks", "uninstall", "claude-code", "--command", CMD)
        assert (code, err) == (0, "")
        assert "uninstalled" in out
        assert path.read_text() == THEIRS

    def test_keeps_changes_made_since(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Settings changed after the install keep the change; only our entries go."""
        path = home / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(THEIRS)
        install(capsys)
        settings = json.loads(path.read_text())
        settings["model"] = "sonnet"
        settings["hooks"]["Stop"][0]["hooks"].append({"type": "command", "command": "say done"})
        path.write_text(json.dumps(settings))
        assert tao(capsys, "hooks", "uninstall", "claude-code")[0] == 0  # found by "tao hook"
        after = json.loads(path.read_text())
        expected = json.loads(THEIRS)
        expected["model"] = "sonnet"
        expected["hooks"]["Stop"] = [{"hooks": [{"type": "command", "command": "say done"}]}]
        assert after == expected

    def test_created_file_is_removed(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A settings file the install created goes away again."""
        install(capsys, "--scope", "project")
        path = home.parent / "proj" / ".claude" / "settings.json"
        assert path.exists()
        assert tao(capsys, "hooks", "uninstall", "claude-code", "--scope", "project")[0] == 0
        assert not path.exists()

    def test_nothing_to_remove(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        path = home / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(THEIRS)
        code, out, _ = tao(capsys, "hooks", "uninstall", "claude-code")
        assert code == 0 and "already uninstalled" in out
        assert path.read_text() == THEIRS
        assert not path.with_name(f"settings.json{BACKUP_SUFFIX}").exists()


class TestBadSettings:
    """Unreadable settings: exit 2 with one line, file untouched."""

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ('{"hooks": {', "not valid JSON"),
            ("[1, 2]", "expected a JSON object"),
            ('{"hooks": []}', "hooks: expected an object"),
            ('{"hooks": {"Stop": {}}}', "hooks.Stop: expected a list"),
        ],
    )
    def test_rejected(
        self, home: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
    ) -> None:
        path = home / ".claude" / "settings.json"
        path.parent.mkdir(parents=True)
        path.write_text(text)
        for action in ("install", "uninstall"):
            code, out, err = tao(capsys, "hooks", action, "claude-code")
            assert (code, out) == (2, "")
            assert err.startswith(f"tao hooks: error: {path}: {message}")
            assert err.count("\n") == 1
        assert path.read_text() == text
        assert not path.with_name(f"settings.json{BACKUP_SUFFIX}").exists()


class TestCommand:
    """The hook command names the tao executable by absolute path."""

    def test_default_from_argv0(self, tmp_path: Path) -> None:
        exe = tmp_path / "bin" / "tao"
        exe.parent.mkdir()
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
        assert default_command("claude", str(exe), path="") == f"{exe} hook claude"

    @pytest.mark.parametrize("same", [True, False])
    def test_plain_tao_when_path_has_this_one(self, tmp_path: Path, same: bool) -> None:
        """``tao hook X`` (no clone path to go stale) when ``tao`` on PATH is the running
        one; the running one's absolute path when PATH finds another."""
        exe = tmp_path / "bin" / "tao"
        other = tmp_path / "other" / "tao"
        for f in (exe, other):
            f.parent.mkdir()
            f.write_text("#!/bin/sh\n")
            f.chmod(0o755)
        path = str((exe if same else other).parent)
        cmd = default_command("claude", str(exe), path=path)
        assert cmd == ("tao hook claude" if same else f"{exe} hook claude")
        assert (command_note(cmd) is None) == same

    def test_install_notes_an_absolute_command(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An install whose command names tao by an absolute path says how to keep it
        working when that install moves."""
        from shared.cli.main import main

        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.chdir(tmp_path)
        code = main(["hooks", "install", "claude-code", "--command", "/opt/x/tao hook claude"])
        assert code == 0
        out = capsys.readouterr().out
        assert "note: the hooks run /opt/x/tao" in out and "tao hooks install" in out

    def test_quoted_path(self, tmp_path: Path) -> None:
        exe = tmp_path / "my bin" / "tao"
        exe.parent.mkdir()
        exe.write_text("")
        exe.chmod(0o755)
        cmd = default_command("claude", str(exe))
        assert cmd == f"'{exe}' hook claude"
        assert runs_tao_hook(cmd, "claude")

    @pytest.mark.parametrize(
        ("command", "expected"),
        [
            ("tao hook claude", True),
            ("/usr/local/bin/tao hook claude", True),
            ("/x/tao hook openhands", False),
            ("~/bin/audit.sh", False),
            ("mytao hook claude", False),
            ("echo 'unbalanced", False),
        ],
    )
    def test_recognised(self, command: str, expected: bool) -> None:
        assert runs_tao_hook(command, "claude") is expected
