"""The NATS bus: JetStream streams and durable consumers, core NATS for superseded state.

Consumers are JetStream *push* consumers with explicit acks and a deliver group (the durable's
own name), so messages reach the handler as soon as they are stored (no fetch round trip or
batch wait), several replicas of a service can share one durable, and a restarted service
resumes where it stopped. Each message goes through :class:`~shared.infra.receiver.Receiver`:
decode → handler → ack, with the retry and dead-letter rules of :mod:`shared.infra.busapi`.

Retention (JetStream limits policy, file storage): KV events 1 h (superseded by newer events;
telemetry resumes from its durable), tool/session events and placements 24 h, dead letters 7 days.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import api

from shared.contracts import Message, encode, subjects
from shared.contracts.subjects import Stream

from .access import inbox_prefix, redact
from .busapi import (
    MSG_ID_HEADER,
    BatchHandler,
    Decoder,
    Deliver,
    Handler,
    Responder,
    check_namespace,
    dead_letter_for,
    publish_id,
    stream_for_subject,
)
from .errors import BusError, RequestError
from .lease import LeaseTable, bucket_name
from .logging import get_logger
from .natslease import open_lease_table
from .receiver import Receiver
from .settings import Settings

__all__ = ["DEFAULT_MAX_AGE_S", "Bus"]

T = TypeVar("T")
_R = TypeVar("_R")

HOUR: Final = 3600.0
DEFAULT_MAX_AGE_S: Final[dict[str, float]] = {
    subjects.STREAM_KV.name: 1 * HOUR,
    subjects.STREAM_DLQ.name: 7 * 24 * HOUR,
}
"""Per-stream max age; streams not listed keep messages 24 h."""
_DEFAULT_AGE: Final = 24 * HOUR
_EPHEMERAL_IDLE_S: Final = 30.0
_ATTEMPT_S: Final = 2.0  # one TCP + INFO/CONNECT attempt (nats-py's own default is 2 s)
_FLUSH_S: Final = 5  # s, one flush round trip (nats-py takes whole seconds; 10 by default)
_FLUSH_TRIES: Final = 4

PUBLISH_RETRY_S: Final = 20.0
"""How long a stream publish is retried while the server cannot take it (:meth:`Bus.publish`):
a replicated stream whose leader's server died waits 4–9 s for a new one (nats-server
``minElectionTimeoutDefault`` .. ``maxElectionTimeoutDefault``, server/raft.go), so 20 s covers
one election that times out and a second round."""
_TRANSIENT: Final = (
    nats.errors.TimeoutError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)

_log = get_logger("shared.infra.bus")


class Bus:
    """A connected NATS client with TAO's streams, dead-lettering and namespaces."""

    def __init__(
        self,
        nc: Client,
        *,
        namespace: str = "",
        max_deliver: int = 5,
        ack_wait_s: float = 30.0,
        retry_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        replicas: int = 1,
    ) -> None:
        if max_deliver < 1:
            raise ValueError(f"max_deliver must be >= 1, got {max_deliver}")
        self._nc = nc
        self._js = nc.jetstream()
        self._namespace = check_namespace(namespace)
        self.max_deliver = max_deliver
        self.ack_wait_s = ack_wait_s
        self.retry_backoff_s = retry_backoff_s
        self.max_backoff_s = max_backoff_s
        self.replicas = replicas
        """Copies of each stream (``TAO_REPLICAS``; at most the NATS cluster's size)."""
        self._receivers: list[Receiver[Any]] = []
        self._responders: list[_Responder] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        namespace: str = "",
        max_deliver: int = 5,
        ack_wait_s: float = 30.0,
        retry_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        connect_timeout_s: float = 5.0,
        allow_reconnect: bool = True,
        quiet: bool = False,
        replicas: int = 1,
    ) -> Bus:
        """Connect to ``url`` as client ``name``; raise :class:`BusError` if it cannot within
        ``connect_timeout_s``.

        By default a lost connection is re-established forever and client errors are logged as
        warnings; a short-lived client (``tao inspect``) passes ``allow_reconnect=False`` to
        fail fast instead, and ``quiet=True`` to keep client errors off its output.

        The first connection is bounded as a whole: nats-py 2.x's ``connect()`` keeps trying a
        refused port (``nats://127.0.0.1:1``) and never returns, whatever its
        ``connect_timeout`` (which bounds one attempt) and ``allow_reconnect`` say."""
        nc = _Client()
        servers, tls = _tls_servers(url)
        user = urlsplit(servers[0]).username
        try:
            async with asyncio.timeout(connect_timeout_s):
                await nc.connect(
                    servers,
                    name=name,
                    tls=tls,
                    # a role's replies and deliveries come on an inbox only it may read
                    inbox_prefix=inbox_prefix(unquote(user)) if user else "_INBOX",
                    connect_timeout=max(
                        1, round(min(connect_timeout_s, _ATTEMPT_S))
                    ),  # nats-py: int s
                    allow_reconnect=allow_reconnect,
                    max_reconnect_attempts=-1 if allow_reconnect else 0,
                    error_cb=_ignore_error if quiet else _on_error,
                )
        except Exception as exc:  # nats raises several unrelated types for "cannot connect"
            with contextlib.suppress(Exception):
                async with asyncio.timeout(_ATTEMPT_S):  # close() of a half-open TLS one hangs
                    await nc.close()
            why = (
                f"no connection within {connect_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else str(exc) or type(exc).__name__
            )
            raise BusError(f"cannot connect to NATS at {redact(url)}: {why}") from exc
        return cls(
            nc,
            namespace=namespace,
            max_deliver=max_deliver,
            ack_wait_s=ack_wait_s,
            retry_backoff_s=retry_backoff_s,
            max_backoff_s=max_backoff_s,
            replicas=replicas,
        )

    @classmethod
    async def from_settings(cls, settings: Settings, *, name: str) -> Bus:
        """Connect with ``TAO_NATS_URL`` and the bus settings; BusError if the URL is unset."""
        if settings.nats_url is None:
            raise BusError("TAO_NATS_URL is not set (run `tao up`, or set it)")
        return await cls.connect(
            settings.nats_url,
            name=settings.service_name or name,
            namespace=settings.namespace,
            max_deliver=settings.max_deliver,
            ack_wait_s=settings.ack_wait_s,
            retry_backoff_s=settings.retry_backoff_s,
            replicas=settings.replicas,
        )

    # --- names ----------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        """The subject/stream prefix ('' for none)."""
        return self._namespace

    @property
    def max_payload(self) -> int:
        """The server's ``max_payload`` (from its INFO), in bytes."""
        return int(self._nc.max_payload)

    @property
    def nc(self) -> Client:
        """The underlying nats-py client (escape hatch; subjects on it are not namespaced)."""
        return self._nc

    def wire_subject(self, subject: str) -> str:
        """The subject as sent on the wire (namespace prefixed)."""
        return f"{self._namespace}.{subject}" if self._namespace else subject

    def plain_subject(self, wire: str) -> str:
        """Invert :meth:`wire_subject`."""
        if self._namespace and wire.startswith(self._namespace + "."):
            return wire[len(self._namespace) + 1 :]
        return wire

    def stream_name(self, stream: Stream) -> str:
        """The stream's name on the server (namespace prefixed)."""
        return f"{self._namespace}_{stream.name}" if self._namespace else stream.name

    # --- streams --------------------------------------------------------------------------

    async def ensure_streams(self) -> None:
        """Create every stream in ``subjects.ALL_STREAMS``, or update it to this configuration."""
        for stream in subjects.ALL_STREAMS:
            config = api.StreamConfig(
                name=self.stream_name(stream),
                subjects=[self.wire_subject(s) for s in stream.subjects],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                discard=api.DiscardPolicy.OLD,
                max_age=DEFAULT_MAX_AGE_S.get(stream.name, _DEFAULT_AGE),
                num_replicas=self.replicas,
            )
            try:
                await _retrying(functools.partial(self._ensure, config), f"stream {config.name}")
            except (nats.js.errors.Error, nats.errors.TimeoutError) as exc:
                raise BusError(f"cannot create stream {config.name}: {exc}") from exc

    async def _ensure(self, config: api.StreamConfig) -> None:
        try:
            await self._js.stream_info(config.name or "")
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(config)
        else:
            await self._js.update_stream(config)

    async def backlog(self, stream: Stream, durable: str) -> int:
        """How many messages durable consumer ``durable`` of ``stream`` has still to settle:
        those not yet delivered plus those delivered and not acknowledged (a dead process's
        come back after ``ack_wait_s``)."""
        try:
            info = await self._js.consumer_info(self.stream_name(stream), durable)
        except (nats.js.errors.Error, nats.errors.TimeoutError) as exc:
            raise BusError(f"cannot read consumer {durable} on {stream.name}: {exc}") from exc
        return int(info.num_pending or 0) + int(info.num_ack_pending or 0)

    async def delete_streams(self) -> None:
        """Delete this namespace's streams (tests); refused for the shared, empty namespace."""
        if not self._namespace:
            raise BusError("delete_streams() is only allowed on a namespaced bus")
        for stream in subjects.ALL_STREAMS:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await self._js.delete_stream(self.stream_name(stream))
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await self._js.delete_key_value(bucket_name(self._namespace))

    async def lease_table(self, ttl_s: float, *, replicas: int = 1) -> LeaseTable:
        """The leader-election bucket of this namespace (:mod:`shared.infra.natslease`),
        retried like a publish while JetStream answers with transient errors (a replica that
        starts while the cluster is busy or electing waits instead of crashing)."""
        what = f"lease bucket {bucket_name(self._namespace)}"
        try:
            return await _retrying(
                lambda: open_lease_table(self._js, self._namespace, ttl_s, replicas=replicas), what
            )
        except nats.errors.Error as exc:
            raise BusError(f"cannot open {what}: {exc}") from exc

    # --- publishing -----------------------------------------------------------------------

    async def publish(
        self, subject: str, data: bytes, headers: Mapping[str, str] | None = None
    ) -> None:
        """Publish ``data``; JetStream (ack awaited) when a stream captures ``subject``, with
        ``Nats-Msg-Id`` set (:func:`~shared.infra.busapi.publish_id`: a repeat is stored once)."""
        wire = self.wire_subject(subject)
        hdrs = dict(headers) if headers else None
        try:
            if stream_for_subject(subject) is None:
                await self._nc.publish(wire, data, headers=hdrs)
                # nats-py queues the message for its flusher task, which writes it only when
                # this task next waits: yield once so it leaves now, not after the caller's
                # log line and acks (a wake-up or a snapshot on the tool end -> placement path)
                await asyncio.sleep(0)
                return
            hdrs = hdrs or {}
            hdrs.setdefault(MSG_ID_HEADER, publish_id(subject, data, headers))  # stored once
            await self._js_publish(wire, data, hdrs)
        except nats.errors.MaxPayloadError:
            raise BusError(
                f"maximum payload exceeded: {len(data)} > {self.max_payload} bytes"
            ) from None

    async def _js_publish(self, wire: str, data: bytes, hdrs: dict[str, str]) -> None:
        """Publish to a stream, retrying for up to :data:`PUBLISH_RETRY_S` while the server
        cannot store it (a reconnect after its server died, a stream without quorum while a
        cluster elects a new leader): the ``Nats-Msg-Id`` makes a retry of a publish that did
        land a duplicate the stream drops. The last error is raised after that."""
        await _retrying(lambda: self._js.publish(wire, data, headers=hdrs), wire)

    async def publish_msg(self, msg: Message, headers: Mapping[str, str] | None = None) -> None:
        """Encode ``msg`` and publish it on ``subjects.subject_for(msg)``."""
        await self.publish(subjects.subject_for(msg), encode(msg), headers)

    async def dead_letter(
        self,
        service: str,
        subject: str,
        data: bytes,
        headers: Mapping[str, str] | None,
        error: BaseException | str,
        received_at: float,
        error_type: str | None = None,
    ) -> bool:
        """Publish a DeadLetter for ``data`` and log one warning; False if it could not."""
        letter = dead_letter_for(
            service, subject, data, headers, error, received_at=received_at, error_type=error_type
        )
        try:
            await self.publish_msg(letter)
        except Exception as exc:
            _log.error("dead_letter_failed", service=service, subject=subject, error=str(exc))
            return False
        _log.warning(
            "dead_lettered",
            service=service,
            subject=subject,
            reason=letter.reason,
            error_type=letter.error_type,
            size=len(data),
        )
        return True

    # --- receiving ------------------------------------------------------------------------

    async def consume(
        self,
        stream: Stream,
        service: str,
        decode: Decoder[T],
        handler: Handler[T],
        *,
        filter_subject: str | None = None,
        durable: str | None = None,
        ephemeral: bool = False,
        deliver: Deliver = "all",
        batch: int = 256,
    ) -> Receiver[T]:
        """Start a JetStream consumer (see :class:`shared.infra.busapi.MessageBus`).

        ``batch`` sets the prefetch: up to ``16 × batch`` unacknowledged messages in flight.
        """
        name = self._consumer_name(stream, service, durable, ephemeral)
        receiver = Receiver(self, service, decode, handler, name, jetstream=True)
        return await self._start(receiver, stream, filter_subject, ephemeral, deliver, batch)

    async def consume_batch(
        self,
        stream: Stream,
        service: str,
        decode: Decoder[T],
        handler: BatchHandler[T],
        *,
        filter_subject: str | None = None,
        durable: str | None = None,
        ephemeral: bool = False,
        deliver: Deliver = "all",
        max_batch: int = 256,
    ) -> Receiver[T]:
        """Like :meth:`consume`, but the handler gets lists of up to ``max_batch`` messages.

        A batch is what is already buffered when the handler is free (no waiting for it to
        fill). If the handler raises, each message is retried alone (see :mod:`.receiver`).
        """
        name = self._consumer_name(stream, service, durable, ephemeral)
        receiver = Receiver(
            self,
            service,
            decode,
            None,
            name,
            jetstream=True,
            batch_handler=handler,
            max_batch=max_batch,
        )
        return await self._start(receiver, stream, filter_subject, ephemeral, deliver, max_batch)

    def _consumer_name(
        self, stream: Stream, service: str, durable: str | None, ephemeral: bool
    ) -> str:
        subjects.check_name(service, "service")
        if ephemeral:
            return f"{service}-ephemeral"
        return (
            subjects.check_name(durable, "durable")
            if durable
            else subjects.durable_name(service, stream)
        )

    async def _start(
        self,
        receiver: Receiver[T],
        stream: Stream,
        filter_subject: str | None,
        ephemeral: bool,
        deliver: Deliver,
        batch: int,
    ) -> Receiver[T]:
        durable = None if ephemeral else receiver.name
        config = api.ConsumerConfig(
            durable_name=durable,
            deliver_group=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=-1,  # the receiver counts deliveries and dead-letters itself
            max_ack_pending=max(1, batch) * 16,
            deliver_policy=api.DeliverPolicy.NEW if deliver == "new" else api.DeliverPolicy.ALL,
            inactive_threshold=_EPHEMERAL_IDLE_S if ephemeral else None,
        )
        wire_filter = self.wire_subject(filter_subject or stream.subjects[0])
        try:
            receiver.sub = await self._js.subscribe(
                wire_filter,
                queue=durable,
                durable=durable,
                stream=self.stream_name(stream),
                cb=receiver.on_msg,
                manual_ack=True,
                config=config,
            )
        except nats.errors.Error as exc:
            raise BusError(
                f"cannot start consumer {receiver.name} on {stream.name}: {exc}"
            ) from exc
        self._receivers.append(receiver)
        return receiver

    async def subscribe(
        self,
        subject: str,
        service: str,
        decode: Decoder[T],
        handler: Handler[T],
        *,
        queue: str | None = None,
    ) -> Receiver[T]:
        """Subscribe to ``subject`` over core NATS; bad payloads and handler errors dead-letter."""
        subjects.check_name(service, "service")
        receiver = Receiver(self, service, decode, handler, subject, jetstream=False)
        receiver.sub = await self._nc.subscribe(
            self.wire_subject(subject), queue=queue or "", cb=receiver.on_msg
        )
        await self._flushed()
        self._receivers.append(receiver)
        return receiver

    # --- request / reply (core NATS) -------------------------------------------------------

    async def request(self, subject: str, data: bytes, timeout: float) -> bytes:
        """Send a request and return the reply body (see :class:`MessageBus`)."""
        try:
            msg = await self._nc.request(self.wire_subject(subject), data, timeout=timeout)
        except nats.errors.NoRespondersError:
            raise RequestError(subject, "no responders") from None
        except (TimeoutError, nats.errors.TimeoutError):
            raise RequestError(subject, f"no reply within {timeout:g} s") from None
        return bytes(msg.data)

    async def serve(self, subject: str, service: str, respond: Responder) -> _Responder:
        """Answer requests on ``subject`` in queue group ``service`` (see :class:`MessageBus`)."""
        subjects.check_name(service, "service")
        responder = _Responder(self, subject, service, respond)
        responder.sub = await self._nc.subscribe(
            self.wire_subject(subject), queue=service, cb=responder.on_msg
        )
        await self._flushed()
        self._responders.append(responder)
        return responder

    async def _flushed(self) -> None:
        """Return once the server knows the interest just registered. A flush whose PING went
        to a server that then died never sees its PONG; the client reconnects to the next
        server and re-sends every subscription, so the flush is tried again (up to
        ``_FLUSH_TRIES`` × ``_FLUSH_S``) before it is an error: a service subscribing at that
        moment must not die of it (tests/scale/test_failover.py saw a standby planner do so)."""
        for attempt in range(_FLUSH_TRIES):
            try:
                await self._nc.flush(timeout=_FLUSH_S)
                return
            except nats.errors.FlushTimeoutError:
                if attempt == _FLUSH_TRIES - 1:
                    raise
                _log.warning("nats_flush_retry", attempt=attempt + 1)

    def forget(self, receiver: Receiver[Any]) -> None:
        """Drop a stopped receiver from the list :meth:`drain` stops."""
        if receiver in self._receivers:
            self._receivers.remove(receiver)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task that :meth:`drain` waits for."""
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Stop every subscription (in-flight handlers finish), flush publishes, close."""
        for receiver in list(self._receivers):
            await receiver.stop()
        for responder in list(self._responders):
            await responder.stop()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self._nc.is_closed:
            try:
                await self._nc.drain()
            except nats.errors.Error:
                await self._nc.close()


class _Responder:
    """One :meth:`Bus.serve` subscription: runs the responder, replies, never raises."""

    def __init__(self, bus: Bus, subject: str, service: str, respond: Responder) -> None:
        self.bus = bus
        self.subject = subject
        self.service = service
        self.respond = respond
        self.sub: Any = None

    @property
    def name(self) -> str:
        return self.subject

    async def on_msg(self, msg: Any) -> None:
        try:
            reply = await self.respond(bytes(msg.data))
            if msg.reply and reply is not None:
                await msg.respond(reply)
        except Exception as exc:  # the requester times out; the responder goes on
            _log.warning(
                "responder_failed",
                service=self.service,
                subject=self.subject,
                error=f"{type(exc).__name__}: {exc}",
            )

    async def stop(self) -> None:
        if self in self.bus._responders:
            self.bus._responders.remove(self)
        if self.sub is not None:
            sub, self.sub = self.sub, None
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


def _tls_servers(url: str) -> tuple[list[str], ssl.SSLContext | None]:
    """The server URLs of a comma-separated ``url`` without their query, and the TLS context
    they ask for: a ``tls://`` URL, or one whose query names a CA (``?ca=FILE``, as the URL
    files of :mod:`.access` do), verifies the server with that CA (the system's without one)."""
    servers: list[str] = []
    ca: str | None = None
    wants_tls = False
    for part in (p.strip() for p in url.split(",") if p.strip()):
        parts = urlsplit(part)
        found = parse_qs(parts.query).get("ca")
        ca = found[0] if found else ca
        wants_tls = wants_tls or parts.scheme == "tls" or bool(found)
        servers.append(urlunsplit(parts._replace(query="")))
    if not wants_tls:
        return servers, None
    try:
        return servers, ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise BusError(f"cannot read the CA {ca} of the NATS URL: {exc}") from None


class _Client(Client):
    """nats-py's client with its flush made to mean what it says.

    nats-py (2.16, ``Client._send_ping``) writes a flush's PING straight to the socket, while
    the commands queued before it (a SUB, an UNSUB, a PUB) wait in ``_pending`` for its flusher
    task, which writes them on its next turn: usually *after* the PING. The server answers the
    PING before it has read them, so a flush that returned did not mean the server had what was
    sent before it. Two failures came of it (the suite, after the access tests loaded the
    machine): a subscription :meth:`Bus.serve` had flushed was unknown to the server when a
    request came on another connection ("no responders"); and a consumer's drain (UNSUB, then a
    flush, then the subscription dropped) returned before the server had read the UNSUB, so it
    went on delivering to a subscription the client had dropped, and those messages sat
    unacknowledged until ``ack_wait``. Here the queued commands go to the socket first, in the
    same synchronous step as the PING, as the flusher task itself writes them."""

    async def _send_ping(self, future: asyncio.Future[Any] | None = None) -> None:
        if self._pending and self._transport is not None and self.is_connected:
            self._transport.writelines(self._pending[:])
            self._pending = []
            self._pending_data_size = 0
        await super()._send_ping(future)


async def _retrying(op: Callable[[], Awaitable[_R]], what: str) -> _R:
    """Run ``op`` and return its value, again with backoff for up to :data:`PUBLISH_RETRY_S`
    while it fails with a transient error (:data:`_TRANSIENT`: the server reconnecting or the
    cluster electing a stream leader); the last error is raised after that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PUBLISH_RETRY_S
    delay = 0.05
    while True:
        try:
            return await op()
        except _TRANSIENT as exc:
            if loop.time() + delay > deadline:
                raise
            _log.info("bus_retry", what=what, error=type(exc).__name__)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def _on_error(exc: Exception) -> None:
    _log.warning("nats_error", error=f"{type(exc).__name__}: {exc}")


async def _ignore_error(exc: Exception) -> None:
    return None
