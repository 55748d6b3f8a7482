"""schemas/: generated from the structs, deterministic, and checked for drift."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.contracts import MESSAGE_TYPES
from shared.contracts.schemagen import SCHEMA_DIR, check, main, render, write


class TestDrift:
    """The committed schemas equal the generator's output."""

    def test_committed_schemas_match_generator(self) -> None:
        """No file in schemas/ is missing, different or stale (fix: python -m
        shared.contracts.schemagen)."""
        assert check(SCHEMA_DIR) == []

    def test_check_cli_passes(self) -> None:
        """``--check`` exits 0 on the committed tree."""
        assert main(["--check"]) == 0


class TestGenerator:
    """The generator writes one deterministic file per top-level message."""

    def test_one_file_per_message(self) -> None:
        """Each message type and the KV batch get ``<module>.<Class>.json``."""
        names = set(render())
        assert "tool.ToolStart.json" in names
        assert "kv.KVEventBatch.json" in names
        assert len(names) == len(MESSAGE_TYPES) + 1

    def test_deterministic_and_sorted(self) -> None:
        """Two renders are identical; keys are sorted; files end with one newline."""
        first, second = render(), render()
        assert first == second
        for text in first.values():
            assert text.endswith("}\n") and not text.endswith("\n\n")
            assert (
                text
                == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            )

    def test_schema_describes_the_tag(self) -> None:
        """A message schema requires its ``type`` tag with the class name."""
        schema = json.loads(render()["tool.ToolEnd.json"])
        body = schema["$defs"]["ToolEnd"]
        assert schema["$ref"] == "#/$defs/ToolEnd"
        assert body["properties"]["type"] == {"enum": ["ToolEnd"]}
        assert body["required"][:2] == ["type", "session_id"]

    def test_check_reports_changed_missing_and_stale(self, tmp_path: Path) -> None:
        """check lists a modified, a deleted and an unexpected file; write repairs all."""
        assert write(tmp_path) == sorted(render())
        (tmp_path / "tool.ToolEnd.json").write_text("{}\n")
        (tmp_path / "plan.Plan.json").unlink()
        (tmp_path / "old.Gone.json").write_text("{}\n")
        assert check(tmp_path) == ["old.Gone.json", "plan.Plan.json", "tool.ToolEnd.json"]
        write(tmp_path)
        assert check(tmp_path) == []

    def test_check_cli_fails_on_drift(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``--check`` exits 1 and names each drifted file."""
        assert main(["--check", "--dir", str(tmp_path)]) == 1
        assert "drifted:" in capsys.readouterr().err
        assert main(["--dir", str(tmp_path)]) == 0
        assert main(["--check", "--dir", str(tmp_path)]) == 0
