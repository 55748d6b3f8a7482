"""``Bus.connect`` options for short-lived clients (``tao inspect``), on real NATS."""

from __future__ import annotations

from shared.contracts import subjects
from shared.infra import Bus


async def upper(body: bytes) -> bytes:
    return body.upper()


class TestConnectOptions:
    async def test_default_client_reconnects_and_logs(self, nats_url: str, namespace: str) -> None:
        """A service's bus re-establishes a lost connection forever."""
        bus = await Bus.connect(nats_url, name="svc", namespace=namespace)
        try:
            opts = bus.nc.options
            assert opts["allow_reconnect"] is True and opts["max_reconnect_attempts"] == -1
        finally:
            await bus.drain()

    async def test_one_shot_client_does_not_reconnect_and_is_quiet(
        self, nats_url: str, namespace: str
    ) -> None:
        """allow_reconnect=False fails fast; quiet=True swaps the logging error callback; the
        bus still works in its namespace."""
        server = await Bus.connect(nats_url, name="svc", namespace=namespace)
        bus = await Bus.connect(
            nats_url, name="once", namespace=namespace, allow_reconnect=False, quiet=True
        )
        try:
            opts = bus.nc.options
            assert opts["allow_reconnect"] is False and opts["max_reconnect_attempts"] == 0
            assert bus.nc._error_cb is not server.nc._error_cb
            await server.serve(subjects.inspect("echo"), "svc", upper)
            assert await bus.request(subjects.inspect("echo"), b"hi", 5.0) == b"HI"
        finally:
            await bus.drain()
            await server.drain()
