"""``tao hook <harness>``: forward one hook payload from stdin to NATS, fast and silently.

A harness runs this as its hook command (Claude Code: ``tao hook claude``; OpenHands: ``tao
hook openhands``). It reads the payload on stdin, publishes the bytes unparsed on
``tao.v1.hook.<token>`` (:func:`shared.contracts.subjects.hook_events`) with the receive time
in the ``Tao-Received-At`` header, and exits 0 printing nothing, always: with bad input, NATS
down, a missing or broken run file, or any exception. A hook must never block or disturb its
agent (Claude Code treats exit code 2 as "block the tool call" and shows stderr; see
https://code.claude.com/docs/en/hooks, "Exit code output"), so every fault is swallowed; the
tools service, which maps and validates the payload, dead-letters what it cannot read.

Speed. It runs once per tool call, so it imports only the standard library and speaks the NATS
client protocol itself (https://docs.nats.io/reference/reference-protocols/nats-protocol):
read ``INFO``, send ``CONNECT {"verbose":false,"pedantic":false,"headers":true}``, ``HPUB``
and ``PING``, wait for ``PONG``. A plain publish on a subject a JetStream stream captures is
stored by the stream; the ``PONG`` says the server has processed the publish. Deadlines,
counted from when the command starts (after the interpreter's start-up): stdin is read for at
most :data:`READ_DEADLINE_S`, and connect + publish get :data:`PUBLISH_DEADLINE_S` but end by
:data:`TOTAL_DEADLINE_S` at the latest, so the process ends inside 300 ms even when the server
accepts the connection and never answers (a local publish takes about a millisecond).

Where to publish: ``TAO_NATS_URL`` (the first URL of a comma-separated list), else the NATS URL
of a running ``tao up`` (its run file, :mod:`shared.infra.runfile`, read here with the standard
library), else ``nats://127.0.0.1:4222``. ``TAO_NAMESPACE`` prefixes the subject as the bus
does (``<ns>.tao.v1.hook.<token>``). ``user:password@`` or ``token@`` in the URL authenticate;
TLS is not spoken (the hook gives up silently when the server requires it).

Nothing is lost. A payload that cannot be published within the deadline (NATS down, or a CPU so
busy that the deadline passes: seen dropping 32 of 240 events under load) is appended to a spool
file, ``<spool dir>/<subject>.spool`` (``TAO_HOOK_SPOOL``, else ``hook-spool`` beside the run
file), and a detached drainer process (``python -m shared.harness.hookclient drain``) is
started, so the hook still returns at once. The drainer (one per subject: it holds a lock) moves
the spool aside, publishes its records in order with the receive time each had, records its
progress after each (a drainer that dies goes on where it stopped), and retries with back-off
for up to :data:`DRAIN_GIVE_UP_S` of failures in a row (``TAO_HOOK_DRAIN_S``); what is still
undelivered then waits for the next hook, which starts a drainer again. While anything is
spooled, new payloads are spooled behind it rather than sent ahead, so a subject's events reach
NATS in the order the hooks ran. The spool holds at most :data:`SPOOL_MAX_BYTES`; past that a
payload is dropped (the only loss, with NATS down for that long). A session whose end is never
delivered is ended by the idle timeout (``TAO_IDLE_TIMEOUT_S``), which gives its reservation
back.

Oversized payloads. At most :data:`MAX_HOOK_BYTES` are forwarded. A larger payload — usually a
``PostToolUse`` whose ``tool_response`` holds a big output — is slimmed first (:func:`slim`:
every string longer than 1 KiB cut to its first 256 characters, read up to
:data:`MAX_READ_BYTES`), so its event still reaches TAO with every id, flag and number intact.
One that is not JSON, or still too large (or that would not fit the server's ``max_payload``),
is replaced by a small marker, ``tao-hook-oversized <bytes read>`` followed by the payload's
first bytes, which the tools service dead-letters as oversized: the operator sees it, and NATS
never has to refuse it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO
from urllib.parse import unquote

__all__ = [
    "DEFAULT_NATS_URL",
    "DRAIN_GIVE_UP_S",
    "MAX_HOOK_BYTES",
    "MAX_READ_BYTES",
    "OVERSIZED_MARKER",
    "PUBLISH_DEADLINE_S",
    "READ_DEADLINE_S",
    "RECEIVED_AT_HEADER",
    "SPOOL_MAX_BYTES",
    "TOTAL_DEADLINE_S",
    "HookClientError",
    "Spool",
    "drain",
    "hook_subject",
    "nats_url",
    "oversized_marker",
    "publish",
    "read_payload",
    "run_file_path",
    "run_hook",
    "slim",
    "spool_dir",
]

MAX_HOOK_BYTES = 1 << 20
MAX_READ_BYTES = 16 << 20
"""Most stdin read: an oversized payload up to this size can still be slimmed."""
_SLIM_ABOVE = 1024
_SLIM_KEEP = 256
"""Equal to :data:`shared.harness.base.MAX_HOOK_BYTES` (kept in step by a test)."""
RECEIVED_AT_HEADER = "Tao-Received-At"
"""Equal to :data:`shared.contracts.subjects.RECEIVED_AT_HEADER` (kept in step by a test)."""
TENANT_HEADER = "Tao-Tenant"
"""Equal to :data:`shared.infra.tenants.TENANT_HEADER` (kept in step by a test)."""


def hook_headers(received_at: float, env: Mapping[str, str]) -> dict[str, str]:
    """The headers a payload is published with: its receive time, and ``TAO_TENANT`` (the
    tenant whose sessions this harness runs, when the gateway serves tenants) if set."""
    headers = {RECEIVED_AT_HEADER: f"{received_at:.6f}"}
    tenant = env.get("TAO_TENANT", "").strip()
    if tenant:
        headers[TENANT_HEADER] = tenant
    return headers


OVERSIZED_MARKER = b"tao-hook-oversized "
"""Start of the body forwarded instead of an oversized payload: marker, byte count, newline,
then the payload's first :data:`_MARKER_PREFIX_BYTES` bytes."""
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
READ_DEADLINE_S = 0.1
PUBLISH_DEADLINE_S = 0.1
TOTAL_DEADLINE_S = 0.2
SPOOL_MAX_BYTES = 64 << 20
DRAIN_GIVE_UP_S = 600.0
_DRAIN_ATTEMPT_S = 2.0
_DRAIN_BACKOFF_S = (0.05, 5.0)

_MARKER_PREFIX_BYTES = 512
_HOOK_PREFIX = "tao.v1.hook."  # shared.contracts.subjects.hook_events (a test keeps them equal)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class HookClientError(Exception):
    """The payload could not be published (never escapes :func:`run_hook`)."""


# -- what and where --------------------------------------------------------------------------


def _is_name(text: str, longest: int) -> bool:
    return 0 < len(text) <= longest and all(c in _NAME_CHARS for c in text)


def hook_subject(token: str, namespace: str = "") -> str:
    """The wire subject for harness ``token``, with the bus's namespace prefix."""
    if not _is_name(token, 128):
        raise HookClientError(f"invalid harness token {token!r}")
    if namespace and not _is_name(namespace, 64):
        raise HookClientError(f"invalid TAO_NAMESPACE {namespace!r}")
    subject = _HOOK_PREFIX + token
    return f"{namespace}.{subject}" if namespace else subject


def run_file_path(env: Mapping[str, str]) -> str:
    """Where ``tao up`` writes its run file (as :func:`shared.infra.runfile.run_file_path`)."""
    if env.get("TAO_RUN_FILE"):
        return os.path.expanduser(env["TAO_RUN_FILE"])
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "tao", "run.json")
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache", "tao", "run.json")


def nats_url(env: Mapping[str, str]) -> str:
    """``TAO_NATS_URL``, else the URL in the file ``TAO_NATS_URL_FILE`` names (a ``hook``
    role's, from ``tao keys access``), else the running ``tao up``'s hook URL, else the local
    default."""
    configured = env.get("TAO_NATS_URL", "").split(",")[0].strip()
    if configured:
        return configured
    url_file = env.get("TAO_NATS_URL_FILE", "").strip()
    if url_file:
        try:
            with open(url_file, encoding="utf-8") as fh:
                return fh.read(4096).strip().split(",")[0].strip() or DEFAULT_NATS_URL
        except (OSError, UnicodeDecodeError):
            raise HookClientError(f"TAO_NATS_URL_FILE: cannot read {url_file}") from None
    try:
        with open(run_file_path(env), "rb") as fh:
            info = json.loads(fh.read(65536))
        for key in ("hook_nats_url", "nats_url"):
            url = info.get(key) if isinstance(info, dict) else None
            if isinstance(url, str) and url:
                return url
    except (OSError, ValueError):
        pass
    return DEFAULT_NATS_URL


def _address(url: str) -> tuple[str, int, dict[str, str], str | None]:
    """(host, port, credentials for CONNECT, the CA file when TLS) of a ``nats://`` or
    ``tls://`` URL (``?ca=FILE``: the CA that signed the server's certificate, as the URL
    files of ``tao keys access --tls`` name it; "" for the system's)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "nats", url
    if scheme not in ("nats", "tls"):
        raise HookClientError(f"unsupported URL scheme {scheme!r}")
    rest, _, query = rest.partition("?")
    ca = next((unquote(v) for k, _, v in (q.partition("=") for q in query.split("&"))
               if k == "ca"), None)  # fmt: skip
    tls_ca = ca if ca is not None else ("" if scheme == "tls" else None)
    rest = rest.split("/", 1)[0]
    auth: dict[str, str] = {}
    if "@" in rest:
        userinfo, rest = rest.rsplit("@", 1)
        user, colon, password = (unquote(part) for part in userinfo.partition(":"))
        auth = {"user": user, "pass": password} if colon else {"auth_token": user}
    if rest.startswith("["):  # [v6]:port
        host, _, port = rest[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    try:
        return host or "127.0.0.1", int(port or 4222), auth, tls_ca
    except ValueError:
        raise HookClientError(f"bad port in {url!r}") from None


# -- stdin -----------------------------------------------------------------------------------


def read_payload(stream: BinaryIO, limit: int, deadline: float) -> bytes:
    """Up to ``limit`` + 1 bytes of ``stream``, read until EOF or ``deadline`` (monotonic)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return stream.read(limit + 1)
    chunks: list[bytes] = []
    got = 0
    while got <= limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            ready, _, _ = select.select([fd], [], [], left)
        except (OSError, ValueError):  # not selectable (e.g. Windows pipes): block
            ready = [fd]
        if not ready:
            break
        chunk = os.read(fd, min(65536, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _cut(value: object) -> object:
    if isinstance(value, str):
        if len(value) > _SLIM_ABOVE:
            return value[:_SLIM_KEEP] + f"... [{len(value)} characters, cut by tao hook]"
        return value
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def slim(payload: bytes, limit: int = MAX_HOOK_BYTES) -> bytes | None:
    """``payload`` (a JSON object) with long strings cut, if that fits in ``limit`` bytes."""
    try:
        body = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    out = json.dumps(_cut(body), ensure_ascii=False, separators=(",", ":")).encode()
    return out if len(out) <= limit else None


def oversized_marker(payload: bytes, size: int) -> bytes:
    """The body forwarded instead of an oversized payload of ``size`` (or more) bytes."""
    return OVERSIZED_MARKER + str(size).encode() + b"\n" + payload[:_MARKER_PREFIX_BYTES]


# -- NATS ------------------------------------------------------------------------------------


class _Conn:
    """A socket with a line reader bounded by one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = b""

    def _timeout(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HookClientError("deadline passed")
        return left

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self.sock.settimeout(self._timeout())
            chunk = self.sock.recv(65536)
            if not chunk:
                raise HookClientError("connection closed by the server")
            self.buf += chunk
            if len(self.buf) > (1 << 20):
                raise HookClientError("protocol line too long")
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def send(self, data: bytes) -> None:
        self.sock.settimeout(self._timeout())
        self.sock.sendall(data)


def publish(
    url: str, subject: str, payload: bytes, headers: Mapping[str, str], deadline: float
) -> None:
    """Publish ``payload`` with ``headers`` on ``subject`` and wait for the server's PONG,
    all before ``deadline`` (monotonic); :class:`HookClientError` or ``OSError`` otherwise."""
    host, port, auth, tls_ca = _address(url)
    left = deadline - time.monotonic()
    if left <= 0:
        raise HookClientError("deadline passed")
    sock = socket.create_connection((host, port), timeout=left)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(sock, deadline)
        first = conn.line()
        if not first.startswith(b"INFO "):
            raise HookClientError(f"expected INFO, got {first[:40]!r}")
        info = json.loads(first[5:])
        if not isinstance(info, dict):
            raise HookClientError("INFO is not an object")
        if info.get("tls_required") or tls_ca is not None:
            if tls_ca is None:
                raise HookClientError("the server requires TLS (a tls:// URL with ?ca=FILE)")
            import ssl  # only a TLS hook pays for it

            try:
                context = ssl.create_default_context(cafile=tls_ca or None)
                sock = context.wrap_socket(sock, server_hostname=host)
            except (OSError, ssl.SSLError) as exc:
                raise HookClientError(f"TLS: {exc}") from None
            conn = _Conn(sock, deadline)
        max_payload = int(info.get("max_payload") or MAX_HOOK_BYTES)
        with_headers = bool(info.get("headers"))
        options = {"verbose": False, "pedantic": False, "headers": with_headers, **auth}
        options.update(lang="python", version="tao-hook", protocol=1, name="tao-hook")
        head = b""
        if with_headers and headers:
            lines = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            head = f"NATS/1.0\r\n{lines}\r\n".encode()
        if len(head) + len(payload) > max_payload:
            payload = oversized_marker(payload, len(payload))
        if head:
            cmd = f"HPUB {subject} {len(head)} {len(head) + len(payload)}\r\n".encode()
        else:
            cmd = f"PUB {subject} {len(payload)}\r\n".encode()
        connect = b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + b"\r\n"
        conn.send(connect + cmd + head + payload + b"\r\nPING\r\n")
        while True:
            line = conn.line()
            if line == b"PONG":
                return
            if line == b"PING":
                conn.send(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise HookClientError(line.decode(errors="replace"))
    finally:
        sock.close()


# -- the spool -------------------------------------------------------------------------------


def spool_dir(env: Mapping[str, str]) -> str:
    """``TAO_HOOK_SPOOL``, else ``hook-spool`` in the run file's directory."""
    if env.get("TAO_HOOK_SPOOL"):
        return os.path.expanduser(env["TAO_HOOK_SPOOL"])
    return os.path.join(os.path.dirname(run_file_path(env)), "hook-spool")


class Spool:
    """The undelivered payloads of one subject, in order (module docstring).

    Files: ``<subject>.spool`` (appended by hooks, each append under an exclusive ``flock`` of
    the file, checked to be the file at the path), ``<subject>.draining`` (moved aside by the
    drainer), ``<subject>.offset`` (bytes of ``.draining`` delivered) and ``<subject>.lock``
    (held by the one drainer). A record is ``b"<received_at> <length>\\n" + payload + b"\\n"``.
    """

    def __init__(self, directory: str, subject: str) -> None:
        base = os.path.join(directory, subject)
        self.directory = directory
        self.subject = subject
        self.path = base + ".spool"
        self.draining = base + ".draining"
        self.offset = base + ".offset"
        self.lock = base + ".lock"

    def pending(self) -> bool:
        """Whether anything is waiting to be delivered."""
        for path in (self.draining, self.path):
            try:
                if os.path.getsize(path) > 0:
                    return True
            except OSError:
                continue
        return False

    def append(self, payload: bytes, received_at: float) -> bool:
        """Add one record at the end; False when the spool is full."""
        import fcntl

        record = f"{received_at:.6f} {len(payload)}\n".encode() + payload + b"\n"
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                mine = os.fstat(fd)
                try:
                    there = os.stat(self.path)
                except FileNotFoundError:
                    continue  # the drainer moved it aside meanwhile: append to the new one
                if (there.st_ino, there.st_dev) != (mine.st_ino, mine.st_dev):
                    continue
                if mine.st_size + len(record) > SPOOL_MAX_BYTES:
                    return False
                view = memoryview(record)
                while view:
                    view = view[os.write(fd, view) :]
                return True
            finally:
                os.close(fd)

    def take(self) -> bool:
        """Move the spool aside for delivery (unless a moved-aside one is still undelivered);
        whether there is something to deliver."""
        import fcntl

        if os.path.exists(self.draining):
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # no append is half done while it moves
            if os.fstat(fd).st_size == 0:
                os.remove(self.path)
                return False
            os.rename(self.path, self.draining)
            return True
        finally:
            os.close(fd)

    def records(self) -> Iterator[tuple[int, float, bytes]]:
        """``(end offset, received_at, payload)`` of each record of ``.draining`` past the
        delivered offset; a torn last record (a hook killed mid-write) ends the file."""
        try:
            with open(self.offset, "rb") as fh:
                start = int(fh.read(32) or b"0")
        except (OSError, ValueError):
            start = 0
        with open(self.draining, "rb") as fh:
            fh.seek(start)
            while True:
                head = fh.readline(64)
                if not head.endswith(b"\n"):
                    return
                try:
                    at_text, size_text = head.split()
                    received_at, size = float(at_text), int(size_text)
                except ValueError:
                    return
                payload = fh.read(size + 1)
                if len(payload) != size + 1 or payload[-1:] != b"\n":
                    return
                yield fh.tell(), received_at, payload[:-1]

    def delivered(self, offset: int) -> None:
        with open(self.offset + ".tmp", "wb") as fh:
            fh.write(str(offset).encode())
        os.replace(self.offset + ".tmp", self.offset)

    def finished(self) -> None:
        """The moved-aside spool is delivered: remove it and its offset."""
        for path in (self.draining, self.offset):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def drain(spool: Spool, env: Mapping[str, str], give_up_s: float = DRAIN_GIVE_UP_S) -> int:
    """Deliver ``spool`` in order (the drainer process's work); the records published, or
    -1 when another drainer holds the lock. Gives up after ``give_up_s`` of failures in a row,
    leaving what is left for the next drainer.

    A hook that appends while a drainer holds the lock starts a drainer that finds the lock
    held and leaves; if that append came after the holder's last look at the spool, nobody
    would send it until the next hook (a session's last events: Stop, SessionEnd, seen 28 s
    late under load). So after releasing the lock the drainer looks again and, while
    something is pending, drains again."""
    total = -1
    while True:
        sent, gave_up = _drain_once(spool, env, give_up_s)
        if sent < 0:  # another drainer holds the lock: its own look after release covers it
            return total
        total = max(total, 0) + sent
        if gave_up or not spool.pending():
            return total


def _drain_once(spool: Spool, env: Mapping[str, str], give_up_s: float) -> tuple[int, bool]:
    """One locked pass of :func:`drain`: (records published or -1, whether it gave up)."""
    import fcntl

    os.makedirs(spool.directory, mode=0o700, exist_ok=True)
    lock = os.open(spool.lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return -1, False
        sent = 0
        backoff = _DRAIN_BACKOFF_S[0]
        failing_since: float | None = None
        while spool.take():
            for end, received_at, payload in spool.records():
                headers = hook_headers(received_at, env)
                while True:
                    try:
                        deadline = time.monotonic() + _DRAIN_ATTEMPT_S
                        publish(nats_url(env), spool.subject, payload, headers, deadline)
                        break
                    except (HookClientError, OSError, ValueError):
                        now = time.monotonic()
                        failing_since = now if failing_since is None else failing_since
                        if now - failing_since >= give_up_s:
                            return sent, True
                        time.sleep(backoff)
                        backoff = min(backoff * 2, _DRAIN_BACKOFF_S[1])
                failing_since, backoff = None, _DRAIN_BACKOFF_S[0]
                spool.delivered(end)
                sent += 1
            spool.finished()
        return sent, False
    finally:
        os.close(lock)


def _start_drainer(spool: Spool, env: Mapping[str, str]) -> None:
    """A detached ``python -m shared.harness.hookclient drain DIR SUBJECT`` (its own session, no
    inherited descriptors): the hook does not wait for it."""
    import subprocess

    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shared.harness.hookclient",
            "drain",
            spool.directory,
            spool.subject,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
        env=dict(env),
    )


# -- the command -----------------------------------------------------------------------------


def _forward(argv: Sequence[str], stdin: BinaryIO, env: Mapping[str, str], start: float) -> None:
    if not argv:
        return
    from shared.harness.registry import find  # stdlib-only module; resolves names and tokens

    token = find(argv[0]).token
    subject = hook_subject(token, env.get("TAO_NAMESPACE", ""))
    payload = read_payload(stdin, MAX_READ_BYTES, start + READ_DEADLINE_S)
    received_at = time.time()
    if not payload.strip():
        return
    if len(payload) > MAX_HOOK_BYTES:
        slimmed = slim(payload) if len(payload) <= MAX_READ_BYTES else None
        payload = slimmed if slimmed is not None else oversized_marker(payload, len(payload))
    headers = hook_headers(received_at, env)
    spool = Spool(spool_dir(env), subject)
    if not spool.pending():
        deadline = min(time.monotonic() + PUBLISH_DEADLINE_S, start + TOTAL_DEADLINE_S)
        try:
            publish(nats_url(env), subject, payload, headers, deadline)
            return
        except (HookClientError, OSError, ValueError):
            pass
    if spool.append(payload, received_at):  # behind what waits, or because this one failed
        _start_drainer(spool, env)


def hook_help() -> str:
    """What ``tao hook --help`` prints: the usage, the harness names and where events go."""
    from shared.harness.registry import HARNESSES

    names = "\n".join(
        f"  {', '.join(dict.fromkeys((h.name, h.token))):<24} -> tao.v1.hook.{h.token}"
        for h in HARNESSES
    )
    return (
        "usage: tao hook HARNESS < payload.json\n\n"
        "Forward one harness hook payload from stdin to NATS and exit 0, silently, whatever\n"
        "happens (a hook never blocks its agent). Harnesses:\n"
        f"{names}\n\n"
        "NATS: TAO_NATS_URL, else the running `tao up`'s, else nats://127.0.0.1:4222.\n"
        "TAO_NAMESPACE prefixes the subject. What cannot be sent in time is spooled\n"
        "(TAO_HOOK_SPOOL) and delivered later, in order.\n"
        "Install into a harness's settings: tao hooks install TARGET (see its --help).\n"
    )


def run_hook(
    argv: Sequence[str],
    stdin: BinaryIO | None = None,
    env: Mapping[str, str] | None = None,
) -> int:
    """``tao hook HARNESS``: forward stdin (module docstring). Returns 0, whatever happens;
    ``tao hook --help`` (or ``-h``) prints :func:`hook_help` instead."""
    if argv[:1] in (["-h"], ["--help"]):
        with contextlib.suppress(OSError):
            sys.stdout.write(hook_help())
        return 0
    start = time.monotonic()
    try:
        source = stdin if stdin is not None else sys.stdin.buffer
        _forward(argv, source, os.environ if env is None else env, start)
    except BaseException:  # a hook never fails its agent (module docstring)
        pass
    return 0


def _main(argv: Sequence[str]) -> int:
    """``python -m shared.harness.hookclient drain DIR SUBJECT``: the drainer; silent, exit 0."""
    try:
        if len(argv) == 3 and argv[0] == "drain":
            give_up = float(os.environ.get("TAO_HOOK_DRAIN_S") or DRAIN_GIVE_UP_S)
            drain(Spool(argv[1], argv[2]), os.environ, give_up)
    except BaseException:  # like the hook: nothing to say, nobody to say it to
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
