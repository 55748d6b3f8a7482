"""``tao compare``: every policy on one snapshot, as a table or as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cli.compare import versus
from shared.cli.main import main
from shared.core.policies import POLICY_NAMES
from shared.core.problem import Objective
from shared.examples import path as example_path

SMALL = ["--nodes", "2", "--candidates", "8", "--load", "2", "--seed", "3"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestTable:
    """The table has a title, a header and one row per policy, tao first."""

    def test_row_per_policy(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Every name in POLICY_NAMES gets exactly one row, in registry order."""
        code, out, err = run(capsys, "compare", *SMALL)
        assert (code, err) == (0, "")
        title, header, *rows = out.splitlines()
        assert title.startswith("snapshot: generated (seed 3, 2 nodes, 8 candidates")
        assert header.split()[:9] == [
            "policy", "credit", "ready", "tokens", "admitted", "exact", "method", "states", "ms",
        ]  # fmt: skip
        assert "vs tao" in header
        assert [r.split()[0] for r in rows] == list(POLICY_NAMES)
        assert rows[0].split()[9] == "="

    def test_snapshot_file(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``--snapshot FILE`` compares on that file."""
        code, out, _ = run(capsys, "compare", "--snapshot", str(example_path()))
        assert code == 0
        assert "(3 nodes, 10 candidates)" in out.splitlines()[0]
        assert len(out.splitlines()) == 2 + len(POLICY_NAMES)


class TestJson:
    """``--json`` prints one JSON list: a ``tao plan`` object per policy plus ``vs_tao``."""

    def test_json_list(self, capsys: pytest.CaptureFixture[str]) -> None:
        """One entry per policy; exact tao is never beaten lexicographically."""
        code, out, _ = run(capsys, "compare", *SMALL, "--interchangeable", "--json")
        docs = json.loads(out)
        assert code == 0
        assert [d["policy"] for d in docs] == list(POLICY_NAMES)
        assert all(list(d)[:6] == ["assignments", "objective", "exact", "method", "states",
                                   "elapsed_ms"] for d in docs)  # fmt: skip
        assert docs[0]["vs_tao"] == "="
        if docs[0]["exact"]:
            assert all(d["vs_tao"] in ("=", "<") for d in docs)


class TestVersus:
    """The ``vs tao`` marker is the lexicographic order of the objective tuples."""

    @pytest.mark.parametrize(
        ("mine", "ref", "mark"),
        [
            ((5, 0, 0, 1), (5, 0, 0, 1), "="),
            ((4, 9, 9, 9), (5, 0, 0, 0), "<"),
            ((5, 1, 0, 0), (5, 0, 99, 9), ">"),
            ((5, 1, 7, 2), (5, 1, 7, 3), "<"),
        ],
    )
    def test_marker(self, mine: tuple[int, ...], ref: tuple[int, ...], mark: str) -> None:
        """Credit decides first, then readiness, then tokens, then the count admitted."""
        assert versus(Objective(*mine), Objective(*ref)) == mark


class TestCompareErrors:
    """Bad compare options exit 2 with one line."""

    @pytest.mark.parametrize(
        ("argv", "field"),
        [
            (["--nodes", "0"], "--nodes"),
            (["--candidates", "-1"], "--candidates"),
            (["--load", "0"], "--load"),
            (["--credit", "all"], "--credit"),
            (["--budget", "0"], "--budget"),
            (["--snapshot", "x.json", "--nodes", "3"], "--snapshot"),
        ],
    )
    def test_bad_option(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], field: str
    ) -> None:
        """``tao compare: error: <option>: <reason>``."""
        code, out, err = run(capsys, "compare", *argv)
        assert (code, out) == (2, "")
        assert err.count("\n") == 1
        assert err.startswith(f"tao compare: error: {field}: ")

    def test_bad_snapshot(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """A bad snapshot file names the field, as in ``tao plan``."""

        file = tmp_path / "bad.json"
        file.write_text('{"quantum": 512, "nodes": [{"id": "n1", "free": 1.5}], "candidates": []}')
        code, _, err = run(capsys, "compare", "--snapshot", str(file))
        assert code == 2
        assert err.startswith("tao compare: error: nodes[0].free: must be an integer")
