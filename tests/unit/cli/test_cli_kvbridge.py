"""``tao kv-bridge`` arguments: endpoints from the nodes file, one-line errors with exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from shared.cli.kvbridge import resolve
from shared.cli.main import main
from shared.cli.ops import OpsError

NODES = """\
[[node]]
id = "a"
url = "http://h:8000"
kv_events = "tcp://h:5557"
kv_replay = "tcp://h:5558"

[[node]]
id = "b"
url = "http://h:8001"
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A nodes file with node a (KV endpoints) and b (none), and no running ``tao up``."""
    path = tmp_path / "nodes.toml"
    path.write_text(NODES)
    return {"TAO_NODES_FILE": str(path), "TAO_RUN_FILE": str(tmp_path / "run.json")}


def args(**kw: Any) -> argparse.Namespace:
    base = {"kv_events": None, "kv_replay": None, "nats": "nats://x:4222", "replay_timeout": 2.0}
    return argparse.Namespace(**{**base, **kw})


class TestResolve:
    """Endpoints come from the node's entry unless given; NATS from --nats or the env."""

    def test_endpoints_from_nodes_file(self, env: dict[str, str]) -> None:
        """Node a's kv_events and kv_replay are used, and the NATS URL is carried."""
        settings, node, events, replay = resolve(args(node="a"), env)
        assert (node, events, replay) == ("a", "tcp://h:5557", "tcp://h:5558")
        assert settings.nats_url == "nats://x:4222"

    def test_flags_override_the_file(self, env: dict[str, str]) -> None:
        """--kv-events and --kv-replay win over the nodes file (and need no entry)."""
        _, node, events, replay = resolve(
            args(node="zz", kv_events="tcp://e:1", kv_replay="tcp://e:2"), env
        )
        assert (node, events, replay) == ("zz", "tcp://e:1", "tcp://e:2")

    def test_nats_from_environment(self, env: dict[str, str]) -> None:
        """Without --nats, TAO_NATS_URL is used."""
        settings, *_ = resolve(args(node="a", nats=None), {**env, "TAO_NATS_URL": "nats://y:1"})
        assert settings.nats_url == "nats://y:1"

    def test_corrupt_run_file_is_no_running_stack(self, env: dict[str, str]) -> None:
        """An unreadable run file is read as no ``tao up``: NATS must then come from elsewhere."""
        Path(env["TAO_RUN_FILE"]).write_text("{not json")
        settings, node, events, _ = resolve(args(node="a"), env)
        assert (node, events, settings.nats_url) == ("a", "tcp://h:5557", "nats://x:4222")
        with pytest.raises(OpsError, match="no NATS"):
            resolve(args(node="a", nats=None), env)

    @pytest.mark.parametrize(
        ("kw", "says"),
        [
            ({"node": "nope"}, "unknown node 'nope'"),
            ({"node": "b"}, "has no kv_events"),
            ({"node": "a.b", "kv_events": "tcp://h:1"}, "--node"),
            ({"node": "a", "kv_events": "h:1"}, "--kv-events"),
            ({"node": "a", "nats": None}, "no NATS"),
            ({"node": "a", "replay_timeout": 0.0}, "--replay-timeout"),
        ],
    )
    def test_bad_input(self, env: dict[str, str], kw: dict[str, Any], says: str) -> None:
        """Each bad input is refused with a message naming what was wrong."""
        with pytest.raises(OpsError, match=says.replace(".", r"\.")):
            resolve(args(**kw), env)


class TestCommandLine:
    """The command exits 2 with one line on stderr for bad usage."""

    @pytest.mark.parametrize(
        ("argv", "says"),
        [
            (["kv-bridge"], "--node"),
            (["kv-bridge", "--node", "nope"], "unknown node 'nope'"),
            (["kv-bridge", "--node", "b"], "no kv_events"),
        ],
    )
    def test_exit_2_one_line(
        self,
        argv: list[str],
        says: str,
        env: dict[str, str],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.delenv("TAO_NODES", raising=False)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("tao kv-bridge: error:") and says in err[0]
