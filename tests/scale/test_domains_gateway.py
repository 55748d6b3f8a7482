"""One gateway process in front of two scheduling domains, all real processes.

Two domains on the 3-server NATS cluster (streams with 3 replicas) and the Redis Cluster (3
masters), each a namespace of its own with its telemetry, tools, valuation and planner, and a
sim node of its own (one nodes file names each node's domain). One
gateway serves both (``TAO_GATEWAY_DOMAINS``). Agent sessions through it complete; each lives
in exactly one domain's store; the new sessions spread over both domains by the valuations'
load reports; the gateway's metrics say where it routed them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from shared.cli.stack import StackConfig, simnode_launch
from shared.infra.bus import Bus
from shared.infra.embedded import free_port, stop_processes
from shared.infra.natscluster import NatsCluster
from shared.infra.nodesfile import render_nodes_file
from shared.infra.rediscluster import RedisClusterProcs
from shared.infra.redisconn import open_redis
from shared.infra.store import Store
from tests.scale.harness import Procs, until

SERVICES = ("telemetry", "tools", "valuation", "planner")
SESSIONS = 8
TURNS = 2


@pytest.fixture
def fleet(
    cluster: NatsCluster, redis_cluster: RedisClusterProcs, tmp_path: Path
) -> Iterator[tuple[str, list[str]]]:
    """The gateway's URL and the two domains' names, every process running."""
    nats_url, redis_url = cluster.url, redis_cluster.url
    tag = uuid.uuid4().hex[:6]
    names = [f"da{tag}", f"db{tag}"]
    sims: list[subprocess.Popen[bytes]] = []
    specs = []
    config = StackConfig(time_scale=20.0, kv_tokens=20_000)
    logs = [open(tmp_path / f"sim{i}.log", "ab") for i in range(2)]  # noqa: SIM115
    for i, name in enumerate(names):
        cmd, spec = simnode_launch(i, config, (free_port(), free_port(), free_port()))
        sims.append(subprocess.Popen(cmd, stdout=logs[i], stderr=subprocess.STDOUT))
        specs.append(dataclasses.replace(spec, domain=name))
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(render_nodes_file(specs))
    base = {
        **os.environ,
        "TAO_NATS_URL": nats_url,
        "TAO_REDIS_URL": redis_url,
        "TAO_NODES_FILE": str(nodes),
        "TAO_REPLICAS": "3",
        "TAO_TICK_S": "0.2",
        "TAO_SCRAPE_S": "0.5",
        "TAO_LOG_FORMAT": "json",
        "TAO_HOLD_TIMEOUT_S": "60",
    }
    procs = [Procs({**base, "TAO_DOMAIN": n, "TAO_NAMESPACE": n}, tmp_path) for n in names]
    port = free_port()
    gateway = Procs(
        {
            **base,
            "TAO_GATEWAY_DOMAINS": ",".join(names),
            "TAO_GATEWAY_PORT": str(port),
            "TAO_NAMESPACE": names[0],  # the runner's own connection: no streams elsewhere
        },
        tmp_path,
    )
    try:
        for name, p in zip(names, procs, strict=True):
            for service in SERVICES:
                p.start(service, f"{service}-{name}")
        gateway.start("gateway", "gateway")
        yield f"http://127.0.0.1:{port}", names
    finally:
        gateway.stop()
        for p in procs:
            p.stop()
        stop_processes(sims)
        for log in logs:
            log.close()
        asyncio.run(_drop_streams(nats_url, names))


async def _drop_streams(nats_url: str, namespaces: list[str]) -> None:
    for ns in namespaces:
        bus = await Bus.connect(nats_url, name="test-cleanup", namespace=ns)
        await bus.delete_streams()
        await bus.drain()


async def _turns(client: aiohttp.ClientSession, url: str, sid: str) -> int:
    done = 0
    for turn in range(TURNS):
        body = {
            "model": "tao-sim",
            "messages": [{"role": "user", "content": f"turn {turn} of {sid}"}],
            "max_tokens": 8,
        }
        async with client.post(
            f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid}
        ) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()
            done += 1
    return done


async def test_one_gateway_spreads_sessions_over_two_domains(
    fleet: tuple[str, list[str]], redis_cluster: RedisClusterProcs
) -> None:
    url, names = fleet
    redis = open_redis(redis_cluster.url)
    stores = [Store(redis, n) for n in names]
    try:

        async def ready() -> bool:
            nodes = [await s.nodes() for s in stores]
            async with aiohttp.ClientSession() as c, c.get(f"{url}/healthz") as resp:
                up = resp.status == 200
            return up and all(any(r.healthy for r in n) for n in nodes)

        await until("both domains' nodes are healthy and the gateway answers", ready, 60)
        await asyncio.sleep(0.5)  # a tick of load reports from both valuations
        ids = [f"s{i}-{uuid.uuid4().hex[:4]}" for i in range(SESSIONS)]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as client:
            done = await asyncio.gather(*(_turns(client, url, sid) for sid in ids))
            async with client.get(f"{url}/metrics") as resp:
                metrics = await resp.text()
        assert done == [TURNS] * SESSIONS
        where = [{s.id for s in await store.sessions()} for store in stores]
        assert where[0] | where[1] == set(ids) and not where[0] & where[1]
        assert where[0] and where[1], f"all sessions in one domain: {where}"
        for name, sessions in zip(names, where, strict=True):
            routed = f'tao_gateway_routed_sessions_total{{domain="{name}",reason="least_loaded"}}'
            assert f"{routed} {len(sessions)}" in metrics
    finally:
        for store in stores:
            await store.clear()
        await redis.aclose()
