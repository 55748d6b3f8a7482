"""One node's vLLM KV-event stream over ZMQ: live SUB, gap replay on a DEALER, ordered output.

The wire (vLLM ``vllm/distributed/kv_events.py``, ``ZmqEventPublisher``; DESIGN §5):

* live: the engine's PUB socket sends ``[topic, seq, payload]``; ``seq`` is an 8-byte
  big-endian counter from 0 per publisher process (``itertools.count()``), ``topic`` the
  configured string (default ``""``, ``vllm/config/kv_events.py``), ``payload``
  ``msgpack(KVEventBatch)``;
* replay: the engine's ROUTER takes ``[b"", start_seq]`` from a DEALER and answers one
  ``[b"", seq, payload]`` per batch of its buffer (the last ``buffer_steps``, 10 000 by default)
  with ``seq >= start_seq``, then ``[b"", -1 as eight 0xff bytes, b""]``. A buffer that no
  longer reaches back to ``start_seq`` simply starts later: the batches before its first one
  are lost for good.

:class:`KvFeed` turns that into one ordered stream of :class:`KvMessage`:

* ``seq == last + 1`` (or the first message): yielded;
* a gap (``seq > last + 1``, the rule of :class:`~shared.core.kvseq.SeqTracker`): the feed asks
  the replay socket for ``last …`` (one batch more than missing: see the restart rule),
  yields the replayed batches after ``last`` (``replayed=True``), then goes on live, dropping
  the live copies of what the replay already gave (the overlap: a batch whose ``seq`` and
  payload equal a replayed one);
* ``seq`` going backwards: the engine restarted. The message is yielded as it is (the consumer's
  own :class:`SeqTracker` declares the restart); when it is not ``0`` the batches before it were
  lost to the subscription's reconnect, and the feed first replays them from ``0``, so the
  consumer sees ``0, 1, …`` of the new incarnation. A restarted engine may also have numbered
  past ``last`` before the subscription reconnected: that reads as a gap, but the replayed
  batch ``last`` then differs from the one yielded (its payload carries the batch time ``ts``),
  and the feed treats it as a restart too;
* no replay socket, a replay that fails or times out, or a buffer that starts too late: the feed
  logs the unrecoverable gap, counts it (:attr:`KvFeed.stats`) and goes on;
* a message whose frames are malformed (count, ``seq`` width, an empty payload) is skipped and
  counted with its reason; payloads are *not* decoded here (the consumer decodes them, and the
  bridge forwards them as they are).

A batch lost on the live socket is noticed, and replayed, when a later one arrives (PUB/SUB
has no other signal): a SUB that has just connected misses what the PUB sent before the
subscription reached it, so a stream's last batch can stay unseen until the engine's next.

Socket errors close and re-open the socket; a replay that failed gets a fresh DEALER so that a
late answer to it can never be read as the answer to the next one. Cancelling the iteration
closes every socket. A restart the feed cannot see: a new publisher whose first batch to arrive is
exactly ``last + 1`` (vLLM's framing carries no incarnation; checking every batch against the
replay buffer would cost a round trip each), or, without a replay socket, one that numbered
past ``last``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

import zmq
import zmq.asyncio

from shared.contracts.errors import FrameError
from shared.contracts.frames import (
    REPLAY_END_SEQ,
    parse_replay_answer,
    parse_seq,
    replay_request,
)
from shared.contracts.subjects import KV_SEQ_HEADER
from shared.contracts.subjects import RECEIVED_AT_HEADER as KV_RECEIVED_AT_HEADER
from shared.core.kvseq import SeqTracker

from .errors import KvReplayError
from .logging import get_logger

__all__ = [
    "KV_RECEIVED_AT_HEADER",
    "KV_SEQ_HEADER",
    "KvFeed",
    "KvFeedStats",
    "KvMessage",
    "KvReplayError",
    "bridge_headers",
]

DEFAULT_REPLAY_TIMEOUT_S: Final = 2.0
_RECONNECT_S: Final = 0.2
DRAIN_MAX: Final = 1024
"""Live messages read without waiting after each awaited read (:meth:`KvFeed._receive`)."""
_REPLAY_IDLE_S: Final = 0.25
"""Once a replay answer has begun, this long without a frame means the rest was dropped."""

_log = get_logger("shared.infra.kvzmq")


@dataclass(frozen=True, slots=True)
class KvMessage:
    """One KV-event batch of ``node`` as received: ``payload`` is ``msgpack(KVEventBatch)``."""

    node: str
    seq: int
    payload: bytes
    received_at: float
    replayed: bool


def bridge_headers(msg: KvMessage) -> dict[str, str]:
    """The NATS headers ``tao kv-bridge`` sends with ``msg.payload``."""
    return {KV_SEQ_HEADER: str(msg.seq), KV_RECEIVED_AT_HEADER: repr(msg.received_at)}


@dataclass(slots=True)
class KvFeedStats:
    """What a feed has seen so far (all counts since it was made)."""

    live: int = 0
    """Live messages yielded."""
    replays: int = 0
    """Replays answered (gaps and restarts recovered, fully or in part)."""
    replayed: int = 0
    """Replayed messages yielded."""
    duplicates: int = 0
    """Live messages dropped because a replay had already yielded them."""
    restarts: int = 0
    """Backward ``seq`` jumps seen (publisher restarts)."""
    unrecovered_gaps: int = 0
    """Gaps that could not be filled (wholly or in part)."""
    lost: int = 0
    """Batches known to be missing for good."""
    bad_frames: int = 0
    """Messages skipped because their frames were malformed."""
    bad_frame_reasons: Counter[str] = field(default_factory=Counter)
    reconnects: int = 0
    """Sockets closed and opened again after an error or a failed replay."""
    truncated_replays: int = 0
    """Replay answers that stopped before their end marker (asked again from there)."""


class KvFeed:
    """The ordered KV-event stream of one node (see the module docstring for the rules).

    ``kv_events`` / ``kv_replay`` are endpoints to connect to (``tcp://host:5557``); ``clock``
    stamps ``received_at``; ``replay_timeout_s`` bounds the wait for each replay frame (and for
    the request to be taken). ``catch_up=True`` replays the publisher's whole buffer when
    :meth:`messages` starts, so a consumer that starts late still learns the recent blocks.
    """

    def __init__(
        self,
        node_id: str,
        kv_events: str,
        kv_replay: str | None,
        *,
        clock: Callable[[], float] = time.time,
        replay_timeout_s: float = DEFAULT_REPLAY_TIMEOUT_S,
        topic: str = "",
        catch_up: bool = False,
        hwm: int = 100_000,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        if not replay_timeout_s > 0:
            raise ValueError(f"replay_timeout_s: must be > 0, got {replay_timeout_s}")
        self.node = node_id
        self.kv_events = kv_events
        self.kv_replay = kv_replay
        self.replay_timeout_s = replay_timeout_s
        self.topic = topic.encode()
        self.catch_up = catch_up
        self.hwm = hwm
        self.stats = KvFeedStats()
        self._clock = clock
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._sub: zmq.asyncio.Socket | None = None
        self._sub_now: zmq.Socket[bytes] | None = None
        """A plain (blocking API) shadow of ``_sub`` for non-blocking reads; never used after
        ``_sub`` is closed (it does not own the socket)."""
        self._ready: deque[tuple[list[bytes], float]] = deque()
        """Live messages already read off the socket, with their receive times, in order."""
        self._dealer: zmq.asyncio.Socket | None = None
        self._replay_lock = asyncio.Lock()
        self._tracker = SeqTracker()
        self._overlap: dict[int, bytes] = {}
        """Replayed batches past the live message that asked for the replay: their live copies
        are still on the way and are dropped when they come."""
        self._overlap_max = -1
        self._last_payload = b""
        """The payload of the last message yielded (to recognise a restarted publisher)."""

    @property
    def connected(self) -> bool:
        """Whether a socket is open (false again once :meth:`messages` has ended)."""
        return self._sub is not None or self._dealer is not None

    @property
    def last_seq(self) -> int | None:
        """The ``seq`` of the last message yielded (``None`` before the first)."""
        return self._tracker.last

    # -- the stream --------------------------------------------------------------------------------

    async def messages(self) -> AsyncIterator[KvMessage]:
        """Every batch of the node, in order, until cancelled (closing the sockets then)."""
        try:
            self._open_sub()
            if self.catch_up and self.kv_replay is not None:
                for msg in await self._replay_or_none(0):
                    self._remember(msg)
                    self._take(msg)
                    self.stats.replayed += 1
                    yield msg
            while True:
                frames, received_at = await self._receive()
                parsed = self._parse_live(frames)
                if parsed is None:
                    continue
                seq, payload = parsed
                for msg in await self._order(seq, payload, received_at):
                    yield msg
        finally:
            self.close()

    async def replay_from(self, start_seq: int) -> list[KvMessage]:
        """Every batch the publisher still buffers from ``start_seq`` on (``replayed=True``).

        Raises :class:`KvReplayError` when there is no replay endpoint or no answer in time.
        """
        if self.kv_replay is None:
            raise KvReplayError(self.node, start_seq, "the node has no replay endpoint")
        result = await self._replay(start_seq)
        if isinstance(result, str):
            raise KvReplayError(self.node, start_seq, result)
        return result

    def close(self) -> None:
        """Close both sockets (idempotent; :meth:`messages` does it when it ends)."""
        self._sub_now = None  # before the socket it shadows goes
        self._ready.clear()
        for sock in (self._sub, self._dealer):
            if sock is not None:
                sock.close(linger=0)
        self._sub = None
        self._dealer = None

    # -- ordering ----------------------------------------------------------------------------------

    async def _order(self, seq: int, payload: bytes, received_at: float) -> list[KvMessage]:
        """What to yield for live message ``seq`` (possibly nothing, possibly a replay first)."""
        if self._overlap:
            copy = self._overlap.pop(seq, None)
            if seq >= self._overlap_max:
                self._overlap.clear()  # live has reached the end of the replay: window over
            if copy is not None and copy == payload:
                self.stats.duplicates += 1
                return []
        tracker = self._tracker
        last = tracker.last
        action = tracker.classify(seq)
        if action == "next":
            return [self._live(seq, payload, received_at)]
        if action == "gap":
            assert last is not None
            if self.kv_replay is None:
                return self._merge(last + 1, [], seq, payload, received_at)
            # Ask from `last`, not `last + 1`: the publisher's copy of the batch we already
            # have tells whether it is still the same publisher (a restarted one that numbered
            # past `last` before we reconnected has a different batch there).
            replayed = await self._replay_or_none(last)
            if not replayed or replayed[0].seq != last:
                return self._merge(last + 1, replayed, seq, payload, received_at)
            if replayed[0].payload == self._last_payload:
                return self._merge(last + 1, replayed[1:], seq, payload, received_at)
        self.stats.restarts += 1
        _log.info("kv_feed_restart", node=self.node, seq=seq, last=last)
        self._overlap.clear()
        tracker.last = None
        if seq == 0:
            return [self._live(seq, payload, received_at)]
        replayed = await self._replay_or_none(0) if self.kv_replay is not None else []
        return self._merge(0, replayed, seq, payload, received_at)

    def _merge(
        self,
        start: int,
        replayed: list[KvMessage],
        seq: int,
        payload: bytes,
        received_at: float,
    ) -> list[KvMessage]:
        """The replayed batches from ``start`` on, then live ``seq`` unless they carried it;
        what is missing before each is counted as lost."""
        tracker = self._tracker
        out: list[KvMessage] = []
        for msg in replayed:
            if msg.seq < start or (tracker.last is not None and msg.seq <= tracker.last):
                continue
            expected = start if tracker.last is None else tracker.last + 1
            if msg.seq > expected:
                self._unrecovered(expected, msg.seq)
            if msg.seq > seq:
                self._remember(msg)
            self._take(msg)
            out.append(msg)
        self.stats.replayed += len(out)
        last = tracker.last
        if last is not None and seq <= last:
            self.stats.duplicates += 1  # the replay carried it (vLLM buffers it as it sends)
            return out
        expected = start if last is None else last + 1
        if seq > expected:
            self._unrecovered(expected, seq)
        out.append(self._live(seq, payload, received_at))
        return out

    def _remember(self, msg: KvMessage) -> None:
        """A replayed batch whose live copy may still come (and is then dropped)."""
        self._overlap[msg.seq] = msg.payload
        self._overlap_max = max(self._overlap_max, msg.seq)

    def _take(self, msg: KvMessage) -> None:
        self._tracker.accept(msg.seq)
        self._last_payload = msg.payload

    def _live(self, seq: int, payload: bytes, received_at: float) -> KvMessage:
        msg = KvMessage(self.node, seq, payload, received_at, False)
        self._take(msg)
        self.stats.live += 1
        return msg

    def _unrecovered(self, first_missing: int, seq: int) -> None:
        """Batches ``first_missing … seq - 1`` are gone for good."""
        self.stats.unrecovered_gaps += 1
        self.stats.lost += seq - first_missing
        _log.warning(
            "kv_gap_unrecovered",
            node=self.node,
            missing_from=first_missing,
            missing_to=seq - 1,
            replay=self.kv_replay is not None,
        )

    # -- frames ------------------------------------------------------------------------------------

    def _bad(self, reason: str) -> None:
        self.stats.bad_frames += 1
        self.stats.bad_frame_reasons[reason] += 1
        _log.warning("kv_frame_skipped", node=self.node, reason=reason)

    def _parse_live(self, frames: Sequence[bytes]) -> tuple[int, bytes] | None:
        if len(frames) != 3:
            self._bad(f"expected 3 frames [topic, seq, payload], got {len(frames)}")
            return None
        try:
            seq = parse_seq(frames[1])
        except FrameError as exc:
            self._bad(exc.reason)
            return None
        if seq < 0:
            self._bad(f"negative seq {seq} on the live socket")
            return None
        if not frames[2]:
            self._bad(f"empty payload at seq {seq}")
            return None
        return seq, frames[2]

    # -- sockets -----------------------------------------------------------------------------------

    def _open_sub(self) -> None:
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, self.hwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.kv_events)
        self._sub = sub
        self._sub_now = zmq.Socket.shadow(sub.underlying)

    async def _receive(self) -> tuple[list[bytes], float]:
        """The next live multipart message and when it was read; socket errors re-open the
        SUB and wait again.

        One awaited read, then up to :data:`DRAIN_MAX` more that are already there, read
        without waiting through the plain shadow socket: the asyncio socket makes a future and
        a poller event per read, which was an eighth of the telemetry service's time on a
        stream of small batches (docs/benchmarks.md, "Telemetry service throughput")."""
        while True:
            if self._ready:
                return self._ready.popleft()
            if self._sub is None:
                self._open_sub()
            assert self._sub is not None
            try:
                frames = await self._sub.recv_multipart()
            except zmq.ZMQError as exc:
                _log.warning("kv_sub_error", node=self.node, error=str(exc))
                self._sub_now = None
                self._sub.close(linger=0)
                self._sub = None
                self.stats.reconnects += 1
                await asyncio.sleep(_RECONNECT_S)
                continue
            now = self._clock()
            self._drain(now)
            return frames, now

    def _drain(self, now: float) -> None:
        """Read what the SUB already holds, without waiting (a socket error ends it: the next
        awaited read meets it again and re-opens the socket)."""
        sync = self._sub_now
        if sync is None:
            return
        ready = self._ready
        for _ in range(DRAIN_MAX):
            try:
                ready.append((sync.recv_multipart(zmq.NOBLOCK), now))
            except zmq.ZMQError:  # zmq.Again: nothing more for now
                return

    async def _replay_or_none(self, start: int) -> list[KvMessage]:
        """:meth:`_replay`, with a failure logged and read as an empty answer."""
        result = await self._replay(start)
        if isinstance(result, str):
            _log.warning("kv_replay_failed", node=self.node, start=start, reason=result)
            return []
        self.stats.replays += 1
        return result

    async def _replay(self, start: int) -> list[KvMessage] | str:
        """The replayed batches from ``start``, or why there are none.

        An answer that stops without its end marker is asked for again from after its last
        batch: the ROUTER drops what does not fit in the pipe to us (vLLM sends its whole
        buffer at once and sets no high-water mark on it), end marker included.
        """
        assert self.kv_replay is not None
        async with self._replay_lock:
            out: list[KvMessage] = []
            while True:
                got, done, why = await self._replay_round(start)
                out.extend(got)
                if done:
                    return out
                if not got:
                    return out if out else why
                self.stats.truncated_replays += 1
                _log.info("kv_replay_truncated", node=self.node, start=start, got=len(got))
                start = got[-1].seq + 1

    async def _replay_round(self, start: int) -> tuple[list[KvMessage], bool, str]:
        """One request: (batches, whether the end marker came, why not)."""
        if self._dealer is None:
            dealer = self._ctx.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.setsockopt(zmq.RCVHWM, self.hwm)  # the pipe holds both ends' marks
            dealer.connect(self.kv_replay or "")
            self._dealer = dealer
        dealer = self._dealer
        out: list[KvMessage] = []
        try:
            async with asyncio.timeout(self.replay_timeout_s):  # not wait_for: in 3.11 it
                await dealer.send_multipart(replay_request(start))  # can lose a cancel
            while True:
                wait = min(self.replay_timeout_s, _REPLAY_IDLE_S) if out else self.replay_timeout_s
                if not await dealer.poll(timeout=int(wait * 1000)):
                    self._drop_dealer()
                    why = "the answer stopped before its end marker" if out else "no answer"
                    return out, False, f"{why} within {wait:g} s"
                frames = await dealer.recv_multipart()
                received_at = self._clock()
                seq = self._parse_replayed(frames)
                if seq is None:
                    continue
                if seq == REPLAY_END_SEQ:
                    return out, True, ""
                out.append(KvMessage(self.node, seq, frames[-1], received_at, True))
        except TimeoutError:
            self._drop_dealer()
            return out, False, f"request not taken within {self.replay_timeout_s:g} s"
        except zmq.ZMQError as exc:
            self._drop_dealer()
            return out, False, f"socket error: {exc}"

    def _parse_replayed(self, frames: Sequence[bytes]) -> int | None:
        """The ``seq`` of one replay answer in either of vLLM's shapes
        (:func:`~shared.contracts.frames.parse_replay_answer`), or ``None`` (counted) if bad."""
        try:
            _, seq, payload = parse_replay_answer(frames)
        except FrameError as exc:
            self._bad(f"replay: {exc.reason}")
            return None
        if seq == REPLAY_END_SEQ:
            return seq
        if seq < 0 or not payload:
            self._bad(f"replay: bad message at seq {seq}")
            return None
        return seq

    def _drop_dealer(self) -> None:
        """Close the DEALER: a late answer must not be read as the next request's."""
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
        self.stats.reconnects += 1
