"""``tao hook <harness>``: silent, exit 0 whatever happens, and light to start."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.contracts import subjects
from shared.harness import base, hookclient
from shared.harness.hookclient import (
    MAX_HOOK_BYTES,
    OVERSIZED_MARKER,
    RECEIVED_AT_HEADER,
    HookClientError,
    Spool,
    drain,
    hook_subject,
    nats_url,
    oversized_marker,
    read_payload,
    run_file_path,
    run_hook,
)
from shared.infra import runfile
from shared.infra.embedded import free_port

ROOT = Path(__file__).parents[3]
FIXTURE = (ROOT / "tests" / "fixtures" / "claude-code" / "pre-tool-use-bash.json").read_bytes()


@pytest.fixture(autouse=True)
def spool_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Each test's undelivered payloads spool into its own directory, and their drainers
    give up within a second (NATS is unreachable in most tests here)."""
    spool = tmp_path / "spool"
    monkeypatch.setenv("TAO_HOOK_SPOOL", str(spool))
    monkeypatch.setenv("TAO_HOOK_DRAIN_S", "1")
    yield spool
    subprocess.run(["pkill", "-f", f"shared.harness.hookclient drain {spool}"], check=False)


def hook_process(
    stdin: bytes, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[bytes]:
    base_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TAO_") or k in ("TAO_HOOK_SPOOL", "TAO_HOOK_DRAIN_S")
    }
    return subprocess.run(
        [sys.executable, "-m", "shared.cli.entry", "hook", *args],
        input=stdin,
        env={**base_env, **env},
        capture_output=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never says a word."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"nats://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    srv.close()


class TestNeverFails:
    """Exit 0, nothing on stdout or stderr, in every failure case."""

    @pytest.mark.parametrize(
        ("stdin", "args", "env"),
        [
            (FIXTURE, ("claude",), {}),
            (b"not json at all", ("claude",), {}),
            (b"", ("claude",), {}),
            (FIXTURE, ("no-such-harness",), {}),
            (FIXTURE, (), {}),
            (FIXTURE, ("claude", "extra"), {}),
            (FIXTURE, ("claude",), {"TAO_NAMESPACE": "bad namespace!"}),
            (FIXTURE, ("claude",), {"TAO_NATS_URL": "tls://127.0.0.1:1"}),
            (FIXTURE, ("claude",), {"TAO_NATS_URL": "nats://127.0.0.1:notaport"}),
        ],
        ids=[
            "unreachable",
            "garbage",
            "empty",
            "unknown-harness",
            "no-harness",
            "extra-args",
            "bad-namespace",
            "tls",
            "bad-url",
        ],
    )
    def test_nats_unreachable(
        self, stdin: bytes, args: tuple[str, ...], env: dict[str, str]
    ) -> None:
        env = {"TAO_NATS_URL": f"nats://127.0.0.1:{free_port()}", **env}
        proc = hook_process(stdin, env, *args)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")

    def test_server_that_never_answers(self, silent_server: str) -> None:
        """The deadline ends the wait for INFO."""
        proc = hook_process(FIXTURE, {"TAO_NATS_URL": silent_server}, "claude")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")

    @pytest.mark.parametrize("content", [None, b"{broken", b'{"pid": 1, "nats_url": 5}'])
    def test_run_file_missing_or_broken(self, tmp_path: Path, content: bytes | None) -> None:
        """No TAO_NATS_URL and a missing or unreadable run file: the default URL, still
        silent (published under a namespace of its own, so nothing else sees it)."""
        run = tmp_path / "run.json"
        if content is not None:
            run.write_bytes(content)
        env = {"TAO_RUN_FILE": str(run), "TAO_NAMESPACE": "thookprocess"}
        proc = hook_process(FIXTURE, env, "claude")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")

    def test_in_process_exception_is_swallowed(self) -> None:
        """Even a stdin that raises gives 0."""

        class Exploding(io.BytesIO):
            def fileno(self) -> int:
                raise RuntimeError("boom")

            def read(self, n: int | None = -1) -> bytes:
                raise RuntimeError("boom")

        assert run_hook(["claude"], Exploding(), {}) == 0

    def test_light_imports(self) -> None:
        """The hook path imports neither the CLI nor numpy, numba or nats-py."""
        code = (
            "import sys; sys.argv = ['tao', 'hook', 'claude']\n"
            "from shared.cli.entry import main\n"
            "main()\n"
            "heavy = {'numpy', 'numba', 'nats', 'asyncio', 'msgspec', 'shared.cli.main'}\n"
            "print(sorted(heavy & set(sys.modules)))\n"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("TAO_")}
        env["TAO_NATS_URL"] = f"nats://127.0.0.1:{free_port()}"
        env["TAO_HOOK_SPOOL"] = os.environ["TAO_HOOK_SPOOL"]  # the test's own (spool_here)
        env["TAO_HOOK_DRAIN_S"] = "1"
        proc = subprocess.run(
            [sys.executable, "-c", code],
            input=FIXTURE,
            env=env,
            capture_output=True,
            cwd=ROOT,
            timeout=30,
            check=False,
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"[]\n", b"")


class TestAgreement:
    """The stdlib-only client agrees with the project's own definitions."""

    def test_constants(self) -> None:
        assert MAX_HOOK_BYTES == base.MAX_HOOK_BYTES
        assert RECEIVED_AT_HEADER == subjects.RECEIVED_AT_HEADER == base.RECEIVED_AT_HEADER

    @pytest.mark.parametrize("namespace", ["", "t1234", "prod_a-b"])
    def test_subject(self, namespace: str) -> None:
        plain = subjects.hook_events("claude")
        assert hook_subject("claude", namespace) == (f"{namespace}.{plain}" if namespace else plain)

    @pytest.mark.parametrize(("token", "namespace"), [("a.b", ""), ("claude", "x y"), ("", "")])
    def test_bad_subject(self, token: str, namespace: str) -> None:
        with pytest.raises(HookClientError):
            hook_subject(token, namespace)

    @pytest.mark.parametrize(
        "env",
        [
            {"TAO_RUN_FILE": "~/x/run.json", "HOME": "/home/u"},
            {"XDG_RUNTIME_DIR": "/run/user/1", "HOME": "/home/u"},
            {"HOME": "/home/u"},
        ],
    )
    def test_run_file_path(self, env: dict[str, str]) -> None:
        assert run_file_path(env) == str(runfile.run_file_path(env))

    def test_url_order(self, tmp_path: Path) -> None:
        """TAO_NATS_URL, else the run file, else the default."""
        run = tmp_path / "run.json"
        run.write_text('{"pid": 1, "nats_url": "nats://10.0.0.1:4333", "redis_url": "r"}')
        env = {"TAO_RUN_FILE": str(run)}
        assert nats_url(env) == "nats://10.0.0.1:4333"
        assert nats_url({**env, "TAO_NATS_URL": "nats://a:1,nats://b:2"}) == "nats://a:1"
        assert nats_url({"TAO_RUN_FILE": str(tmp_path / "none")}) == "nats://127.0.0.1:4222"

    def test_url_of_the_hook_role(self, tmp_path: Path) -> None:
        """A `tao up` that checks access records the hook role's URL, which a hook prefers to
        the operator's; ``TAO_NATS_URL_FILE`` (a URL file of `tao keys access`) comes before
        the run file, and one that cannot be read is an error, not a silent default."""
        run = tmp_path / "run.json"
        run.write_text(
            '{"pid": 1, "nats_url": "nats://ops:p@h:1", "redis_url": "r",'
            ' "hook_nats_url": "nats://hook:q@h:1"}'
        )
        env = {"TAO_RUN_FILE": str(run)}
        assert nats_url(env) == "nats://hook:q@h:1"
        (tmp_path / "hook.nats-url").write_text("nats://hook:z@h:2\n")
        assert nats_url({**env, "TAO_NATS_URL_FILE": str(tmp_path / "hook.nats-url")}) == (
            "nats://hook:z@h:2"
        )
        with pytest.raises(HookClientError, match="TAO_NATS_URL_FILE"):
            nats_url({**env, "TAO_NATS_URL_FILE": str(tmp_path / "missing")})

    def test_read_payload_caps(self) -> None:
        """At most limit + 1 bytes are read; a larger payload becomes the marker."""
        data = read_payload(io.BytesIO(b"x" * 100), 10, deadline=float("inf"))
        assert data == b"x" * 11
        marker = oversized_marker(data, len(data))
        assert marker.startswith(OVERSIZED_MARKER + b"11\n")


class TestSpool:
    """The spool's files: order, the delivered offset, a torn record, the size bound."""

    def test_records_in_order_and_resume_after_the_delivered_offset(self, tmp_path: Path) -> None:
        spool = Spool(str(tmp_path), "tao.v1.hook.claude")
        for i in range(3):
            assert spool.append(f"payload {i}\nwith a newline".encode(), 100.0 + i)
        assert spool.pending() and spool.take()
        assert spool.append(b"late", 200.0)  # a hook while the drainer works: the next file
        records = list(spool.records())
        assert [(at, p) for _, at, p in records] == [
            (100.0 + i, f"payload {i}\nwith a newline".encode()) for i in range(3)
        ]
        spool.delivered(records[0][0])  # a drainer delivered one, then died
        assert [p for _, _, p in spool.records()] == [r[2] for r in records[1:]]
        spool.finished()
        assert spool.take() and [p for _, _, p in spool.records()] == [b"late"]
        spool.finished()
        assert not spool.take() and not spool.pending()

    def test_a_torn_last_record_ends_the_file(self, tmp_path: Path) -> None:
        spool = Spool(str(tmp_path), "s")
        assert spool.append(b"whole", 1.0)
        with open(spool.path, "ab") as fh:
            fh.write(b"2.000000 50\npart")  # a hook killed mid-write
        assert spool.take()
        assert [p for _, _, p in spool.records()] == [b"whole"]

    def test_a_full_spool_refuses(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(hookclient, "SPOOL_MAX_BYTES", 64)
        spool = Spool(str(tmp_path), "s")
        assert spool.append(b"x" * 20, 1.0)
        assert not spool.append(b"y" * 40, 2.0)
        assert spool.take() and [p for _, _, p in spool.records()] == [b"x" * 20]

    def test_one_drainer_per_subject(self, tmp_path: Path) -> None:
        """A second drainer finds the lock held and leaves at once."""
        import fcntl

        spool = Spool(str(tmp_path), "s")
        assert spool.append(b"x", 1.0)
        fd = os.open(spool.lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            assert drain(spool, {"TAO_NATS_URL": f"nats://127.0.0.1:{free_port()}"}, 0.1) == -1
        finally:
            os.close(fd)
        assert spool.pending()

    def test_an_append_after_the_drainers_last_look_is_still_sent(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A hook appends just after the drainer found the spool empty (its own drainer found
        the lock held and left): the drainer looks again after releasing the lock and sends
        it, in order, instead of leaving it for the next hook."""
        sent: list[bytes] = []
        monkeypatch.setattr(
            hookclient, "publish", lambda url, subj, data, hdrs, dl: sent.append(data)
        )
        spool = Spool(str(tmp_path), "s")
        assert spool.append(b"first", 1.0)
        take = Spool.take
        raced: list[bool] = []

        def racing_take(self: Spool) -> bool:
            got = take(self)
            if not got and not raced:  # the late hook, between the last look and the unlock
                raced.append(True)
                assert self.append(b"late", 2.0)
            return got

        monkeypatch.setattr(Spool, "take", racing_take)
        assert drain(spool, {"TAO_NATS_URL": "nats://127.0.0.1:1"}, 0.1) == 2
        assert sent == [b"first", b"late"] and not spool.pending()

    def test_unreachable_nats_spools_the_payload(self, tmp_path: Path) -> None:
        """The hook returns at once, silently, and the payload waits in the spool."""
        env = {"TAO_NATS_URL": f"nats://127.0.0.1:{free_port()}"}
        proc = hook_process(FIXTURE, env, "claude")
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")
        spool = Spool(os.environ["TAO_HOOK_SPOOL"], hook_subject("claude"))
        assert spool.pending()  # appended before the hook returned; the drainer cannot send
        spool.take()
        assert [p for _, _, p in spool.records()] == [FIXTURE]


class TestHelp:
    def test_help_lists_every_harness_and_exits_0(self) -> None:
        """`tao hook --help` (it printed nothing) names the usage and every harness by name
        and token, through the console script's fast path."""
        from shared.harness.registry import HARNESSES

        for flag in ("--help", "-h"):
            done = subprocess.run(
                [sys.executable, "-m", "shared.cli.entry", "hook", flag],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert done.returncode == 0 and done.stderr == ""
            assert done.stdout.startswith("usage: tao hook HARNESS")
            for h in HARNESSES:
                assert h.name in done.stdout and f"tao.v1.hook.{h.token}" in done.stdout
