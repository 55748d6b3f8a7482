"""The sim node's KV-event publisher: the engine model's cache events in vLLM's ZMQ wire format.

What vLLM does, and this module repeats (vLLM ``vllm/distributed/kv_events.py``,
``ZmqEventPublisher``; defaults from ``vllm/config/kv_events.py``, ``KVEventsConfig``):

* a PUB socket on ``endpoint`` (default ``tcp://*:5557``), *bound* when the endpoint contains
  ``*`` or ``::`` or is ``ipc://``/``inproc://``, else *connected*; high-water mark ``hwm``
  (100 000);
* one message per published batch: ``[topic, seq, payload]``, ``topic`` the configured string
  encoded (default ``""``), ``seq`` an 8-byte big-endian counter from 0 for each publisher
  process, ``payload`` ``msgpack(KVEventBatch)`` with ``data_parallel_rank`` filled in (0);
* the last ``buffer_steps`` (10 000) ``(seq, payload)`` kept for replay; a ROUTER on
  ``replay_endpoint`` (always bound) takes ``[identity, b"", start_seq]`` and answers
  ``[identity, b"", topic, seq, payload]`` for every buffered batch with ``seq >= start_seq``,
  then ``[identity, b"", b"", -1 as eight 0xff bytes, b""]``, as vLLM 0.32's
  ``_service_replay`` does (older releases sent no topic frame; a subscriber reads both,
  :func:`shared.contracts.frames.parse_replay_answer`); a request of another shape is ignored.

Events (vLLM ``vllm/v1/core/block_pool.py``): ``BlockStored`` for the blocks of one request
that became full together (``parent_block_hash`` ``None`` for a chain's first block, their
``token_ids``, ``block_size``, ``medium="GPU"``), ``BlockRemoved([hash])`` per evicted block,
and ``AllBlocksCleared`` after a successful ``reset_prefix_cache``. The engine model reports one
``BlockStored`` per block; consecutive ones that chain (same medium) are merged here into one
event, as vLLM sends them. Newer vLLM also sets ``group_idx`` and ``kv_cache_spec_kind``; the
``mapev`` and ``map`` encodings carry ``group_idx=0`` and ``"full_attention"``, the ``legacy``
one leaves them out (they did not exist then). A node with a host KV tier (``--host-kv``) also
sends the engine's host events as vLLM 0.32's OffloadingConnector does: ``medium="CPU"``, a
store as one placeholder per block (the block's hash, no tokens, no parent, ``block_size`` 0,
its ``group_idx`` but no kind; ``oevents:337-357@0.32``, docs/kv-tier.md §4).

Block hashes: vLLM names a block by a hash of (parent hash, token ids, extra keys) seeded with
a per-process ``NONE_HASH`` (sha256 in newer releases) and publishes either those 32 bytes or,
with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, their low 64 bits read big-endian
(``maybe_convert_block_hash`` in ``vllm/v1/core/kv_cache_utils.py``). Here a block's hash is
``sha256(seed ‖ engine hash)``: the engine model's hash already chains parent and tokens
(:func:`shared.core.engine.chain_hash`), and ``seed`` is 16 random bytes per process, so the
published hashes chain like vLLM's, differ between runs, and are not TAO's own block keys: a
consumer must resolve them through ``token_ids``. ``hash_kind="int"`` publishes the low 64 bits.

Test hook: :meth:`KvPublisher.drop_next` skips the next ``n`` live sends while still numbering
and buffering them, so a subscriber sees a gap that the replay socket can fill.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, Literal

import zmq
import zmq.asyncio
from aiohttp import web

from services.simnode.handlers import error_response
from services.simnode.runner import EngineRunner
from shared.contracts.frames import encode_seq
from shared.contracts.kv import (
    KV_ENCODINGS,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    KVEncoding,
    KVEvent,
    KVEventBatch,
    encode_kv_batch,
)
from shared.infra.logging import get_logger

__all__ = [
    "DEFAULT_BUFFER_STEPS",
    "DEFAULT_HWM",
    "KV_HASH_KINDS",
    "KvHashKind",
    "KvPublisher",
    "KvRoutes",
    "binds",
]

KvHashKind = Literal["int", "bytes"]
KV_HASH_KINDS: Final[tuple[KvHashKind, ...]] = ("int", "bytes")
DEFAULT_BUFFER_STEPS: Final = 10_000
DEFAULT_HWM: Final = 100_000
_END_SEQ: Final = encode_seq(-1)
_MASK64: Final = (1 << 64) - 1
_FULL_ATTENTION: Final = "full_attention"

_log = get_logger("services.simnode.kvpub")


def binds(endpoint: str) -> bool:
    """Whether vLLM binds (rather than connects) its PUB socket on ``endpoint``."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith("ipc://")
        or endpoint.startswith("inproc://")
    )


class KvPublisher:
    """Publishes engine KV events as vLLM does: PUB + replay ROUTER + a replay buffer."""

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        encoding: KVEncoding = "mapev",
        hash_kind: KvHashKind = "int",
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        hwm: int = DEFAULT_HWM,
        topic: str = "",
        seed: bytes | None = None,
        data_parallel_rank: int = 0,
        clock: Callable[[], float] = time.time,
        bind: bool = False,
    ) -> None:
        if encoding not in KV_ENCODINGS:
            known = ", ".join(KV_ENCODINGS)
            raise ValueError(f"kv encoding: must be one of {known}, got {encoding!r}")
        if hash_kind not in KV_HASH_KINDS:
            known = ", ".join(KV_HASH_KINDS)
            raise ValueError(f"kv hash: must be one of {known}, got {hash_kind!r}")
        if buffer_steps < 1:
            raise ValueError(f"kv buffer steps: must be >= 1, got {buffer_steps}")
        self.endpoint = endpoint
        self.bind = bind
        """Bind the PUB on ``endpoint`` even where vLLM would connect (:func:`binds`): a
        loopback address, as ``tao up`` gives its simnodes."""
        self.replay_endpoint = replay_endpoint
        self.encoding: KVEncoding = encoding
        self.hash_kind: KvHashKind = hash_kind
        self.hwm = hwm
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._seed = os.urandom(16) if seed is None else seed
        self._clock = clock
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._drop = 0
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self.sent = 0
        """Batches sent live."""
        self.dropped = 0
        """Batches numbered and buffered but not sent (:meth:`drop_next`)."""
        self.send_errors = 0
        self.replays_served = 0

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the sockets (``zmq.ZMQError`` if an endpoint cannot be bound) and, with a replay
        endpoint, start answering replays on the running event loop."""
        if self._pub is not None:
            return
        # A context of its own: terminating it on close frees the ports at once (closing a
        # socket alone releases its port later, in ZMQ's I/O thread), so a publisher started
        # again on the same ports, as a restarted engine is, can bind them.
        self._ctx = ctx = zmq.Context()
        pub = ctx.socket(zmq.PUB)
        try:
            pub.set_hwm(self.hwm)
            pub.setsockopt(zmq.LINGER, 0)
            if self.bind or binds(self.endpoint):
                pub.bind(self.endpoint)
            else:
                pub.connect(self.endpoint)
            if self.replay_endpoint is not None:
                router = zmq.asyncio.Context(ctx).socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                try:
                    router.bind(self.replay_endpoint)
                except zmq.ZMQError:
                    router.close(linger=0)
                    raise
                self._router = router
                self._replay_task = asyncio.get_running_loop().create_task(
                    self._serve_replay(), name="simnode-kv-replay"
                )
        except BaseException:
            if self._router is not None:
                self._router.close(linger=0)
                self._router = None
            pub.close(linger=0)
            ctx.term()
            self._ctx = None
            raise
        self._pub = pub

    async def close(self) -> None:
        """Stop answering replays and close both sockets."""
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        if self._router is not None:
            self._router.close(linger=0)
            self._router = None
        if self._pub is not None:
            self._pub.close(linger=0)
            self._pub = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- publishing --------------------------------------------------------------------------------

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next batch gets."""
        return self._next_seq

    def drop_next(self, n: int) -> None:
        """Do not send the next ``n`` batches live (they are still numbered and buffered)."""
        if n < 0:
            raise ValueError(f"n: must be >= 0, got {n}")
        self._drop = n

    def wire_hash(self, engine_hash: BlockHash) -> BlockHash:
        """The published hash of the block the engine model names ``engine_hash``."""
        raw = engine_hash if isinstance(engine_hash, bytes) else engine_hash.to_bytes(8, "big")
        digest = hashlib.sha256(self._seed + raw).digest()
        return digest if self.hash_kind == "bytes" else int.from_bytes(digest, "big") & _MASK64

    def to_wire(self, events: Sequence[KVEvent]) -> list[KVEvent]:
        """Engine events as vLLM would send them: published hashes, chained stores merged."""
        modern = self.encoding != "legacy"
        group = 0 if modern else None
        kind = _FULL_ATTENTION if modern else None
        out: list[KVEvent] = []
        tail: BlockHash | None = None  # engine hash of the last block of out[-1] (a store)
        run: tuple[list[BlockHash], list[int], BlockStored] | None = None

        def close_run() -> None:
            nonlocal run
            if run is not None:
                hashes, tokens, first = run
                parent = first.parent_block_hash
                placeholder = first.block_size == 0  # a host store, as vLLM announces it
                out.append(
                    BlockStored(
                        block_hashes=hashes,
                        parent_block_hash=None if parent is None else self.wire_hash(parent),
                        token_ids=tokens,
                        block_size=first.block_size,
                        lora_id=first.lora_id,
                        medium=first.medium or "GPU",
                        lora_name=first.lora_name,
                        group_idx=group,
                        kv_cache_spec_kind=None if placeholder else kind,
                    )
                )
                run = None

        for e in events:
            if isinstance(e, BlockStored):
                wire = [self.wire_hash(h) for h in e.block_hashes]
                if (
                    run is not None
                    and tail is not None
                    and e.parent_block_hash == tail
                    and e.block_size == run[2].block_size > 0
                    and e.medium == run[2].medium
                    and e.lora_id == run[2].lora_id
                ):
                    run[0].extend(wire)
                    run[1].extend(e.token_ids)
                else:
                    close_run()
                    run = (wire, list(e.token_ids), e)
                tail = e.block_hashes[-1] if e.block_hashes else None
                continue
            close_run()
            tail = None
            if isinstance(e, BlockRemoved):
                out.append(
                    BlockRemoved(
                        block_hashes=[self.wire_hash(h) for h in e.block_hashes],
                        medium=e.medium or "GPU",
                        group_idx=group,
                    )
                )
            else:
                out.append(AllBlocksCleared())
        close_run()
        return out

    def publish(self, events: Sequence[KVEvent]) -> int | None:
        """Publish engine ``events`` as one batch; its ``seq``, or ``None`` when there are none."""
        if not events:
            return None
        rank = self.data_parallel_rank
        batch = KVEventBatch(ts=self._clock(), events=self.to_wire(events), data_parallel_rank=rank)
        return self.publish_batch(batch)

    def publish_batch(self, batch: KVEventBatch) -> int:
        """Publish ``batch`` as it is (hashes untouched); its ``seq``. Never raises for a send
        failure: the batch stays in the replay buffer and the error is counted and logged."""
        return self.publish_payload(encode_kv_batch(batch, self.encoding))

    def publish_payload(self, payload: bytes) -> int:
        """:meth:`publish_batch` of a batch already encoded in :attr:`encoding` (a benchmark
        sends pre-encoded batches, so that the encoding does not pace the stream)."""
        seq = self._next_seq
        self._next_seq += 1
        if self._drop > 0:
            self._drop -= 1
            self.dropped += 1
        elif self._pub is not None:
            try:
                self._pub.send_multipart((self.topic, encode_seq(seq), payload), flags=zmq.NOBLOCK)
                self.sent += 1
            except zmq.ZMQError as exc:
                self.send_errors += 1
                _log.warning("kv_publish_failed", seq=seq, error=str(exc))
        self._buffer.append((seq, payload))
        return seq

    def pump(self, runner: EngineRunner) -> int | None:
        """Publish whatever the runner's engine reported since the last call (one batch)."""
        return self.publish(runner.engine.drain_kv_events())

    # -- replay ------------------------------------------------------------------------------------

    async def _serve_replay(self) -> None:
        router = self._router
        assert router is not None
        while True:
            try:
                frames = await router.recv_multipart()
            except zmq.ZMQError as exc:
                _log.warning("kv_replay_receive_failed", error=str(exc))
                await asyncio.sleep(0.1)
                continue
            if len(frames) != 3:
                _log.warning("kv_replay_bad_request", frames=len(frames))
                continue
            client, _, start_frame = frames
            start = int.from_bytes(start_frame, "big")
            self.replays_served += 1
            try:
                for seq, payload in list(self._buffer):
                    if seq >= start:
                        await router.send_multipart(
                            (client, b"", self.topic, encode_seq(seq), payload)
                        )
                await router.send_multipart((client, b"", b"", _END_SEQ, b""))
            except zmq.ZMQError as exc:
                _log.warning("kv_replay_send_failed", start=start, error=str(exc))


class KvRoutes:
    """HTTP routes around the KV cache: ``POST /reset_prefix_cache`` and the drop switch.

    ``POST /reset_prefix_cache`` is vLLM's (``vllm/entrypoints/serve/cache/api_router.py``, a
    dev-mode route there): it asks the engine to drop its prefix cache and answers 200 with an
    empty body whether or not the engine did, as vLLM does. The engine refuses while a request
    holds blocks (vLLM's ``BlockPool.reset_prefix_cache`` without ``reset_running_requests``,
    which is not modelled). The ``Tao-Reset`` header says ``cleared`` or ``refused``. A
    successful reset publishes ``AllBlocksCleared`` at once.

    ``POST /tao/debug/kv-drop?n=N`` (only with KV events on) skips the next ``N`` live batches.
    """

    def __init__(self, runner: EngineRunner, publisher: KvPublisher | None) -> None:
        self.runner = runner
        self.publisher = publisher

    def register(self, app: web.Application) -> None:
        app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        if self.publisher is not None:
            app.router.add_post("/tao/debug/kv-drop", self.kv_drop)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        cleared = self.runner.engine.reset_prefix_cache(self.runner.vnow())
        if self.publisher is not None:
            self.publisher.pump(self.runner)
        _log.info("prefix_cache_reset", cleared=cleared)
        return web.Response(status=200, headers={"Tao-Reset": "cleared" if cleared else "refused"})

    async def kv_drop(self, request: web.Request) -> web.Response:
        assert self.publisher is not None
        raw = request.query.get("n", "1")
        try:
            n = int(raw)
            if n < 0:
                raise ValueError
        except ValueError:
            message = f"n: must be an integer >= 0, got {raw!r}"
            return error_response(400, message, "BadRequestError", "n")
        self.publisher.drop_next(n)
        return web.json_response({"dropping": n, "next_seq": self.publisher.next_seq})
