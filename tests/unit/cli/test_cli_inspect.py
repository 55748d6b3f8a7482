"""``tao inspect node|prefix``: bad usage and bad input exit 2 with exactly one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.cli.inspect import read_tokens
from shared.cli.main import main
from shared.cli.ops import OpsError


@pytest.fixture(autouse=True)
def no_servers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing to ask: no NATS, no nodes, no running `tao up`."""
    for var in ("TAO_NATS_URL", "TAO_NODES_FILE", "TAO_NODES", "TAO_NAMESPACE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TAO_RUN_FILE", str(tmp_path / "run.json"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *needles: str) -> bool:
    return err.count("\n") == 1 and err.startswith("tao inspect") and all(n in err for n in needles)


class TestUsage:
    @pytest.mark.parametrize(
        ("argv", "needle"),
        [
            (["inspect"], "TARGET"),
            (["inspect", "node"], "NODE"),
            (["inspect", "prefix", "--node", "n1"], "--tokens"),
            (["inspect", "prefix", "--tokens", "t.json"], "--node"),
            (["inspect", "nodes", "n1"], "invalid choice"),
            (["inspect", "node", "bad node"], "node id"),
            (["inspect", "node", "n1", "--timeout", "0"], "--timeout"),
            (["inspect", "node", "n1", "--timeout", "x"], "--timeout"),
        ],
    )
    def test_bad_usage_exits_2(
        self, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
    ) -> None:
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert one_error_line(err, needle), err

    def test_unknown_node_without_nats_or_nodes_file(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Nobody to ask and nothing to read: one line naming the node."""
        code, out, err = run(capsys, "inspect", "node", "n1", "--json")
        assert code == 2 and out == ""
        assert one_error_line(err, "unknown node 'n1'", "no NATS")


class TestTokensFile:
    @pytest.mark.parametrize(
        ("content", "needle"),
        [
            (b"", "not a JSON list"),
            (b"{}", "not a JSON list"),
            (b"[1, 2.5]", "not a JSON list"),
            (b'[1, "2"]', "not a JSON list"),
            (b"[1, -1]", "outside 0..4294967295"),
            (b"[4294967296]", "outside 0..4294967295"),
            (b"[1, 2", "not a JSON list"),
        ],
    )
    def test_bad_tokens_file_exits_2(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, needle: str
    ) -> None:
        path = tmp_path / "tokens.json"
        path.write_bytes(content)
        code, out, err = run(capsys, "inspect", "prefix", "--node", "n1", "--tokens", str(path))
        assert code == 2 and out == ""
        assert one_error_line(err, "--tokens", needle), err

    def test_missing_tokens_file_exits_2(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        missing = str(tmp_path / "nope.json")
        code, out, err = run(capsys, "inspect", "prefix", "--node", "n1", "--tokens", missing)
        assert code == 2 and out == ""
        assert one_error_line(err, "cannot read", "nope.json")

    def test_good_file_reads_token_ids(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens.json"
        path.write_bytes(b"[0, 7, 4294967295]")
        assert read_tokens(str(path)) == [0, 7, 4294967295]

    def test_read_tokens_raises_ops_error(self, tmp_path: Path) -> None:
        path = tmp_path / "tokens.json"
        path.write_bytes(b"[true]")
        with pytest.raises(OpsError, match="not a JSON list"):
            read_tokens(str(path))
