"""TAO's OpenCode plugin, run by Node against a stand-in gateway; its posts through the mapper."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.session import SessionEnd
from shared.contracts.tool import ToolEnd, ToolStart
from shared.harness.opencode import OpenCodeMapper

ROOT = Path(__file__).parents[3]
PLUGIN_DIR = ROOT / "shared" / "harness" / "opencode_plugin"
CHECK = Path(__file__).with_name("opencode_plugin_check.mjs")
NODE = shutil.which("node")


def strips_types() -> bool:
    """Whether this node runs .ts files itself (Node >= 22.6 with the flag)."""
    if NODE is None:
        return False
    probe = subprocess.run(
        [NODE, "--experimental-strip-types", "-e", "0"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


def plugins() -> list[Any]:
    ts = pytest.param(
        ["--experimental-strip-types", str(PLUGIN_DIR / "tao.ts")],
        id="tao.ts",
        marks=pytest.mark.skipif(not strips_types(), reason="this node cannot strip TS types"),
    )
    return [pytest.param([str(PLUGIN_DIR / "tao.mjs")], id="tao.mjs"), ts]


@pytest.mark.skipif(NODE is None, reason="node is not installed")
class TestPluginUnderNode:
    @pytest.mark.parametrize("plugin", plugins())
    def test_plugin_behaviour_and_mapping(self, plugin: list[str]) -> None:
        """The Node check passes (hooks never wait, posts in order, errors swallowed), and what
        the plugin posted maps to one start at time.start and one censored end at time.end."""
        *flags, file = plugin
        run = subprocess.run(
            [NODE or "node", *flags, str(CHECK), file],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr or run.stdout
        bodies = json.loads(run.stdout)
        mapper = OpenCodeMapper()
        out = [m for body in bodies for m in mapper.map(body, 1767225700.0)]
        kinds = [(type(m).__name__, getattr(m, "tool", None)) for m in out]
        assert kinds == [
            ("ToolStart", "bash"),
            ("ToolEnd", "bash"),
            ("ToolStart", "user"),
            ("ToolEnd", "user"),
            ("SessionEnd", None),
        ]
        start, end = out[0], out[1]
        assert isinstance(start, ToolStart) and isinstance(end, ToolEnd)
        assert (start.started_at, start.timeout_s) == (1767225600.0, 300.0)
        assert (end.ended_at, end.censored, end.ok) == (1767225608.421, True, True)
        assert isinstance(out[4], SessionEnd) and out[4].reason == "client_closed"


_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|`(?:[^`\\]|\\.)*`')


def literals(path: Path) -> list[str]:
    """The file's string literals, comments and the type-only import left out."""
    text = path.read_text()
    text = re.sub(r"^import type .*$", "", text, flags=re.M)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"^\s*//.*$", "", text, flags=re.M)
    return sorted(_LITERAL.findall(text))


class TestBuild:
    def test_the_compiled_plugin_matches_its_source(self) -> None:
        """tao.mjs is tao.ts compiled: the same string literals (hook names, marker, headers).
        Regenerate with scripts/build_opencode_plugin.sh after editing tao.ts."""
        assert literals(PLUGIN_DIR / "tao.mjs") == literals(PLUGIN_DIR / "tao.ts")
        assert len(literals(PLUGIN_DIR / "tao.ts")) > 20
