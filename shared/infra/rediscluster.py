"""A Redis Cluster on one machine: ``masters`` real valkey-servers in cluster mode, each with
``replicas`` replicas, for the scale-out tests and benchmarks (docs/scale-out.md).

The servers are the embedded Valkey binary (:func:`.embedded.find_valkey_server`, else
``valkey-server``/``redis-server`` on PATH), started with ``--cluster-enabled yes``; the cluster
is formed with the cluster commands themselves (``CLUSTER MEET``, ``CLUSTER ADDSLOTSRANGE``,
``CLUSTER REPLICATE``), the slots split evenly over the masters as ``redis-cli --cluster create``
does. A short ``cluster-node-timeout`` makes a dead master's replica take over within a few
seconds. Servers can be killed (SIGKILL) and restarted on the same port and node file, as an
operator's node failure and recovery would; a restarted old master rejoins as a replica.
Clients connect with :attr:`RedisCluster.url` (every server a startup node).
"""

from __future__ import annotations

import functools
import socket
import time
from pathlib import Path
from typing import IO

from .embedded import find_valkey_server, free_port
from .errors import EmbeddedServerError
from .serverset import ServerSet

__all__ = ["SLOTS", "RedisClusterProcs", "key_slot"]

SLOTS = 16384
_START_TIMEOUT_S = 20.0


def _crc16(data: bytes) -> int:
    """CRC16-CCITT (XModem), the cluster's key hash (Redis Cluster specification)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def key_slot(key: str | bytes) -> int:
    """The hash slot of ``key``: of its ``{tag}`` when it has a non-empty one."""
    raw = key.encode() if isinstance(key, str) else key
    start = raw.find(b"{")
    if start >= 0:
        end = raw.find(b"}", start + 1)
        if end > start + 1:
            raw = raw[start + 1 : end]
    return _crc16(raw) % SLOTS


def _command(port: int, *args: str, timeout: float = 2.0) -> str:
    """One command to the server on ``port`` over RESP; its reply, flattened to text."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        parts = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        sock.sendall(b"".join(parts))
        reader = sock.makefile("rb")
        return _read_reply(reader)


def _read_reply(reader: IO[bytes]) -> str:
    line = reader.readline().rstrip(b"\r\n")
    kind, rest = line[:1], line[1:].decode()
    if kind in (b"+", b":"):
        return rest
    if kind == b"-":
        raise EmbeddedServerError("valkey-server", f"command refused: {rest}")
    if kind == b"$":
        n = int(rest)
        return "" if n < 0 else reader.read(n + 2)[:-2].decode()
    if kind == b"*":
        return "\n".join(_read_reply(reader) for _ in range(max(0, int(rest))))
    raise EmbeddedServerError("valkey-server", f"unreadable reply {line!r}")


def _cluster_info(port: int) -> dict[str, str]:
    """``CLUSTER INFO`` of the server on ``port`` as a mapping."""
    text = _command(port, "CLUSTER", "INFO")
    return dict(ln.strip().split(":", 1) for ln in text.splitlines() if ":" in ln)


class RedisClusterProcs(ServerSet):
    """``masters`` × (1 + ``replicas``) valkey-servers on free ports, one cluster."""

    what = "valkey-server"

    def __init__(self, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError(f"need masters >= 1 and replicas >= 0, got {masters}, {replicas}")
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        super().__init__(masters * (1 + replicas), "tao-redis-cluster-")
        self.ports = [free_port() for _ in range(self.size)]
        self.bus_ports = [free_port() for _ in range(self.size)]
        """The cluster bus ports (given: the default, port + 10000, may be taken or > 65535)."""

    @property
    def url(self) -> str:
        """The cluster URL (:mod:`.redisconn`) with every server as a startup node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> RedisClusterProcs:
        """Start every server, form the cluster and wait until it reports ``cluster_state:ok``
        on every server."""
        try:
            for i in range(self.size):
                self._spawn(i)
            for i in range(self.size):
                self._wait(i)
            self._form()
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _command(self, i: int) -> tuple[list[str], Path]:
        folder = self._root / f"r{i}"
        folder.mkdir(exist_ok=True)
        cmd = [find_valkey_server(), "--port", str(self.ports[i]), "--bind", "127.0.0.1"]
        cmd += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        cmd += ["--cluster-port", str(self.bus_ports[i])]
        cmd += ["--cluster-node-timeout", str(self.node_timeout_ms)]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        return cmd, folder

    def _wait(self, i: int) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive(i):
                log = self.log_path(i).read_text("utf-8", "replace")
                tail = " | ".join(log.strip().splitlines()[-3:])
                raise EmbeddedServerError(f"valkey-server r{i}", f"exited: {tail}")
            try:
                if _command(self.ports[i], "PING") == "PONG":
                    return
            except OSError:
                pass
            time.sleep(0.05)  # polling a child process at start-up
        raise EmbeddedServerError(f"valkey-server r{i}", f"did not answer in {_START_TIMEOUT_S} s")

    def node_id(self, i: int) -> str:
        return _command(self.ports[i], "CLUSTER", "MYID")

    def _form(self) -> None:
        first, bus = str(self.ports[0]), str(self.bus_ports[0])
        for port in self.ports[1:]:
            _command(port, "CLUSTER", "MEET", "127.0.0.1", first, bus)
        for m in range(self.masters):
            lo = m * SLOTS // self.masters
            hi = (m + 1) * SLOTS // self.masters - 1
            _command(self.ports[m], "CLUSTER", "ADDSLOTSRANGE", str(lo), str(hi))
        ids = [self.node_id(m) for m in range(self.masters)]
        for r in range(self.masters, self.size):
            master = ids[(r - self.masters) % self.masters]
            knows = functools.partial(self._knows, r, master)
            self._until(f"r{r} knows its master", knows, _START_TIMEOUT_S)
            _command(self.ports[r], "CLUSTER", "REPLICATE", master)

    def _knows(self, i: int, node: str) -> bool:
        return node in _command(self.ports[i], "CLUSTER", "NODES")

    def wait_ok(self) -> None:
        """Until every live server reports ``cluster_state:ok`` and knows every live peer's
        role (after a start, a kill or a restart)."""

        def ok() -> bool:
            live = [i for i in range(self.size) if self.alive(i)]
            return all(_cluster_info(self.ports[i]).get("cluster_state") == "ok" for i in live)

        self._until("cluster_state ok", ok, _START_TIMEOUT_S)

    def settled(self) -> None:
        self.wait_ok()

    def master_of(self, key: str) -> int:
        """Index of the live server that owns ``key``'s slot now."""
        slot = key_slot(key)
        for i in range(self.size):
            if not self.alive(i):
                continue
            for line in _command(self.ports[i], "CLUSTER", "NODES").splitlines():
                fields = line.split()
                if "myself" in fields[2] and "master" in fields[2]:
                    for span in fields[8:]:
                        lo, _, hi = span.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return i
        raise EmbeddedServerError("valkey cluster", f"no live master owns slot {slot}")
