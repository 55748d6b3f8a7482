"""Reading a request body with bounded time, memory and work (issue 40, part 1).

Every body the gateway reads (model requests, hook posts, the multi-domain router) comes
through :func:`read_raw`, which takes it from the connection in chunks and refuses it as soon as
one bound is passed, before the rest is read:

* **size**: more than ``max_bytes`` bytes after decoding (``TAO_MAX_BODY_BYTES``): 413.
* **compression**: ``Content-Encoding: gzip`` (or ``x-gzip``) and ``deflate`` are inflated
  here, in steps of at most :data:`INFLATE_STEP` bytes, never past what the bounds allow: the
  size cap, and ``max_ratio`` times the compressed bytes received so far
  (``TAO_MAX_COMPRESSION_RATIO``; the first :data:`INFLATE_FLOOR` bytes are free, so a small
  body of repeated text is never refused). 32 KB of gzip that would inflate to 32 MB is
  refused at about ``max_ratio`` × 32 KB. The server's own inflation is turned off
  (``auto_decompress=False``, :func:`server_args`): it inflated the whole body before the
  gateway saw any of it, and inflated the rest of a refused one while lingering. Any other
  coding (``br``, ``zstd``, a list of codings) is 415, naming it (RFC 9110 §15.5.16).
* **time**: the body must keep arriving at ``min_rate`` bytes/s once ``timeout_s`` has passed
  since the handler began reading (``TAO_BODY_MIN_RATE``, ``TAO_BODY_TIMEOUT_S``):
  having read ``n`` bytes, the gateway waits for more until ``timeout_s + n / min_rate`` s;
  then 408. A slow sender is given back its connection's slot, not kept for ever.
* **rate**: each client's decoded bytes within its budget (:mod:`.pacing`;
  ``TAO_BODY_CLIENT_RATE``, 64 MB/s, 0 turns it off): past it the next chunk is read only after
  a wait, so TCP slows a client that sends bodies faster than that; the waits do not count
  against the arrival deadline.

A refused body's connection is closed after the answer (nothing of the rest is read but what
the server discards while it lingers, uncompressed and bounded in time).

:class:`BodyReader` then decodes the body (:func:`.requests.read_json`: the shape check of
:mod:`.jsonscan` first, then strict JSON) and describes it, in a worker thread when it is
:data:`OFF_LOOP_BYTES` or more, so the event loop keeps answering (``/healthz``) meanwhile. The
outcome (the tree, or the refusal) is kept on the request, so a gateway of several domains,
whose router reads the body to choose a domain, does not read it twice. The raw bytes are not
kept: once decoded they are dropped.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import anyio
import anyio.to_thread
import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from services.gateway.pacing import BodyPacer, client_address
from services.gateway.requests import BadRequest, parse_body, read_json
from shared.infra.settings import Settings

__all__ = [
    "BODY_BYTES",
    "BODY_LIMITS",
    "INFLATE_FLOOR",
    "INFLATE_STEP",
    "OFF_LOOP_BYTES",
    "BodyLimits",
    "BodyReader",
    "BodyRefused",
    "Pace",
    "body_limits",
    "read_raw",
    "server_args",
]

T = TypeVar("T")

INFLATE_STEP: Final = 256 * 1024
"""Most bytes one inflate call produces (a step of the loop, a fraction of a millisecond)."""
INFLATE_FLOOR: Final = 1 << 20
"""Decoded bytes a compressed body may reach whatever its ratio."""
OFF_LOOP_BYTES: Final = 64 * 1024
"""Bodies this large or larger are decoded in a worker thread."""
DECODE_THREADS: Final = 2
"""Bodies decoded at once (the gateway's CPU is shared with its event loop)."""
MAX_MEMBERS: Final = 64
"""gzip members one body may have (RFC 1952 §2.2 allows several; a client sends one)."""
BODY_BYTES: Final = web.RequestKey("body_bytes", int)
"""Request key: the decoded body's size in bytes, once read."""
_DECODED: Final = web.RequestKey("body_decoded", object)
_CODINGS: Final = {"gzip": 31, "x-gzip": 31, "deflate": 15}
"""Content codings inflated here, and zlib's ``wbits`` for each (31: gzip, 15: zlib)."""


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The bounds of one body (module docstring)."""

    max_bytes: int
    max_items: int
    max_ratio: float
    timeout_s: float
    min_rate: float

    @classmethod
    def of(cls, settings: Settings) -> BodyLimits:
        return cls(
            max_bytes=settings.max_body_bytes,
            max_items=settings.max_body_items,
            max_ratio=settings.max_compression_ratio,
            timeout_s=settings.body_timeout_s,
            min_rate=settings.body_min_rate,
        )


class BodyRefused(BadRequest):
    """A body refused before it was read whole: answered ``status`` (413, 408, 415 or 400)
    and counted as ``outcome``; the connection is closed after the answer."""

    def __init__(self, status: int, message: str, outcome: str) -> None:
        super().__init__(message)
        self.status = status
        self.outcome = outcome

    def http_error(self) -> web.HTTPException:
        """The refusal as aiohttp's exception of its status, a JSON error body, closing the
        connection (for handlers that answer by raising)."""
        kind = _HTTP_ERRORS.get(self.status, web.HTTPBadRequest)
        text = orjson.dumps({"error": {"type": self.outcome, "message": self.message}}).decode()
        headers = {"Connection": "close"}
        if kind is web.HTTPRequestEntityTooLarge:
            return web.HTTPRequestEntityTooLarge(
                0, 0, text=text, content_type="application/json", headers=headers
            )
        return kind(text=text, content_type="application/json", headers=headers)


_HTTP_ERRORS: Final[dict[int, type[web.HTTPException]]] = {
    400: web.HTTPBadRequest,
    408: web.HTTPRequestTimeout,
    413: web.HTTPRequestEntityTooLarge,
    415: web.HTTPUnsupportedMediaType,
}


BODY_LIMITS: Final = web.AppKey("body_limits", BodyLimits)
"""App key: the bounds of the bodies an app reads (set by the gateway's apps)."""
_DEFAULT_LIMITS: Final = BodyLimits.of(Settings())


def body_limits(request: web.Request) -> BodyLimits:
    """The bounds of ``request``'s app (the defaults where it set none)."""
    return request.config_dict.get(BODY_LIMITS) or _DEFAULT_LIMITS


def server_args(settings: Settings) -> dict[str, Any]:
    """The aiohttp request-handler arguments of a gateway app (``Application(handler_args=)``,
    so every runner gets them, tests' included): no inflation by the server (module
    docstring) and the keep-alive timeout (``TAO_KEEPALIVE_S``)."""
    return {"auto_decompress": False, "keepalive_timeout": settings.keepalive_s}


@dataclass(frozen=True, slots=True)
class Pace:
    """Whose byte budget a body is read within (:mod:`.pacing`)."""

    pacer: BodyPacer
    tenant: str
    address: str


def _too_large(limits: BodyLimits) -> BodyRefused:
    return BodyRefused(
        413,
        f"request body is larger than {limits.max_bytes} bytes (TAO_MAX_BODY_BYTES)",
        "too_large",
    )


class _Inflater:
    """One body's inflation, bounded by the size cap and the ratio (module docstring)."""

    def __init__(self, coding: str, limits: BodyLimits, cap: int) -> None:
        self.coding, self.limits, self.cap = coding, limits, cap
        self.wbits = _CODINGS[coding]
        self.taken = self.made = 0
        self.members = 1
        self.zobj: Any = None

    def _allowed(self) -> int:
        return min(self.cap, max(int(self.limits.max_ratio * self.taken), INFLATE_FLOOR))

    def feed(self, chunk: bytes) -> list[bytes]:
        """The decoded bytes of ``chunk``, ending past the size cap (the caller's to
        refuse); :class:`BodyRefused` past the ratio or for bytes that do not inflate."""
        self.taken += len(chunk)
        out: list[bytes] = []
        data = chunk
        while data or self.zobj is not None:
            if self.zobj is None:
                wbits = self.wbits
                if wbits == 15 and data[0] & 0x0F != 8:  # raw deflate, as some clients send
                    wbits = -15
                self.zobj = zlib.decompressobj(wbits)
            step = min(INFLATE_STEP, self._allowed() - self.made + 1)
            try:
                piece = self.zobj.decompress(data, step)
            except zlib.error as exc:
                raise self._bad(str(exc)) from None
            self.made += len(piece)
            out.append(piece)
            allowed = self._allowed()
            if self.made > allowed:
                if allowed < self.cap:
                    raise self._ratio_refusal()
                return out  # past the size cap: the caller refuses (or keeps the head)
            data = self.zobj.unconsumed_tail
            if self.zobj.eof:
                data = self.zobj.unused_data
                if not data:
                    break
                self.members += 1
                if self.members > MAX_MEMBERS or self.wbits != 31:
                    raise self._bad("data after the end of the compressed stream")
                self.zobj = None
            elif not data and len(piece) < step:
                break  # all input taken, nothing more pending: wait for the next chunk
        return out

    def finish(self) -> None:
        if self.zobj is None or not self.zobj.eof:
            raise self._bad("the compressed stream ends early")

    def _ratio_refusal(self) -> BodyRefused:
        return BodyRefused(
            413,
            f"request body inflates more than {self.limits.max_ratio:g} times its "
            f"{self.coding} size (TAO_MAX_COMPRESSION_RATIO)",
            "too_large",
        )

    def _bad(self, why: str) -> BodyRefused:
        return BodyRefused(400, f"request body is not valid {self.coding}: {why}", "bad_request")


def _coding(request: web.BaseRequest) -> str:
    coding = request.headers.get("Content-Encoding", "").strip().lower()
    if coding in ("", "identity"):
        return ""
    if coding not in _CODINGS:
        raise BodyRefused(
            415,
            f"Content-Encoding {coding[:40]!r} is not supported (gzip, deflate or none)",
            "unsupported_encoding",
        )
    return coding


async def read_raw(
    request: web.BaseRequest,
    limits: BodyLimits,
    *,
    cap: int | None = None,
    keep: bool = False,
    pace: Pace | None = None,
) -> bytes:
    """The decoded body, within ``limits`` (module docstring); ``cap`` replaces
    ``limits.max_bytes``. ``keep``: a body past ``cap`` is not refused, its first ``cap + 1``
    bytes are returned instead (a hook post, forwarded as oversized). ``pace``: the client's
    byte budget (:mod:`.pacing`), waited out between chunks; the waits extend the deadline."""
    cap = limits.max_bytes if cap is None else cap
    coding = _coding(request)
    declared = request.content_length
    if declared is not None and declared > cap and not keep:
        raise _too_large(limits)
    inflater = _Inflater(coding, limits, cap) if coding else None
    loop = asyncio.get_running_loop()
    start = loop.time()
    stream = request.content
    wire = made = 0
    paced = 0.0
    chunks: list[bytes] = []
    while True:
        try:
            async with asyncio.timeout_at(
                start + paced + limits.timeout_s + wire / limits.min_rate
            ):
                chunk = await stream.readany()
        except TimeoutError:
            raise BodyRefused(
                408,
                f"request body arrived slower than {limits.min_rate:g} bytes/s after "
                f"{limits.timeout_s:g} s (TAO_BODY_MIN_RATE, TAO_BODY_TIMEOUT_S)",
                "body_timeout",
            ) from None
        except RequestPayloadError as exc:
            raise BodyRefused(400, f"request body cannot be read: {exc}", "bad_request") from None
        if not chunk:
            break
        wire += len(chunk)
        before = made
        try:
            pieces = [chunk] if inflater is None else inflater.feed(chunk)
        except BodyRefused:
            if pace is not None and inflater is not None:  # the inflating was done: paid for
                await _wait_for_budget(pace, inflater.made - before)  # before the answer
            raise
        for piece in pieces:
            made += len(piece)
            chunks.append(piece)
        if pace is not None:
            paced += await _wait_for_budget(pace, made - before)
        if made > cap:
            if keep:
                return b"".join(chunks)[: cap + 1]
            raise _too_large(limits)
    if inflater is not None and wire:
        inflater.finish()
    return b"".join(chunks)


async def _wait_for_budget(pace: Pace, n: int) -> float:
    """Charge ``n`` decoded bytes to the client's budget and wait out any excess (the server
    stops reading the connection meanwhile, so TCP slows the sender); the seconds waited."""
    wait = pace.pacer.charge(pace.tenant, pace.address, n, asyncio.get_running_loop().time())
    if wait > 0:
        await asyncio.sleep(wait)
    return wait


def _decode(
    raw: bytes, max_items: int, describe: Callable[[dict[str, Any]], T]
) -> tuple[dict[str, Any], T]:
    body = parse_body(read_json(raw, max_items=max_items))
    return body, describe(body)


def _decode_taken(
    box: list[bytes], max_items: int, describe: Callable[[dict[str, Any]], T]
) -> tuple[dict[str, Any], T]:
    """:func:`_decode` of the bytes taken out of ``box``: a worker thread keeps its call's
    arguments until after it has handed the result back (anyio's worker drops them only
    then), so the bytes must not be among them, or a held request's body stays in memory
    twice for as long as that thread is not scheduled."""
    return _decode(box.pop(), max_items, describe)


class BodyReader:
    """Reads, checks and decodes model request bodies (module docstring); each client's
    within its byte budget when ``pacer`` is given (:mod:`.pacing`)."""

    def __init__(self, limits: BodyLimits, pacer: BodyPacer | None = None) -> None:
        self.limits = limits
        self.pacer = pacer
        self.threads = anyio.CapacityLimiter(DECODE_THREADS)

    async def read(
        self,
        request: web.BaseRequest,
        describe: Callable[[dict[str, Any]], T],
        tenant: str | None = None,
    ) -> tuple[dict[str, Any], T]:
        """The body as a checked object and what ``describe`` says of it (run with the
        decoding, off the event loop for a large body); :class:`.requests.BadRequest` (or
        :class:`BodyRefused`) when it cannot be served. Read once per request; paced as
        ``tenant``'s from the request's address (unpaced when ``tenant`` is None)."""
        done = request.get(_DECODED)
        if done is None:
            pace = None
            if self.pacer is not None and tenant is not None:
                pace = Pace(self.pacer, tenant, client_address(request.remote))
            try:
                raw = await read_raw(request, self.limits, pace=pace)
                request[BODY_BYTES] = len(raw)
                if len(raw) < OFF_LOOP_BYTES:
                    done = _decode(raw, self.limits.max_items, describe)
                else:
                    box, raw = [raw], b""
                    done = await anyio.to_thread.run_sync(
                        _decode_taken, box, self.limits.max_items, describe, limiter=self.threads
                    )
            except BadRequest as exc:
                done = exc.with_traceback(None)  # its frames held the raw bytes
            finally:
                raw = b""  # the decoded tree is what a held request keeps, not its bytes
            request[_DECODED] = done
        if isinstance(done, BadRequest):
            raise done
        return done  # type: ignore[return-value]

    async def run(self, request: web.BaseRequest, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)``: in a worker thread when ``request``'s body was large enough to be
        decoded in one (work over the whole conversation, as its hash chain), else here."""
        if request.get(BODY_BYTES, 0) < OFF_LOOP_BYTES:
            return work(*args)
        return await anyio.to_thread.run_sync(work, *args, limiter=self.threads)
