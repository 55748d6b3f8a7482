"""``tao plan``: the output format, every policy, the options, and the one-line error contract."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared.cli import plan as plan_module
from shared.cli.main import main
from shared.cli.plan import deadline_after, run_policy
from shared.core.policies import DEFAULT_BUDGET, POLICY_NAMES, PlanOptions
from shared.core.problem import ZERO, PlanResult, Problem
from shared.examples import path as example_path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = str(example_path())
KEYS = ["assignments", "objective", "exact", "method", "states", "elapsed_ms", "reason", "policy"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, field: str) -> None:
    assert err.endswith("\n")
    assert err.count("\n") == 1, err
    assert err.startswith(f"tao plan: error: {field}: "), err
    assert "Traceback" not in err


def write(tmp_path: Path, doc: object) -> str:
    file = tmp_path / "snapshot.json"
    file.write_text(json.dumps(doc))
    return str(file)


class TestOutput:
    """A valid snapshot prints one JSON line with the documented keys in order, and exits 0."""

    def test_example_plan(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The bundled example plans with tao: exact, keys in order, objective matches."""
        code, out, err = run(capsys, "plan", EXAMPLE)
        assert (code, err) == (0, "")
        assert out.count("\n") == 1
        doc = json.loads(out)
        assert list(doc) == KEYS
        assert list(doc["objective"]) == ["credit", "ready", "tokens", "admitted"]
        assert doc["policy"] == "tao"
        assert doc["exact"] is True
        assert doc["reason"] is None
        assert doc["objective"]["admitted"] == len(doc["assignments"])
        assert all(list(a) == ["session", "node"] for a in doc["assignments"])
        assert isinstance(doc["elapsed_ms"], float)
        assert round(doc["elapsed_ms"], 3) == doc["elapsed_ms"]

    def test_example_flag(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``--example`` plans the bundled file, same plan as naming it."""
        _, by_name, _ = run(capsys, "plan", EXAMPLE)
        code, by_flag, _ = run(capsys, "plan", "--example")
        assert code == 0
        assert json.loads(by_flag)["assignments"] == json.loads(by_name)["assignments"]

    def test_stdin(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``-`` reads the snapshot from stdin."""
        stdin = io.TextIOWrapper(io.BytesIO(example_path().read_bytes()))
        monkeypatch.setattr(sys, "stdin", stdin)
        code, out, _ = run(capsys, "plan", "-")
        assert code == 0
        assert json.loads(out)["objective"]["admitted"] > 0

    def test_empty_snapshot(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """No nodes and no candidates: an empty, exact plan."""
        code, out, _ = run(capsys, "plan", write(tmp_path, {"quantum": 512, "nodes": [],
                                                            "candidates": []}))  # fmt: skip
        doc = json.loads(out)
        assert code == 0
        assert doc["assignments"] == []
        assert doc["objective"] == {"credit": 0, "ready": 0, "tokens": 0, "admitted": 0}


class TestPolicies:
    """Every registered policy runs through ``tao plan --policy`` and gives a feasible plan."""

    @pytest.mark.parametrize("name", POLICY_NAMES)
    def test_policy(self, capsys: pytest.CaptureFixture[str], name: str) -> None:
        """Each session is placed once, on an eligible node, within the node's capacity."""
        code, out, err = run(capsys, "plan", EXAMPLE, "--policy", name)
        assert (code, err) == (0, "")
        doc = json.loads(out)
        assert doc["policy"] == name
        snap = json.loads(example_path().read_text())
        q = snap["quantum"]
        cands = {c["id"]: c for c in snap["candidates"]}
        used = {n["id"]: 0 for n in snap["nodes"]}
        sessions = [a["session"] for a in doc["assignments"]]
        assert len(sessions) == len(set(sessions))
        for a in doc["assignments"]:
            cand = cands[a["session"]]
            assert a["node"] in cand.get("eligible", used)
            used[a["node"]] += -(-cand["weight"] // q)
        assert all(used[n["id"]] <= n["free"] // q for n in snap["nodes"])

    def test_unknown_policy(self, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown name exits 2 and lists the known names."""
        code, out, err = run(capsys, "plan", EXAMPLE, "--policy", "fastest")
        assert (code, out) == (2, "")
        one_error_line(err, "--policy")
        assert all(name in err for name in POLICY_NAMES)


class TestOptions:
    """``--budget`` and ``--time-limit-ms`` are validated and reach the policy."""

    @pytest.mark.parametrize("value", ["0", "-3", "1.5", "many"])
    def test_bad_budget(self, capsys: pytest.CaptureFixture[str], value: str) -> None:
        """A budget that is not an integer >= 1 exits 2."""
        code, _, err = run(capsys, "plan", EXAMPLE, f"--budget={value}")
        assert code == 2
        one_error_line(err, "--budget")

    @pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
    def test_bad_time_limit(self, capsys: pytest.CaptureFixture[str], value: str) -> None:
        """A time limit that is not a finite number > 0 exits 2."""
        code, _, err = run(capsys, "plan", EXAMPLE, f"--time-limit-ms={value}")
        assert code == 2
        one_error_line(err, "--time-limit-ms")

    def test_budget_one(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The smallest budget still yields a plan (a fallback, if the DP needs more)."""
        code, out, _ = run(capsys, "plan", EXAMPLE, "--budget", "1")
        assert code == 0
        assert list(json.loads(out)) == KEYS

    def test_time_limit(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A time limit is accepted and the plan is printed."""
        code, out, _ = run(capsys, "plan", EXAMPLE, "--time-limit-ms", "60000")
        assert code == 0
        assert list(json.loads(out)) == KEYS

    def test_options_reach_the_policy(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """run_policy passes the budget, and a deadline callback only when a limit is given."""
        seen: list[PlanOptions] = []

        class Spy:
            name = "spy"

            def plan(self, problem: Problem, options: PlanOptions) -> PlanResult:
                seen.append(options)
                return PlanResult((), ZERO, True, "spy")

        monkeypatch.setattr(plan_module, "get_policy", lambda name: Spy())
        empty = Problem(quantum=1, nodes=(), candidates=())
        run_policy(empty, "spy", budget=7)
        run_policy(empty, "spy", budget=DEFAULT_BUDGET, time_limit_ms=5.0)
        assert (seen[0].budget, seen[0].expired) == (7, None)
        assert seen[1].budget == DEFAULT_BUDGET
        assert seen[1].expired is not None
        assert seen[1].expired() is False


class TestDeadline:
    """The deadline callback turns true once the limit has passed on the shell's clock."""

    def test_turns_true_at_the_deadline(self) -> None:
        """With a fake clock: false before start + ms, true from then on."""
        now = [100.0]
        expired = deadline_after(250.0, clock=lambda: now[0])
        assert expired() is False
        now[0] = 100.249
        assert expired() is False
        now[0] = 100.25
        assert expired() is True


BAD_INPUTS: list[tuple[str, Any, str]] = [
    ("not json", "{nodes", "input"),
    ("top level array", [], "input"),
    ("missing quantum", {"nodes": [], "candidates": []}, "quantum"),
    ("wrong type", {"quantum": "512", "nodes": [], "candidates": []}, "quantum"),
    ("bool", {"quantum": True, "nodes": [], "candidates": []}, "quantum"),
    ("float", {"quantum": 512.0, "nodes": [], "candidates": []}, "quantum"),
    ("negative", {"quantum": 512, "nodes": [{"id": "n1", "free": -1}], "candidates": []},
     "nodes[0].free"),
    ("quantum zero", {"quantum": 0, "nodes": [], "candidates": []}, "quantum"),
    ("ready 2", {"quantum": 1, "nodes": [], "candidates": [
        {"id": "s", "weight": 1, "ready": 2, "tokens": 1}]}, "candidates[0].ready"),
    ("duplicate node", {"quantum": 1, "nodes": [{"id": "a", "free": 1}, {"id": "a", "free": 2}],
                        "candidates": []}, "nodes[1].id"),
    ("duplicate candidate", {"quantum": 1, "nodes": [], "candidates": [
        {"id": "s", "weight": 1, "ready": 0, "tokens": 1},
        {"id": "s", "weight": 1, "ready": 0, "tokens": 1}]}, "candidates[1].id"),
    ("unknown credit node", {"quantum": 1, "nodes": [], "candidates": [
        {"id": "s", "weight": 1, "ready": 0, "tokens": 1, "credit": {"x": 1}}]},
     'candidates[0].credit["x"]'),
    ("unknown eligible node", {"quantum": 1, "nodes": [], "candidates": [
        {"id": "s", "weight": 1, "ready": 0, "tokens": 1, "eligible": ["x"]}]},
     "candidates[0].eligible[0]"),
    ("empty id", {"quantum": 1, "nodes": [{"id": "", "free": 1}], "candidates": []},
     "nodes[0].id"),
    ("too large", {"quantum": 2**40 + 1, "nodes": [], "candidates": []}, "quantum"),
]  # fmt: skip


class TestErrors:
    """Every class of bad input exits 2 with one stderr line naming the field, no stdout."""

    @pytest.mark.parametrize(
        ("doc", "field"), [pytest.param(d, f, id=name) for name, d, f in BAD_INPUTS]
    )
    def test_bad_input(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, doc: Any, field: str
    ) -> None:
        """``tao plan: error: <field>: <reason>`` and exit 2."""
        file = tmp_path / "bad.json"
        file.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        code, out, err = run(capsys, "plan", str(file))
        assert (code, out) == (2, "")
        one_error_line(err, field)

    def test_missing_file(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """An unreadable FILE is an input error."""
        code, _, err = run(capsys, "plan", str(tmp_path / "absent.json"))
        assert code == 2
        one_error_line(err, "input")

    def test_example_and_file(self, capsys: pytest.CaptureFixture[str]) -> None:
        """``--example`` with a FILE is a usage error."""
        code, _, err = run(capsys, "plan", EXAMPLE, "--example")
        assert code == 2
        one_error_line(err, "--example")

    def test_unknown_option(self, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown option exits 2 with one line, not argparse's usage block."""
        code, _, err = run(capsys, "plan", EXAMPLE, "--fast")
        assert code == 2
        assert err.count("\n") == 1
        assert err.startswith("tao plan: error: unrecognized arguments: --fast")


class TestSubprocess:
    """``python -m shared.cli.main`` exits with the documented codes in a real process."""

    def test_exit_codes(self) -> None:
        """Valid example exits 0 with one JSON line; bad stdin exits 2 with one stderr line."""
        cmd = [sys.executable, "-m", "shared.cli.main", "plan"]
        ok = subprocess.run([*cmd, EXAMPLE], cwd=ROOT, capture_output=True, text=True, check=False)
        assert (ok.returncode, ok.stderr) == (0, "")
        assert list(json.loads(ok.stdout)) == KEYS
        bad = subprocess.run(
            [*cmd, "-"], cwd=ROOT, input='{"quantum": 1.0}', capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert (bad.returncode, bad.stdout) == (2, "")
        assert bad.stderr == "tao plan: error: quantum: must be an integer, got number (1.0)\n"
