"""The planner's compilation is paid once: ``tao warm`` fills numba's on-disk cache with every
kernel, and a later process (a service starting) loads them all from it, compiling none.

Each case runs in fresh processes on an empty ``NUMBA_CACHE_DIR`` of its own (the first run
compiles for real: tens of seconds on two cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PROBE = (
    "import json; from shared.core.warm import warm_all, cache_misses; "
    "print(json.dumps({'compiled': warm_all(), 'misses': cache_misses()}))"
)
pytestmark = pytest.mark.skipif(
    os.environ.get("NUMBA_DISABLE_JIT") == "1", reason="nothing compiles without the JIT"
)


def run(args: list[str], cache: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=True
    )


def probe(cache: Path) -> dict[str, dict[str, int]]:
    out = run([sys.executable, "-c", PROBE], cache).stdout
    doc: dict[str, dict[str, int]] = json.loads(out.strip().splitlines()[-1])
    return doc


class TestWarmCache:
    def test_warmed_once_a_new_process_compiles_nothing(self, tmp_path: Path) -> None:
        """On an empty cache the warm step compiles every kernel (none is left to the first
        request); after it, ``tao warm`` and a service's process load them all, compiling
        none."""
        cache = tmp_path / "numba"
        first = probe(cache)
        assert first["compiled"], "no kernel found"
        missing = sorted(name for name, n in first["compiled"].items() if n == 0)
        assert missing == [], f"kernels the warm step never ran: {missing}"
        assert sum(first["misses"].values()) >= len(first["compiled"])
        assert any(cache.rglob("*.nbi")), "no cache index was written"
        done = run([sys.executable, "-m", "shared.cli.entry", "warm"], cache)
        assert "(0 compiled now" in done.stdout and str(cache) in done.stdout, done.stdout
        later = probe(cache)
        assert sum(later["misses"].values()) == 0, later["misses"]

    def test_an_unwritable_cache_dir_is_named(self, tmp_path: Path) -> None:
        blocker = tmp_path / "file"
        blocker.write_text("")
        env = {**os.environ, "NUMBA_CACHE_DIR": str(blocker / "numba")}
        done = subprocess.run(
            [sys.executable, "-m", "shared.cli.entry", "warm"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 1
        assert f"NUMBA_CACHE_DIR={blocker / 'numba'} is not writable" in done.stdout
