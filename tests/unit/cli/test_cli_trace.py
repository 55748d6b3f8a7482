"""``tao trace import``: summaries, output, exit codes; its output feeds ``tao sim`` and
``tao demo --trace``."""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import pytest

from shared.cli.demo import _check, _script
from shared.cli.main import main

FIX = Path(__file__).parents[2] / "fixtures"
CC = str(FIX / "claude-code" / "session.jsonl")
OC = str(FIX / "opencode" / "session-events.jsonl")
MS = str(FIX / "mini-swe-agent" / "example.traj.json")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def read(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


class TestImport:
    """One summary line per file on stderr; the sessions of all files in one JSONL."""

    def test_files_to_output(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """Two files: two summary lines and a total; arrivals relative to the earliest."""
        out = tmp_path / "t.jsonl"
        code, stdout, err = run(capsys, "trace", "import", "--from", "opencode", OC, OC,
                                "-o", str(out))  # fmt: skip
        assert (code, stdout) == (0, "")
        assert err.splitlines() == [
            f"tao trace import: {OC}: 2 sessions, 4 turns, 3 tools",
            f"tao trace import: {OC}: 2 sessions, 4 turns, 3 tools",
            f"tao trace import: wrote 4 sessions, 8 turns to {out}",
        ]
        recs = read(out)
        assert [r["session"] for r in recs] == ["ses_7f3a", "ses_b2", "ses_7f3a#2", "ses_b2#2"]
        assert [r["start"] for r in recs] == [0.0, 102.8, 0.0, 102.8]

    def test_stdout(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Without -o the trace goes to stdout, the summaries to stderr."""
        code, stdout, err = run(capsys, "trace", "import", "--from", "mini-swe-agent", MS)
        assert code == 0
        (rec,) = [json.loads(x) for x in stdout.splitlines()]
        assert rec["session"] == "example" and len(rec["turns"]) == 2
        assert err.splitlines()[-1] == "tao trace import: wrote 1 session, 2 turns to stdout"

    def test_sim_reads_the_output(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """``tao sim --trace`` runs on an imported Claude Code + OpenCode trace."""
        cc, oc = tmp_path / "cc.jsonl", tmp_path / "oc.jsonl"
        assert run(capsys, "trace", "import", "--from", "claude-code", CC, "-o", str(cc))[0] == 0
        assert run(capsys, "trace", "import", "--from", "opencode", OC, "-o", str(oc))[0] == 0
        both = tmp_path / "both.jsonl"
        both.write_text(cc.read_text() + oc.read_text())
        code, stdout, err = run(capsys, "sim", "--trace", str(both), "--nodes", "1",
                                "--policies", "tao,rr", "--json", "--quiet")  # fmt: skip
        assert (code, err) == (0, "")
        runs = json.loads(stdout)["runs"]
        assert [r["policy"] for r in runs] == ["tao", "rr"]
        assert all(r["metrics"]["tasks"] == 4 for r in runs)


class TestExitCodes:
    """Bad usage or input: exit 2, one line, and the output file left as it was."""

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (("trace",), "tao trace: error: the following arguments are required: COMMAND"),
            (("trace", "import", MS), "tao trace import: error: the following arguments are "
                                      "required: --from"),
            (("trace", "import", "--from", "codex", MS), "--from: invalid choice: 'codex'"),
            (("trace", "import", "--from", "opencode"), "required: FILE"),
            (("trace", "import", "--from", "opencode", "/nope.jsonl"),
             "tao trace: error: /nope.jsonl: cannot read: No such file or directory"),
            (("trace", "import", "--from", "claude-code", MS), "no usable turn"),
            (("trace", "import", "--from", "opencode", OC, "-o", "/nope/dir/t.jsonl"),
             "-o: cannot write '/nope/dir/t.jsonl'"),
        ],
    )  # fmt: skip
    def test_one_line(
        self, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
    ) -> None:
        """Exit 2 and the error is the last stderr line (summaries of good files come first)."""
        code, stdout, err = run(capsys, *argv)
        assert code == 2 and stdout == ""
        lines = err.splitlines()
        assert message in lines[-1]
        assert all(line.startswith("tao trace import: ") for line in lines[:-1])

    def test_bad_file_leaves_output(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A good file then a bad one: exit 2 and an existing -o file is untouched."""
        out = tmp_path / "t.jsonl"
        out.write_text("old\n")
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"type": "assistant"\n')
        code, _, err = run(capsys, "trace", "import", "--from", "claude-code", CC, str(bad),
                           "-o", str(out))  # fmt: skip
        assert code == 2
        assert err.splitlines()[-1].startswith(f"tao trace: error: {bad}: no usable turn")
        assert out.read_text() == "old\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "t.jsonl"]


class TestDemoTrace:
    """``tao demo --trace`` replays the recorded sessions (checked without starting a stack)."""

    def args(self, trace: str, **kw: object) -> argparse.Namespace:
        ns = argparse.Namespace(policies="tao", sessions=None, turns=None, sim_nodes=2,
                                kv_tokens=49_152, time_scale=10.0, trace=trace, seed=0,
                                repeat=1, workload="claude-code", tool_scale=10.0,
                                host_kv=0.0)  # fmt: skip
        for k, v in kw.items():
            setattr(ns, k, v)
        _check(ns)
        return ns

    def test_script_follows_the_trace(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """Session count, turns, prompt growth in words (a simnode token each), outputs, tools
        and durations scaled by --time-scale come from the trace."""
        out = tmp_path / "t.jsonl"
        assert run(capsys, "trace", "import", "--from", "claude-code", CC, "-o", str(out))[0] == 0
        ns = self.args(str(out))
        assert ns.sessions == 2
        s = _script(0, ns)
        rng = random.Random(0)
        assert s.turns == 4 and s.delay_s == 0.0 and _script(1, ns).delay_s == pytest.approx(1.61)
        (opening,) = s.opening(rng)
        assert len(opening["content"].split()) == 16204
        assert [s.output_tokens(i, rng) for i in range(4)] == [87, 140, 95, 310]
        assert s.tool(0, rng) == ("Bash", pytest.approx(0.55))
        assert s.tool(3, rng) is None
        assert len(s.observation(0, rng).split()) == 17106 - 16204 - 87

    def test_caps(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """--sessions / --turns cap what is replayed."""
        out = tmp_path / "t.jsonl"
        assert run(capsys, "trace", "import", "--from", "claude-code", CC, "-o", str(out))[0] == 0
        ns = self.args(str(out), sessions=1, turns=2)
        assert ns.sessions == 1 and _script(0, ns).turns == 2

    def test_random_defaults(self) -> None:
        """Without --trace the built-in task keeps its defaults (16 sessions x 6 turns)."""
        ns = argparse.Namespace(policies="tao", sessions=None, turns=None, sim_nodes=2,
                                kv_tokens=1, time_scale=1.0, trace=None, seed=0,
                                repeat=1, workload="claude-code", tool_scale=10.0,
                                host_kv=0.0)  # fmt: skip
        _check(ns)
        assert (ns.sessions, ns.turns, ns.trace_tasks) == (16, 6, None)
        assert _script(3, ns).turns == 6

    def test_bad_trace_exits_2(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """A missing or malformed trace fails before any stack starts: one line, exit 2."""
        code, _, err = run(capsys, "demo", "--trace", "/nope.jsonl")
        assert code == 2 and err.startswith("tao demo: error: --trace: cannot read")
        bad = tmp_path / "b.jsonl"
        bad.write_text('{"session": "a", "turns": [{"prompt_tokens": 5}]}\n')
        code, _, err = run(capsys, "demo", "--trace", str(bad))
        assert code == 2 and "b.jsonl:1.turns[0].output_tokens: missing" in err
