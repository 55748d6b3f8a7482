"""Shell commands that run tests or a build get their own tool key (``Bash:test``)."""

from __future__ import annotations

import pytest

from shared.harness.claude import ClaudeMapper
from shared.harness.commands import is_test_or_build, shell_tool_key


class TestCommandKind:
    """Test runners, build tools and package-manager verbs, behind wrappers and chains."""

    @pytest.mark.parametrize(
        ("command", "run"),
        [
            ("pytest -x tests/", True),
            ("cd repo && python -m pytest tests/unit -q", True),
            ("PYTHONPATH=. uv run pytest", True),
            ("timeout 600 make -j4", True),
            ("./gradlew test", True),
            ("cargo test --all", True),
            ("go test ./...", True),
            ("npm test", True),
            ("npm run test:unit", True),
            ("yarn run build", True),
            ("npx jest src", True),
            ("git status; cargo build 2>&1 | tail -5", True),
            ("ls -la", False),
            ("cat README.md | grep test", False),
            ("grep -rn pytest .", False),
            ("npm install", False),
            ("npm run dev", False),
            ("go mod tidy", False),
            ("python script.py", False),
            ("echo 'unbalanced", False),
            ("", False),
        ],
    )
    def test_table(self, command: str, run: bool) -> None:
        """Each row's command is a test or build run, or not."""
        assert is_test_or_build(command) is run

    @pytest.mark.parametrize(
        ("command", "key"), [("make", "Bash:test"), ("ls", "Bash"), (None, "Bash"), (3, "Bash")]
    )
    def test_key(self, command: object, key: str) -> None:
        """A non-string command keeps the tool's name."""
        assert shell_tool_key("Bash", command) == key


class TestClaudeHook:
    """The Claude Code mapper reports the key on a Bash call's start and end alike."""

    def test_start_and_end_agree(self) -> None:
        m = ClaudeMapper()
        base = {"session_id": "s", "tool_name": "Bash", "tool_use_id": "t1",
                "tool_input": {"command": "npm run build"}}  # fmt: skip
        start = m.map({**base, "hook_event_name": "PreToolUse"}, 1.0)
        end = m.map({**base, "hook_event_name": "PostToolUse", "tool_response": {}}, 2.0)
        assert [e.tool for e in (*start, *end)] == ["Bash:test", "Bash:test"]  # type: ignore[attr-defined]

    def test_other_tools_unchanged(self) -> None:
        m = ClaudeMapper()
        body = {"session_id": "s", "tool_name": "Read", "tool_use_id": "t2",
                "hook_event_name": "PreToolUse", "tool_input": {"command": "make"}}  # fmt: skip
        assert [e.tool for e in m.map(body, 1.0)] == ["Read"]  # type: ignore[attr-defined]
