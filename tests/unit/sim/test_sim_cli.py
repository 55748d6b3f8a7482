"""``tao sim``: the --json schema, the files --out writes, and one-line usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.cli.main import main
from shared.sim.metrics import METRICS

TINY = (
    'name = "tiny"\nshared_prefix_tokens = 32\nturns = 3\noutput_tokens = 8\n'
    "observation_tokens = 40\ninitial_tokens = 200\n"
    '[[tools]]\nname = "x"\nduration = {dist = "lognormal", median = 0.4, p90 = 0.7}\n'
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    f = tmp_path / "tiny.toml"
    f.write_text(TINY)
    return str(f)


class TestJson:
    """--json prints {"runs": [...]} with every documented metric name."""

    def test_schema(self, capsys: pytest.CaptureFixture[str], tiny: str) -> None:
        """One run per (workers, seed, policy), each with policy/seed/workers/nodes/metrics."""
        code, out, _ = run(
            capsys, "sim", "--workload", tiny, "--tasks", "3", "--workers", "2,3", "--seeds", "2",
            "--policies", "tao,rr,lower-bound", "--nodes", "1", "--json", "--quiet",
        )  # fmt: skip
        assert code == 0
        doc = json.loads(out)
        assert set(doc) == {"runs", "paired"}
        runs = doc["runs"]
        assert len(runs) == 2 * 2 * 3
        for r in runs:
            assert set(r) == {"policy", "seed", "workers", "nodes", "metrics"}
            assert set(r["metrics"]) == set(METRICS)
            assert r["nodes"] == 1 and r["workers"] in (2, 3) and r["seed"] in (0, 1)
            assert r["metrics"]["tasks"] == 3
        assert {r["policy"] for r in runs} == {"tao", "rr", "lower-bound"}
        paired = doc["paired"]  # tao vs rr (not the bound), per workers and paired metric
        assert {(p["policy"], p["baseline"]) for p in paired} == {("tao", "rr")}
        assert {p["workers"] for p in paired} == {2, 3}
        for p in paired:
            assert set(p) == {"policy", "baseline", "workers", "metric", "n", "mean_pct",
                              "ci_low_pct", "ci_high_pct"}  # fmt: skip
            assert p["n"] <= 2
            if p["n"] == 2:
                assert p["ci_low_pct"] <= p["mean_pct"] <= p["ci_high_pct"]
            else:
                assert p["ci_low_pct"] is None and p["ci_high_pct"] is None


class TestOut:
    """--out writes the report, CSVs and plots."""

    def test_files(self, capsys: pytest.CaptureFixture[str], tiny: str, tmp_path: Path) -> None:
        """report.md, runs.csv, summary.csv and the PNGs exist; the table goes to stdout."""
        out_dir = tmp_path / "o"
        code, out, err = run(
            capsys, "sim", "--workload", tiny, "--tasks", "4", "--workers", "4",
            "--policies", "tao,tao-bfd,short-first", "--out", str(out_dir),
            "--snapshots", "10",
        )  # fmt: skip
        assert code == 0
        assert "tao vs best baseline" in out
        assert "tao vs short-first" in out  # the paired comparison
        assert "tao vs short-first" in (out_dir / "report.md").read_text()
        assert "done" in err  # stderr is not a terminal: one line per finished run
        names = ["report.md", "runs.csv", "summary.csv", "timeseries.csv", "ticks.csv"]
        names += ["latency_cdf.png", "running.png", "ablation.png", "snapshots.csv"]
        for name in names:
            assert (out_dir / name).stat().st_size > 0, name


class TestUsage:
    """Bad arguments exit 2 with one line on stderr."""

    @pytest.mark.parametrize(
        ("argv", "needle"),
        [
            (["--policies", "tao,nope"], "unknown policy 'nope'"),
            (["--workers", "0"], "--workers"),
            (["--workers", "a,b"], "--workers"),
            (["--extra-tool-delay", "5-1"], "--extra-tool-delay"),
            (["--profile", "gpt9"], "unknown profile"),
            (["--workload", "/nope.toml"], "neither a built-in"),
            (["--trace", "/nope.jsonl"], "--trace"),
            (["--arrival-rate", "1", "--workers", "4"], "--arrival-rate"),
            (["--nodes", "-1"], "--nodes"),
            (["--nodes", "2", "--domains", "3"], "--domains"),
            (["--domains", "0"], "--domains"),
            (["--host-kv", "-1"], "--host-kv"),
            (["--host-kv", "nan"], "--host-kv"),
            (["--host-kv", "lots"], "--host-kv"),
        ],
    )
    def test_one_line(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
    ) -> None:
        """Exit 2, one line naming what was wrong, nothing on stdout."""
        code, out, err = run(capsys, "sim", *argv)
        assert code == 2
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("tao sim: error:")
        assert needle in err
