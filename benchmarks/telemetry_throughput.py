"""Telemetry-service throughput: vLLM KV events through one telemetry process, end to end.

A script, not a test: it prints a markdown table to stdout (progress goes to stderr)::

    PYTHONPATH=. .venv/bin/python -m benchmarks.telemetry_throughput               # 200k events
    PYTHONPATH=. .venv/bin/python -m benchmarks.telemetry_throughput --events 50000 --mixes bulk
    PYTHONPATH=. .venv/bin/python -m benchmarks.telemetry_throughput --taskset 1  # pin the service

``benchmarks/kv_events.py`` times telemetry's decode and index in process; this one adds the
receive path. Per mix and encoding, in a fresh namespace and domain:

1. the workload of ``benchmarks/kv_events.py`` (same generator, same batches of 1-32 events):
   ``--sessions`` sessions sharing a system prompt, ``vllm`` or ``bulk`` mix;
2. one ``SessionResponse`` per session with the block keys of its whole chain is published into
   ``TAO_V1_SESSION`` (what the gateway's responses carry), so that telemetry walks every stored
   block against the sessions' chains as in service;
3. a vLLM-format publisher (``services.simnode.kvpub.KvPublisher``: a ZMQ PUB and a replay
   ROUTER) is bound on loopback, and ``python -m services.telemetry`` starts with a nodes file
   naming one node with those endpoints (its ``/metrics`` URL answers nothing: the scrape fails,
   which leaves the KV index alone);
4. once the service has consumed the responses and answers ``tao inspect`` with a probe batch
   applied, every batch is sent (pre-encoded) as fast as the PUB takes it, and
   ``inspect.node`` is polled every 10 ms until the last ``seq`` is applied; the rate is the
   events over the time from the first send to that poll;
5. the node's resident blocks reported by ``inspect.node`` must equal what the same batches
   give applied in process to a fresh index with the same chains.

Servers: ``TAO_NATS_URL`` / ``TAO_REDIS_URL``, else 127.0.0.1:4222 / 6379 if they answer, else
embedded ones; ``--embedded-nats`` always starts a fresh NATS.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import redis.asyncio as aioredis
from nats.js.errors import NotFoundError

from benchmarks.kv_events import BLOCK, Workload, batches, register_all
from benchmarks.tools_throughput import servers
from services.simnode.kvpub import KvPublisher
from shared.contracts import subjects
from shared.contracts.inspect import NodeInspect, NodeQuery, decode_reply, encode_body
from shared.contracts.kv import (
    KV_ENCODINGS,
    BlockRemoved,
    BlockStored,
    KVEncoding,
    KVEventBatch,
    decode_kv_batch,
    encode_kv_batch,
)
from shared.contracts.session import SessionResponse
from shared.core.blockkeys import chain_keys
from shared.core.kvindex import KvIndex
from shared.infra import Bus
from shared.infra.embedded import free_port
from shared.infra.store import Store

T = TypeVar("T")
NODE = "kv0"
WAIT_S = 120.0


def expected_blocks(work: Workload, payloads: list[bytes]) -> int:
    """The node's resident blocks after ``payloads``, applied in process (the reference)."""
    index = KvIndex()
    register_all(index, work)
    for seq, payload in enumerate(payloads, start=1):  # seq 0 is the probe batch
        index.apply(NODE, seq, decode_kv_batch(payload), 0.0)
    st = index.stats(NODE)
    assert st is not None
    return st.blocks


def nodes_toml(pub: int, replay: int, http: int) -> str:
    return (
        "[[node]]\n"
        f'id = "{NODE}"\n'
        f'url = "http://127.0.0.1:{http}"\n'
        f'kv_events = "tcp://127.0.0.1:{pub}"\n'
        f'kv_replay = "tcp://127.0.0.1:{replay}"\n'
    )


async def until(what: str, check: Callable[[], Awaitable[T]], proc: subprocess.Popen[bytes]) -> T:
    """Poll ``check()`` until it returns something true; its value."""
    deadline = time.monotonic() + WAIT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"telemetry exited with {proc.returncode} while waiting: {what}")
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not after {WAIT_S:.0f} s")
        await asyncio.sleep(0.01)


async def one(args: argparse.Namespace, urls: tuple[str, str], mix: str, enc: KVEncoding) -> str:
    work = Workload(args.seed, args.sessions, args.capacity, bytes_hashes=enc == "mapev")
    events = work.generate(args.events, mix)
    blocks = sum(len(e.block_hashes) for e in events if isinstance(e, (BlockStored, BlockRemoved)))
    payloads = [encode_kv_batch(b, enc) for b in batches(events, args.seed)]
    want = expected_blocks(work, payloads)
    ns, domain = "b" + uuid.uuid4().hex[:12], "b" + uuid.uuid4().hex[:12]
    nats_url, redis_url = urls
    bus = await Bus.connect(nats_url, name="bench-telemetry", namespace=ns)
    r = aioredis.Redis.from_url(redis_url)
    pub, replay, http = free_port(), free_port(), free_port()
    publisher = KvPublisher(  # "*": bound, as vLLM binds such an endpoint (kvpub.binds)
        f"tcp://*:{pub}",
        f"tcp://*:{replay}",
        encoding=enc,
        buffer_steps=len(payloads) + 16,
        hwm=len(payloads) + 16,
    )
    tmp = Path(tempfile.mkdtemp(prefix="tao-tel-"))
    proc: subprocess.Popen[bytes] | None = None
    try:
        await bus.ensure_streams()
        for i, tokens in enumerate(work.tokens):
            await bus.publish_msg(
                SessionResponse(
                    session_id=f"s{i}", request_id="r0", node_id=NODE, gateway_id="gw0",
                    finished_at=time.time(), block_size=BLOCK,
                    block_keys=chain_keys(tokens, BLOCK),
                )
            )  # fmt: skip
        publisher.start()
        (tmp / "nodes.toml").write_text(nodes_toml(pub, replay, http))
        env = dict(os.environ, TAO_NATS_URL=nats_url, TAO_REDIS_URL=redis_url)
        env.update(TAO_NAMESPACE=ns, TAO_DOMAIN=domain, TAO_LOG_LEVEL=args.log_level)
        env.update(TAO_NODES_FILE=str(tmp / "nodes.toml"), TAO_SCRAPE_S="3600")
        cmd = [sys.executable, "-m", "services.telemetry"]
        if args.taskset is not None:
            cmd = ["taskset", "-c", args.taskset, *cmd]
        log = open(args.service_log, "ab") if args.service_log else subprocess.DEVNULL  # noqa: SIM115
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        running = proc

        js = bus.nc.jetstream()
        stream = bus.stream_name(subjects.STREAM_SESSION)
        durable = subjects.durable_name("telemetry", subjects.STREAM_SESSION)

        async def responses_in() -> bool:
            try:
                info = await js.consumer_info(stream, durable)
            except NotFoundError:
                return False
            return not info.num_pending and not info.num_ack_pending

        async def node() -> NodeInspect | None:
            try:
                reply = await bus.request(subjects.inspect("node"), encode_body(NodeQuery(NODE)), 2)
            except Exception:  # not answering yet
                return None
            return decode_reply(reply, NodeInspect)

        await until("the responses consumed", responses_in, running)
        # empty probe batches until three in a row are each applied within 50 ms of their send:
        # the SUB joins some time after the bind, and its catch-up replay shows what came
        # before, so one probe applied proves nothing about the live stream
        probe = encode_kv_batch(KVEventBatch(ts=time.time(), events=[]), enc)
        sent: list[int] = []
        streak = [0]

        async def joined() -> bool:
            sent.append(publisher.publish_payload(probe))
            await asyncio.sleep(0.05)
            v = await node()
            streak[0] = streak[0] + 1 if v is not None and v.seq == sent[-1] else 0
            return streak[0] >= 3  # three in a row, 50 ms apart, each applied in time

        await until("the KV feed joined", joined, running)
        last = sent[-1] + len(payloads)
        t0 = time.perf_counter()
        for k, payload in enumerate(payloads):
            publisher.publish_payload(payload)
            if k % 512 == 511:
                await asyncio.sleep(0)  # let the replay ROUTER answer, if asked
        sent_s = time.perf_counter() - t0

        seen: list[int | None] = [None]

        async def applied() -> NodeInspect | None:
            v = await node()
            if v is not None and v.seq is not None and v.seq >= last:
                return v
            if v is not None and v.seq == seen[0]:  # no progress in 10 ms: a lost tail shows
                publisher.publish_payload(probe)  # only to the next message, so send one
            seen[0] = None if v is None else v.seq
            return None

        done = await until("every batch applied", applied, running)
        elapsed = time.perf_counter() - t0
        assert done is not None
        if done.blocks != want:
            raise RuntimeError(f"{mix} {enc}: {done.blocks} resident blocks, expected {want}")
        print(
            f"  {mix} {enc}: {len(events):,} events in {elapsed:.2f} s (sent in {sent_s:.2f} s)",
            file=sys.stderr,
        )
        return (
            f"| {mix} | {enc} | {len(events):,} | {len(payloads):,} | {blocks:,} "
            f"| {sent_s:.2f} | {elapsed:.2f} | **{len(events) / elapsed:,.0f}** "
            f"| {blocks / elapsed:,.0f} | {done.blocks:,} | {publisher.replays_served} |"
        )
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        await publisher.close()
        await Store(r, domain).clear()
        await r.aclose()
        await bus.delete_streams()
        await bus.drain()


async def run(args: argparse.Namespace) -> int:
    srv = servers(args.embedded_nats)
    try:
        rows = []
        load0 = os.getloadavg()[0]
        for mix in args.mixes.split(","):
            for enc in args.encodings.split(","):
                if enc not in KV_ENCODINGS:
                    known = ", ".join(KV_ENCODINGS)
                    raise SystemExit(f"--encodings: {enc!r} is not one of {known}")
                rows.append(await one(args, (srv.nats, srv.redis), mix, enc))
        load1 = os.getloadavg()[0]
    finally:
        if srv.embedded is not None:
            srv.embedded.stop()
    pinned = f"pinned to CPU {args.taskset}" if args.taskset else "not pinned"
    print(
        f"Telemetry service throughput: {args.events:,} KV events per row, {args.sessions} "
        f"sessions, capacity {args.capacity:,} blocks; service {pinned}; load average (1 min) "
        f"{load0:.2f} before, {load1:.2f} after\n"
    )
    print(
        "| mix | encoding | events | batches | blocks (stored+removed) | sent s | applied s "
        "| events/s | blocks/s | resident blocks | replays |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        print(row)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--sessions", type=int, default=256)
    p.add_argument("--capacity", type=int, default=20_000, help="resident blocks before evicting")
    p.add_argument("--mixes", default="vllm,bulk")
    p.add_argument("--encodings", default="mapev,legacy")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--taskset", default=None, help="CPU list for the service (taskset -c)")
    p.add_argument("--log-level", default="warning", help="TAO_LOG_LEVEL of the service")
    p.add_argument("--embedded-nats", action="store_true", help="a fresh nats-server for the run")
    p.add_argument("--service-log", default=None, help="append the service's stderr here")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
