"""``tao inspect node|prefix`` end to end: answered by telemetry's responder over real NATS, and,
with no telemetry, read from a real ZMQ publisher in vLLM's wire format (replay from seq 0)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from services.simnode.kvpub import KvPublisher
from services.telemetry.inspect import Inspector
from shared.cli.main import main
from shared.contracts.kv import BlockRemoved, BlockStored, KVEventBatch
from shared.core.kvindex import KvIndex
from shared.infra import Bus
from shared.infra.embedded import free_port
from shared.infra.fake_store import FakeStore
from shared.infra.nodesfile import render_nodes_file
from shared.infra.settings import NodeSpec
from shared.infra.store_types import NodeUpdate
from tests.inspect_contract import NODE_KEYS

BS = 16
TOKENS = list(range(500, 500 + 3 * BS))


def batches() -> list[KVEventBatch]:
    store = BlockStored([11, 12, 13], None, TOKENS, BS, None, "GPU", None)
    return [
        KVEventBatch(ts=1.0, events=[store]),
        KVEventBatch(ts=2.0, events=[BlockRemoved([13], "GPU")]),
    ]


async def tao(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``tao ARGV`` in a thread (it runs its own event loop); (code, stdout, stderr)."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
async def publisher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[KvPublisher]:
    """A vLLM-format publisher (PUB + replay ROUTER) with two batches buffered, named in a nodes
    file as node ``n1``; no NATS is known (no TAO_NATS_URL, no run file)."""
    pub_port, replay_port = free_port(), free_port()
    pub = KvPublisher(f"tcp://*:{pub_port}", f"tcp://*:{replay_port}", encoding="legacy")
    pub.start()
    for b in batches():
        pub.publish_batch(b)
    spec = NodeSpec(
        "n1",
        "http://127.0.0.1:1",
        kv_events=f"tcp://127.0.0.1:{pub_port}",
        kv_replay=f"tcp://127.0.0.1:{replay_port}",
        capacity_tokens=8192,
    )
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(render_nodes_file([spec]))
    monkeypatch.setenv("TAO_NODES_FILE", str(nodes))
    monkeypatch.delenv("TAO_NATS_URL", raising=False)
    monkeypatch.delenv("TAO_NODES", raising=False)
    monkeypatch.setenv("TAO_RUN_FILE", str(tmp_path / "no-run.json"))
    try:
        yield pub
    finally:
        await pub.close()


class TestReadingTheNodeDirectly:
    async def test_inspect_node_replays_the_stream(
        self, publisher: KvPublisher, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No telemetry: the node's replay buffer from seq 0 gives blocks, seq and capacity."""
        code, out, err = await tao(capsys, "inspect", "node", "n1", "--json", "--live", "0.2")
        assert (code, err) == (0, "")
        reply = orjson.loads(out)
        assert list(reply) == NODE_KEYS
        assert reply == {
            "node": "n1",
            "blocks": 2,
            "resident_tokens": 2 * BS,
            "seq": 1,
            "incarnation": 0,
            "healthy": True,
            "capacity_tokens": 8192,
            "host_blocks": 0,
            "host_resident_tokens": 0,
        }

    async def test_inspect_prefix_walks_the_replayed_blocks(
        self, publisher: KvPublisher, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        tokens = tmp_path / "tokens.json"
        tokens.write_bytes(orjson.dumps(TOKENS))
        argv = ("inspect", "prefix", "--node", "n1", "--tokens", str(tokens), "--json")
        code, out, err = await tao(capsys, *argv, "--live", "0.2")
        assert (code, err) == (0, "")
        assert orjson.loads(out) == {"resident_prefix_tokens": 2 * BS, "host_prefix_tokens": 0}

    async def test_unknown_node_exits_2_with_one_line(
        self, publisher: KvPublisher, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, err = await tao(capsys, "inspect", "node", "zz", "--json")
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "unknown node 'zz'" in err


class TestAskingTelemetry:
    async def test_cli_gets_the_responders_answer_over_nats(
        self,
        nats_url: str,
        namespace: str,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
    ) -> None:
        """With NATS known, the CLI prints telemetry's reply (the node is not even reachable)."""
        monkeypatch.setenv("TAO_NATS_URL", nats_url)
        monkeypatch.setenv("TAO_NAMESPACE", namespace)
        monkeypatch.delenv("TAO_NODES_FILE", raising=False)
        monkeypatch.setenv("TAO_RUN_FILE", str(tmp_path / "no-run.json"))
        index = KvIndex()
        for seq, b in enumerate(batches()):
            index.apply("n9", seq, b, 1.0)
        store = FakeStore()
        await store.put_node_status("n9", NodeUpdate(healthy=True, capacity_tokens=1024))
        bus = await Bus.connect(nats_url, name="telemetry-test", namespace=namespace)
        try:
            await Inspector(index, store, []).start(bus, "telemetry")
            code, out, err = await tao(capsys, "inspect", "node", "n9", "--json")
            assert (code, err) == (0, "")
            assert orjson.loads(out) == {
                "node": "n9",
                "blocks": 2,
                "resident_tokens": 2 * BS,
                "seq": 1,
                "incarnation": 0,
                "healthy": True,
                "capacity_tokens": 1024,
                "host_blocks": 0,
                "host_resident_tokens": 0,
            }
            code, out, err = await tao(capsys, "inspect", "node", "n9")
            assert code == 0 and "resident tokens  32" in out and "telemetry" in out
            code, out, err = await tao(capsys, "inspect", "node", "nope", "--json")
            assert code == 2 and "unknown node 'nope'" in err
        finally:
            await bus.drain()
