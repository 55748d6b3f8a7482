"""``tao hooks install|uninstall opencode|openhands|mini-swe-agent``: placement and round trips."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.cli.hooks import BACKUP_SUFFIX, OPENHANDS_EVENTS, opencode_plugin_source
from tests.unit.cli.cli_util import tao

FIXTURES = Path(__file__).parents[2] / "fixtures" / "openhands"
CMD = "/opt/tao/bin/tao hook openhands"


def openhands_reads(data: dict[str, Any]) -> dict[str, list[Any]]:
    """The events an OpenHands SDK makes of a hooks.json (HookConfig._normalize_hooks_input:
    unwrap ``hooks``, PascalCase → snake_case, an event spelled both ways is an error)."""
    if "hooks" in data:
        data = data["hooks"]
    events: dict[str, list[Any]] = {}
    for key, groups in data.items():
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
        assert snake in {
            "pre_tool_use", "post_tool_use", "user_prompt_submit", "session_start",
            "session_end", "stop",
        }, key  # fmt: skip
        assert snake not in events, f"{key} spelled twice"
        events[snake] = groups
    return events


def commands(groups: list[Any]) -> list[str]:
    return [h["command"] for g in groups for h in g["hooks"]]


class TestOpenCode:
    def test_project_round_trip(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Install puts the plugin in .opencode/plugins; again is a no-op; uninstall removes it."""
        path = Path.cwd() / ".opencode" / "plugins" / "tao.ts"
        assert tao(capsys, "hooks", "install", "opencode", "--scope", "project")[0] == 0
        assert path.read_text() == opencode_plugin_source()
        assert "TaoPlugin" in path.read_text()
        code, out, _ = tao(capsys, "hooks", "install", "opencode", "--scope", "project")
        assert code == 0 and "already installed" in out
        assert tao(capsys, "hooks", "uninstall", "opencode", "--scope", "project")[0] == 0
        assert not path.exists()
        assert sorted(p.name for p in path.parent.iterdir()) == ["tao.ts" + BACKUP_SUFFIX]

    def test_user_scope_follows_xdg(
        self, home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """User scope: ~/.config/opencode/plugins, or $XDG_CONFIG_HOME/opencode/plugins."""
        tao(capsys, "hooks", "install", "opencode")
        assert (home / ".config" / "opencode" / "plugins" / "tao.ts").is_file()
        monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
        tao(capsys, "hooks", "install", "opencode")
        assert (home / "xdg" / "opencode" / "plugins" / "tao.ts").is_file()

    def test_dry_run_writes_nothing(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """--dry-run prints the new file as a diff."""
        code, out, _ = tao(
            capsys, "hooks", "install", "opencode", "--scope", "project", "--dry-run"
        )
        assert code == 0 and "+export const TaoPlugin" in out
        assert not (Path.cwd() / ".opencode").exists()

    def test_refuses_a_foreign_plugin_and_the_local_scope(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Someone else's tao.ts is left alone; there is no local scope."""
        path = Path.cwd() / ".opencode" / "plugins" / "tao.ts"
        path.parent.mkdir(parents=True)
        path.write_text("export const Mine = async () => ({})\n")
        code, _, err = tao(capsys, "hooks", "install", "opencode", "--scope", "project")
        assert code == 2 and "not TAO's plugin" in err
        assert path.read_text() == "export const Mine = async () => ({})\n"
        code, _, err = tao(capsys, "hooks", "install", "opencode", "--scope", "local")
        assert code == 2 and "no local scope" in err


class TestOpenHands:
    def test_round_trip_keeps_other_hooks(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Install adds one group per event beside the project's own hooks (async except
        SessionEnd); installing again changes nothing; uninstall restores the file exactly."""
        path = Path.cwd() / ".openhands" / "hooks.json"
        path.parent.mkdir()
        original = (FIXTURES / "hooks-existing.json").read_text()
        path.write_text(original)
        assert (
            tao(capsys, "hooks", "install", "openhands", "--scope", "project", "--command", CMD)[0]
            == 0
        )
        data = json.loads(path.read_text())
        events = openhands_reads(data)
        assert set(events) == {
            "pre_tool_use",
            "post_tool_use",
            "stop",
            "user_prompt_submit",
            "session_end",
        }
        assert commands(events["pre_tool_use"]) == [".openhands/hooks/block_dangerous.sh", CMD]
        assert commands(events["stop"]) == [".openhands/hooks/lint_check.sh", CMD]
        ours = {e: g[-1] for e, g in data["hooks"].items()}
        for event, is_async in OPENHANDS_EVENTS:
            entry = ours[event]["hooks"][0]
            assert ours[event]["matcher"] == "*"
            assert entry == {
                "type": "command",
                "command": CMD,
                "timeout": 5,
                **({"async": True} if is_async else {}),
            }
        before = path.read_text()
        _, out, _ = tao(
            capsys, "hooks", "install", "openhands", "--scope", "project", "--command", CMD
        )
        assert "already installed" in out and path.read_text() == before
        assert (
            tao(capsys, "hooks", "uninstall", "openhands", "--scope", "project", "--command", CMD)[
                0
            ]
            == 0
        )
        assert path.read_text() == original

    def test_top_level_snake_case_file(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A file with snake_case events at the top level gets ours there, under snake_case
        names, never a second spelling or a hooks wrapper that would hide its own hooks."""
        path = Path.cwd() / ".openhands" / "hooks.json"
        path.parent.mkdir()
        theirs = {"pre_tool_use": [{"matcher": "terminal", "hooks": [{"command": "./guard.sh"}]}]}
        path.write_text(json.dumps(theirs, indent=2) + "\n")
        tao(capsys, "hooks", "install", "openhands", "--scope", "project")
        data = json.loads(path.read_text())
        assert "hooks" not in data and all(k.islower() for k in data)
        events = openhands_reads(data)
        assert commands(events["pre_tool_use"])[0] == "./guard.sh"
        assert all(c.endswith("tao hook openhands") for c in commands(events["post_tool_use"]))
        tao(capsys, "hooks", "uninstall", "openhands", "--scope", "project")
        assert json.loads(path.read_text()) == theirs

    def test_top_level_pascal_case_file_keeps_its_spelling(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Top-level PascalCase events stay at the top level in PascalCase."""
        path = Path.cwd() / ".openhands" / "hooks.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"Stop": [{"matcher": "*", "hooks": [{"command": "x"}]}]}))
        tao(capsys, "hooks", "install", "openhands", "--scope", "project")
        data = json.loads(path.read_text())
        assert set(data) == {e for e, _ in OPENHANDS_EVENTS}
        openhands_reads(data)

    def test_new_user_file_is_created_and_removed(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No file: install creates ~/.openhands/hooks.json with the hooks wrapper; uninstall
        deletes what it created."""
        path = home / ".openhands" / "hooks.json"
        tao(capsys, "hooks", "install", "openhands")
        data = json.loads(path.read_text())
        assert set(data) == {"hooks"} and len(openhands_reads(data)) == 5
        tao(capsys, "hooks", "uninstall", "openhands")
        assert not path.exists()

    def test_bad_file_is_refused(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A hooks.json that is not an object of lists is left untouched, with a reason."""
        path = Path.cwd() / ".openhands" / "hooks.json"
        path.parent.mkdir()
        path.write_text('{"hooks": {"Stop": {"command": "x"}}}')
        code, _, err = tao(capsys, "hooks", "install", "openhands", "--scope", "project")
        assert code == 2 and "hooks.Stop: expected a list" in err


class TestMiniSweAgent:
    def test_overlay_round_trip(self, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """Install writes a config overlay that swaps in TaoEnvironment; uninstall deletes it."""
        path = Path.cwd() / "tao-mini-swe-agent.yaml"
        assert tao(capsys, "hooks", "install", "mini-swe-agent", "--scope", "project")[0] == 0
        config = yaml.safe_load(path.read_text())
        assert config == {
            "environment": {
                "environment_class": "shared.harness.miniswe_env.TaoEnvironment",
                "inner_class": "local",
            }
        }
        _, out, _ = tao(capsys, "hooks", "install", "mini-swe-agent", "--scope", "project")
        assert "already installed" in out
        tao(capsys, "hooks", "uninstall", "mini-swe-agent", "--scope", "project")
        assert not path.exists()

    def test_user_scope_and_foreign_file(
        self, home: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """User scope writes under ~/.config/mini-swe-agent; a file that is not ours is kept."""
        tao(capsys, "hooks", "install", "mini-swe-agent")
        path = home / ".config" / "mini-swe-agent" / "tao.yaml"
        assert path.is_file()
        path.write_text("model: {}\n")
        code, _, err = tao(capsys, "hooks", "uninstall", "mini-swe-agent")
        assert code == 2 and "not TAO's overlay" in err
        assert path.read_text() == "model: {}\n"
