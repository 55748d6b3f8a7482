"""`tao sim --record` and `tao explain`: a simulator run's rounds, read back per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.cli.cli_util import tao


class TestRecordAndExplain:
    """A recorded run answers "why was this session released" from its record file."""

    def test_a_recorded_release_is_explained(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        record = tmp_path / "rounds.jsonl"
        code, _, err = tao(
            capsys, "sim", "--workload", "claude-code", "--profile", "deepseek-4xh100",
            "--workers", "16", "--tasks", "12", "--policies", "tao", "--quiet",
            "--record", str(record),
        )  # fmt: skip
        assert code == 0, err
        rounds = [json.loads(line) for line in record.read_text().splitlines()]
        assert rounds and all(r["policy"] == "tao" and r["rules"] == "tao" for r in rounds)
        released = [(r["now"], e) for r in rounds for e in r["entries"] if e["kind"] == "release"]
        assert released, "a contended run releases"
        now, entry = released[0]
        code, out, err = tao(capsys, "explain", entry["session"], "--from", str(record),
                             "--at", str(now))  # fmt: skip
        assert code == 0, err
        last = out.strip().splitlines()[-1]
        assert last.startswith(f"t={now:.3f}") and f"released from {entry['node']}" in last
        assert f"by rule {entry['rule']}" in last and "gain " in last and "cost " in last

    def test_unknown_session_and_missing_file_exit_2(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        empty = tmp_path / "empty.jsonl"
        empty.write_text("")
        code, _, err = tao(capsys, "explain", "nobody", "--from", str(empty))
        assert code == 2 and "session 'nobody': no round records it" in err
        code, _, err = tao(capsys, "explain", "s", "--from", str(tmp_path / "none"))
        assert code == 2 and "--from: cannot read" in err
        assert len(err.strip().splitlines()) == 1
