"""`tao service`, `tao up`, `tao status` and `tao demo`: bad usage is one line and exit 2."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from services.simnode.__main__ import parse_config
from shared.cli.main import main
from shared.cli.ops import key_lines, status_table, up_config
from shared.cli.stack import (
    Stack,
    StackConfig,
    StackError,
    exit_reason,
    last_warning,
    reach,
    simnode_launch,
)
from shared.infra.settings import Settings


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def no_running_stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No `tao up` is found and no servers are configured, whatever the machine runs."""
    monkeypatch.setenv("TAO_RUN_FILE", str(tmp_path / "absent.json"))
    for name in ("TAO_REDIS_URL", "TAO_NATS_URL", "TAO_DOMAIN"):
        monkeypatch.delenv(name, raising=False)


class TestUsageErrors:
    """Each bad invocation exits 2 with exactly one line naming the problem."""

    @pytest.mark.parametrize(
        ("argv", "fragment"),
        [
            (("service", "nope"), "invalid choice: 'nope'"),
            (("--bogus",), "tao: error: unrecognized arguments: --bogus"),
            (("--bogus", "status"), "unrecognized arguments: --bogus"),
            (("up", "--time-scale", "0"), "--time-scale: must be > 0"),
            (("up", "--port", "70000"), "--port: must be in 0..65535"),
            (("up", "--sim-nodes", "-1"), "--sim-nodes: must be >= 0"),
            (("up", "--host-kv", "-1"), "--host-kv: host KV factor: must be finite and >= 0"),
            (("up", "--policy", "nope"), "--policy: must be one of tao,"),
            (("demo", "--policies", "tao,nope"), "unknown policy 'nope'"),
            (("demo", "--sessions", "0"), "--sessions: must be >= 1"),
            (("demo", "--host-kv", "inf"), "--host-kv: host KV factor: must be finite"),
            (("demo", "--nodes-file", "/nonexistent/nodes.toml"), "--nodes-file: /nonexistent"),
            (("engines", "up", "--block-size", "16"), "--block-size: vLLM's CPU build needs"),
            (("engines", "up", "--max-model-len", "17000"), "--max-model-len: 17000 must be at"),
            (("engines", "up", "--python", "/nonexistent/python"), "--python: /nonexistent"),
            (("status",), "no Redis: pass --redis URL"),
            (("status", "--redis", "redis://127.0.0.1:1/0"), "cannot read redis://127.0.0.1:1/0"),
        ],
    )
    def test_one_line_exit_2(
        self, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], fragment: str
    ) -> None:
        """The message names what was wrong; nothing goes to stdout; no traceback."""
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and fragment in err, err
        assert "Traceback" not in err


class TestUpEnvironment:
    """``tao up`` starts its services in the environment's namespace and domain (it used to
    give them ``TAO_NAMESPACE=`` whatever was set, so a namespaced hook went nowhere)."""

    def test_namespace_and_domain_reach_the_services(self) -> None:
        args = build_up_args()
        config = up_config(args, {"TAO_NAMESPACE": "team-a", "TAO_DOMAIN": "pool-1"})
        assert (config.namespace, config.domain) == ("team-a", "pool-1")
        env = Stack(config).service_env()
        assert (env["TAO_NAMESPACE"], env["TAO_DOMAIN"]) == ("team-a", "pool-1")
        plain = Stack(up_config(args, {})).service_env()
        assert (plain["TAO_NAMESPACE"], plain["TAO_DOMAIN"]) == ("", "default")

    def test_a_bad_namespace_is_one_line(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("TAO_NAMESPACE", "no spaces")
        code, out, err = run(capsys, "up")
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "TAO_NAMESPACE" in err and "Traceback" not in err


class TestUpListensOnLoopback:
    """Every port a `tao up` simnode opens (HTTP, KV events, replay) is on loopback, as the
    services' are (the ZMQ endpoints used to bind `tcp://*`, every interface)."""

    def test_simnode_listeners(self) -> None:
        cmd, spec = simnode_launch(0, up_config(build_up_args(), {}), (8101, 8102, 8103))
        _, host, port = parse_config(cmd[3:])  # [python, -m, services.simnode, ...]
        assert (host, port) == ("127.0.0.1", 8101)
        for flag, port_, given in (
            ("--kv-events", 8102, spec.kv_events), ("--kv-replay", 8103, spec.kv_replay)
        ):  # fmt: skip
            bound = cmd[cmd.index(flag) + 1]
            assert bound == given == f"tcp://127.0.0.1:{port_}"
        assert spec.url == "http://127.0.0.1:8101"


class TestUpHostTier:
    def test_host_kv_reaches_the_simnode_and_the_nodes_file(self) -> None:
        """`tao up --host-kv F` gives each simnode its host tier and tells the valuation, in
        the nodes file, what a host-tier load costs (the profile's bytes and bandwidth)."""
        from shared.core.engine import DEFAULT_PROFILE, PROFILES

        args = build_up_args()
        args.host_kv = 4.0
        cmd, spec = simnode_launch(0, up_config(args, {}), (8101, 8102, 8103))
        config, _, _ = parse_config(cmd[3:])
        profile = PROFILES[DEFAULT_PROFILE]
        assert config.host_kv == 4.0
        assert config.host_link() == profile.host_link(4.0)
        assert spec.host_load_s_per_token == pytest.approx(
            profile.kv_bytes_per_gpu_token / profile.h2d_bytes_s
        )
        plain_cmd, plain = simnode_launch(0, up_config(build_up_args(), {}), (8101, 8102, 8103))
        assert "--host-kv" not in plain_cmd and plain.host_load_s_per_token == 0.0


class TestUpHost:
    """``tao up --host``: the gateway listens where it says (loopback by default), the stack
    reaches it on loopback for a wildcard, and beyond loopback it needs a key, which ``tao
    up`` shows only when it was generated."""

    def test_the_gateway_listens_on_the_host_given(self) -> None:
        from shared.cli.main import build_parser

        default = Stack(up_config(build_up_args(), {})).service_env()
        assert default["TAO_GATEWAY_HOST"] == "127.0.0.1"
        args = build_parser().parse_args(["up", "--host", "0.0.0.0", "--port", "8123"])
        stack = Stack(up_config(args, {}))
        env = stack.service_env()
        assert env["TAO_GATEWAY_HOST"] == "0.0.0.0"
        assert stack.gateway_url == "http://127.0.0.1:8123"

    @pytest.mark.parametrize(
        ("host", "reached"),
        [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "[::1]"), ("::1", "[::1]"),
         ("10.0.0.2", "10.0.0.2"), ("localhost", "localhost")],
    )  # fmt: skip
    def test_where_the_stack_reaches_the_gateway(self, host: str, reached: str) -> None:
        assert reach(host) == reached

    def test_a_generated_key_is_shown_once_a_given_one_never(self, tmp_path: Path) -> None:
        from services.gateway.gatewaykey import resolve

        settings = Settings(gateway_host="0.0.0.0", state_dir=str(tmp_path))
        first, again = resolve(settings), resolve(settings)
        assert first.key is not None and first.key in key_lines(first)
        assert first.key not in key_lines(again) and str(tmp_path) in key_lines(again)
        given = resolve(settings.replace(gateway_key="mine"))
        assert "mine" not in key_lines(given) and "TAO_GATEWAY_KEY" in key_lines(given)
        off = resolve(settings.replace(gateway_auth="off"))
        assert "TAO_GATEWAY_AUTH=off" in key_lines(off)
        assert key_lines(resolve(Settings())) == ""


class TestExitReason:
    """The one line a dead child's log gives as its reason (``shared.cli.stack.exit_reason``)."""

    CRASH = (
        '{"event":"service_crashed","service":"gateway","exception":[{"exc_type":"OSError",'
        '"exc_value":"[Errno 98] address already in use"}]}'
    )

    @pytest.mark.parametrize(
        ("lines", "reason"),
        [
            (["gateway: TAO_POLICY: must be one of tao, got 'x'"], "TAO_POLICY: must be one of"),
            ([CRASH, '{"event":"service_stopped","exit_code":1}', "Unclosed client session"],
             "OSError: [Errno 98] address already in use"),
            (['{"event":"service_crashed","exception":"Traceback\\nValueError: bad"}'],
             "ValueError: bad"),
            (['{"event":"service_started"}', "planner: not this service's line"], None),
            ([], None),
        ],
    )  # fmt: skip
    def test_reason(self, tmp_path: Path, lines: list[str], reason: str | None) -> None:
        log = tmp_path / "gateway.log"
        log.write_text("".join(f"{line}\n" for line in lines))
        got = exit_reason(log, "gateway")
        assert got == reason if reason is None else (got or "").startswith(reason), got

    def test_missing_log(self, tmp_path: Path) -> None:
        assert exit_reason(tmp_path / "absent.log", "gateway") is None


class TestStartupWait:
    """Waiting for the stack to come up: a dead child ends the wait at once, and a timeout names
    each service's newest warning (CI once saw only "no planner is ready" after 60 s)."""

    def test_last_warning(self, tmp_path: Path) -> None:
        log = tmp_path / "planner.log"
        log.write_text(
            '{"event":"lease_error","level":"warning","error":"timeout","timestamp":"t1"}\n'
            '{"event":"planner_warm","level":"info"}\nnot json\n'
        )
        assert last_warning(log) == "lease_error: timeout (t1)"
        log.write_text('{"event":"planner_warm","level":"info"}\n')
        assert last_warning(log) is None
        assert last_warning(tmp_path / "absent.log") is None

    def test_a_child_that_dies_ends_the_wait_for_another(self, tmp_path: Path) -> None:
        import sys

        stack = Stack(StackConfig(log_dir=str(tmp_path)))
        log = tmp_path / "planner.log"
        log.write_text("planner: TAO_POLICY: must be one of tao, got 'x'\n")
        stack._spawn("gateway", [sys.executable, "-c", "import time; time.sleep(60)"], {})
        stack._spawn("planner", [sys.executable, "-c", "raise SystemExit(2)"], {})
        try:  # the planner's exit, not the gateway's 60 s limit ("did not answer"), ends it
            with pytest.raises(StackError, match=r"^planner: exited with code 2: TAO_POLICY"):
                stack._wait_http("gateway", "http://127.0.0.1:1/readyz")
        finally:
            stack.stop()


def build_up_args() -> argparse.Namespace:
    from shared.cli.main import build_parser

    return build_parser().parse_args(["up"])


class TestStatusTable:
    """The plain `tao status` form lists nodes, live sessions and planner counters."""

    def test_table_rows(self) -> None:
        """Ended sessions are left out; solve percentiles print '-' without samples."""
        text = status_table(
            {
                "domain": "d",
                "nodes": [
                    {"id": "n1", "healthy": True, "capacity_tokens": 1000, "reserved": 10,
                     "free": 890}
                ],
                "sessions": [
                    {"id": "a", "activity": "tool", "node": "n1", "tokens": 5, "version": 3,
                     "ended": False},
                    {"id": "b", "activity": "idle", "node": None, "tokens": 1, "version": 9,
                     "ended": True},
                ],
                "planner": {"ticks": 4, "plans_applied": 2, "solve_ms": None},
            }
        )  # fmt: skip
        assert "sessions 1 live" in text
        lines = text.splitlines()
        head = next(ln for ln in lines if ln.startswith("node "))
        row = lines[lines.index(head) + 1]
        for label, value in (("capacity", "1000"), ("reserved", "10"), ("free", "890")):
            cell = re.search(rf"(?<!\S){value}(?!\S)", row)
            assert cell is not None and head.index(label) + len(label) == cell.end()
        assert row.split() == ["n1", "yes", "1000", "10", "890", "-"]
        shead = next(ln for ln in lines if ln.startswith("session "))
        srow = lines[lines.index(shead) + 1]
        assert shead.split() == ["session", "activity", "node", "tokens", "version"]
        assert srow.split() == ["a", "tool", "n1", "5", "3"] and len(srow) == len(shead)
        assert "\nb " not in text
        assert "ticks 4  applied 2" in text and "p50 -" in text
