"""One model request through the gateway: register, hold until admitted, forward, report.

Every path answers the client and reports exactly once (DESIGN §4, gateway), and is counted
once by its outcome, with one ``request_done`` log line (:class:`Outcome`, in
:meth:`Relay.handle`):

* registered: :class:`SessionRequest` (JetStream) before anything else;
* never forwarded (hold timeout → 503 + ``Retry-After``; client gone while held; session ended
  by ``DELETE`` while held → 409 ``session_ended``): :class:`SessionCancel` with
  ``wait_timeout`` / ``client_closed`` / ``session_ended`` (the latter published by
  :meth:`Relay.end_session`, before the session's :class:`SessionEnd`);
* forwarded, or admitted to a node the gateway cannot reach (502): :class:`SessionResponse`
  with usage, finish reason, tool calls, timing and ``error`` when it failed, and the block
  keys of the node's token ids when it returned them (:mod:`.tokenids`);
* one-turn sessions (no id given, and no conversation to continue: ``/v1/completions``, or
  continuation off): :class:`SessionEnd` after that; a new unnamed session whose first request
  fails or is never forwarded ends the same way.

A request that names no session and carries a conversation joins the live session whose last
request and answer it extends, else starts a new one that stays open for its continuation
(:mod:`.continuation`): the relay claims the session's tip on arrival, and on the complete
answer records the new tip (the request's chain followed by the answer's items), or gives the
tip back when the request failed. The Responses ids it serves are remembered for
``previous_response_id`` (:class:`.response_ids.ResponseIds`); with named tenants a
``previous_response_id`` this tenant was not served is answered 404 and never forwarded.

A session not known as admitted from the placements is looked up in the state store on arrival
and watched there while held (:mod:`.store_check`), so a missed placement never strands it.

Reports of one session are published in order (each publish task, the ``SessionRequest``
included, waits for the session's previous one): the tools service infers "the tool ended"
from the next request, so that request must not overtake the response before it. The client
waits for its request's registration before anything else, so a bus that is down gives an
immediate 503. For a
stream, the report is started before the final ``[DONE]`` reaches the client, so a client that
answers at once cannot overtake it. Reports run as tasks, so a handler cancelled by a client
disconnect still publishes them. They are asyncio tasks awaited through ``asyncio.shield``,
not an anyio task group as in the other services: a report outlives the aiohttp handler that
started it, and a group would have to live as long as the app, entered and left in aiohttp's
start-up and clean-up, which need not run in one task (an anyio scope must).

The endpoints differ only in what :class:`.apis.Api` says (request facts, session id, error
format, token ids, response readers); the life of a request is this one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, NewType

import aiohttp
from aiohttp import web
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from structlog.typing import FilteringBoundLogger

from services.gateway.answers import Transcribing, transcribing_reader
from services.gateway.apis import Api, openai_error
from services.gateway.auth import Auth, Caller
from services.gateway.bodies import BODY_BYTES, BodyLimits, BodyReader, BodyRefused
from services.gateway.calibration import PromptCalibration
from services.gateway.continuation import Continuations, Conversation, answer_items, conversation
from services.gateway.hold_budget import HoldBudget
from services.gateway.holds import HoldEnded, Holds, HoldTimeout
from services.gateway.hook_limit import retry_after
from services.gateway.metrics import GatewayMetrics
from services.gateway.nodes import NodeDirectory
from services.gateway.pacing import pacer_of
from services.gateway.placements import PlacementMap
from services.gateway.proxy import (
    CLIENT_CLOSED,
    Forwarded,
    ForwardError,
    UpstreamError,
    describe,
    forward_json,
    forward_stream,
    upstream_headers,
)
from services.gateway.requests import (
    SESSION_HEADER,
    BadRequest,
    IdSource,
    RequestInfo,
    check_headers,
    harness_of,
    parent_session,
)
from services.gateway.response_ids import ResponseIds, not_found
from services.gateway.store_check import STORE_RECHECK_S, StoreCheck
from services.gateway.tokenids import TokenIdNodes, block_keys_of, rejects_field
from shared.contracts import (
    ContractError,
    Message,
    SessionCancel,
    SessionEnd,
    SessionRequest,
    SessionResponse,
)
from shared.contracts.session import (
    END_CLIENT_CLOSED,
    END_COMPLETED,
    END_ERROR,
    END_WAIT_TIMEOUT,
)
from shared.contracts.subjects import subject_for
from shared.infra import tracing
from shared.infra.busapi import MessageBus
from shared.infra.errors import ConfigFileError
from shared.infra.settings import Settings
from shared.infra.signing import PlacementVerifier
from shared.infra.store_types import StateStore

__all__ = ["CANCEL_SESSION_ENDED", "Relay", "openai_error"]


def _maybe(f: Callable[[str], str], value: str | None) -> str | None:
    return None if value is None else f(value)


_tracer = tracing.tracer("services.gateway")
GENERATED_PREFIX: Final = "gw-"
CANCEL_SESSION_ENDED: Final = "session_ended"
"""SessionCancel reason of a held request whose session was ended (no END_* constant fits)."""
INTERNAL_ERROR: Final = "internal_error"
"""Outcome of a request that ended in an unexpected exception (aiohttp answers it 500)."""

Answered = NewType("Answered", web.StreamResponse)
"""A response whose outcome is recorded (:meth:`Outcome.answer`, or a forward's)."""


@dataclass(slots=True)
class Outcome:
    """How one model request ended, filled in on its way. :meth:`Relay.handle` counts it (the
    ``outcome`` of ``tao_gateway_requests_total``) and logs its ``request_done`` line once,
    in one ``finally``, whichever way the request ended: answered, cancelled or failed."""

    label: str | None = None
    """The outcome of a request answered without a forward, set where that is decided."""
    session_id: str | None = None
    request_id: str | None = None
    forwarded: Forwarded | None = None
    """The forward, once the request is sent to a node: its error (or none, ``ok``) is the
    outcome."""
    continuation_settled: bool = False
    """The session's continuation tip was recorded or given back (:meth:`Relay._settle`)."""

    def answer(self, label: str, response: web.StreamResponse) -> Answered:
        """``response`` ends the request with outcome ``label``."""
        self.label = label
        return Answered(response)

    def final(self) -> str:
        """The outcome counted: the forward's, else the label, else an unexpected error."""
        if self.forwarded is not None:
            return "ok" if self.forwarded.error is None else self.forwarded.error.kind
        return self.label or INTERNAL_ERROR


@dataclass(frozen=True, slots=True)
class Turn:
    """One model request on its way through the relay (hold → forward → send): what the
    client sent, who sent it, and the session it belongs to."""

    request: web.Request
    api: Api
    body: dict[str, Any]
    info: RequestInfo
    caller: Caller
    session_id: str
    request_id: str
    one_turn: bool
    """The session was named by the gateway (no id from the client): it ends with the turn."""
    outcome: Outcome
    tenant: str | None = None
    client_id: str = ""
    """The session's id as the client knows it (without the tenant's prefix)."""
    chain_end: Conversation | None = None
    """The request's conversation chains (:mod:`.continuation`), when the session's
    continuation is tracked."""
    fresh: bool = False
    """A new unnamed session kept open for its continuation: it ends if this first turn fails."""
    transcribe: bool = False
    """Read the answer's words (continuation, or a Responses id to remember)."""


def _conversation(tenant: str | None, api: Api, body: dict[str, Any]) -> Conversation | None:
    """The request's conversation chains (work over every item: off the loop for a large body,
    :meth:`.bodies.BodyReader.run`)."""
    return conversation(tenant, api.items(body) or [])


class Relay:
    """The gateway's state and the life of one model request (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        bus: MessageBus,
        nodes: NodeDirectory,
        *,
        log: FilteringBoundLogger,
        clock: Callable[[], float],
        new_id: Callable[[], str] | None = None,
        store: StateStore | None = None,
        store_recheck_s: float = STORE_RECHECK_S,
        token_ids: TokenIdNodes | None = None,
        key: str | None = None,
    ) -> None:
        """``key``: the gateway's own key (:mod:`.gatewaykey`), ``None`` without one."""
        self.settings = settings
        self.bus = bus
        self.nodes = nodes
        self.log = log
        self.clock = clock
        self.new_id = new_id or (lambda: uuid.uuid4().hex)
        self.placements = PlacementMap()
        self.holds = Holds()
        self.bodies = BodyReader(BodyLimits.of(settings), pacer_of(settings))
        self.hold_budget = HoldBudget(settings.max_held, settings.max_held_bytes)
        self.metrics = GatewayMetrics(
            self.holds.held, self.placements.admitted_count, self._paced_s
        )
        self.stored = StoreCheck(
            store, self.placements, nodes, self.holds, self.metrics, log, every_s=store_recheck_s
        )
        self.client: aiohttp.ClientSession | None = None
        self.token_ids = token_ids or TokenIdNodes()
        self.calibration = PromptCalibration()
        self.continuations = (
            Continuations(
                ttl_s=settings.idle_timeout_s, max_sessions=settings.continuation_sessions
            )
            if settings.continuation_sessions
            else None
        )
        self.response_ids = ResponseIds(ttl_s=settings.idle_timeout_s)
        self.auth = Auth.from_file(
            settings.tenants_file,
            settings.node_api_key,
            clock,
            self._invalid("tenants_file"),
            key=key,
        )
        self.verifier = (
            None
            if settings.placement_keys is None
            else PlacementVerifier(
                settings.placement_keys, clock=clock, on_error=self._invalid("placement_keys")
            )
        )
        self._held_by: dict[str, int] = {}  # tenant -> its requests held now
        self._ended_holds: set[str] = set()  # request ids whose cancel end_session reported
        self._reports: dict[str, asyncio.Task[bool]] = {}
        self._tasks: set[asyncio.Task[bool]] = set()

    def _invalid(self, what: str) -> Callable[[ConfigFileError], None]:
        """Logs a reload of ``what`` that failed (the last good contents are kept)."""

        def log(exc: ConfigFileError) -> None:
            self.log.error(f"{what}_invalid", path=exc.path, reason=exc.reason, kept="last good")

        return log

    # --- reporting --------------------------------------------------------------------------

    async def _publish(self, msgs: tuple[Message, ...], after: asyncio.Task[bool] | None) -> bool:
        if after is not None:
            await asyncio.wait([after])
        ok = True
        for msg in msgs:
            try:
                # the task runs in the turn's context: its span's traceparent goes along
                await self.bus.publish_msg(msg, headers=tracing.inject() or None)
            except Exception as exc:  # the client gets its answer; log, never crash
                self.log.error("publish_failed", message=type(msg).__name__, error=str(exc))
                ok = False
        return ok

    def report(self, session_id: str, *msgs: Message) -> asyncio.Task[bool]:
        """Publish ``msgs`` in order after the session's earlier reports, as a task whose
        result says whether every publish succeeded."""
        task = self._spawn(self._publish(msgs, self._reports.get(session_id)))
        self._reports[session_id] = task

        def _drop(t: asyncio.Task[bool]) -> None:
            if self._reports.get(session_id) is t:
                del self._reports[session_id]

        task.add_done_callback(_drop)
        return task

    def _spawn(self, coro: Coroutine[Any, Any, bool]) -> asyncio.Task[bool]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def flush(self) -> None:
        """Wait until every report started so far is published."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def _reports_of(self, session_id: str) -> None:
        pending = self._reports.get(session_id)
        if pending is not None:
            await asyncio.shield(pending)

    # --- session end -------------------------------------------------------------------------

    async def end_session(self, session_id: str, reason: str = END_COMPLETED) -> int:
        """Answer the session's held requests at once (409), publish a :class:`SessionCancel`
        for each, then :class:`SessionEnd` (after the session's reports), and forget the
        session. Returns how many held requests were released."""
        ended = self.holds.end(session_id)
        self._ended_holds.update(ended)
        now = self.clock()
        msgs: list[Message] = [
            self._cancel_msg(session_id, request_id, CANCEL_SESSION_ENDED, now)
            for request_id in ended
        ]
        msgs.append(self._end_msg(session_id, reason, now))
        await asyncio.shield(self.report(session_id, *msgs))
        return len(ended)

    def _cancel_msg(self, session_id: str, request_id: str, reason: str, at: float) -> Message:
        return SessionCancel(
            session_id=session_id,
            request_id=request_id,
            cancelled_at=at,
            reason=reason,
            gateway_id=self.settings.gateway_id,
        )

    def _end_msg(self, session_id: str, reason: str, at: float) -> Message:
        """The session's :class:`SessionEnd`; its placement and continuation are forgotten
        with it."""
        self.placements.forget(session_id)
        if self.continuations is not None:
            self.continuations.forget(session_id)
        return SessionEnd(
            session_id=session_id, ended_at=at, reason=reason, gateway_id=self.settings.gateway_id
        )

    # --- one request -------------------------------------------------------------------------

    async def handle(self, request: web.Request, api: Api) -> web.StreamResponse:
        """Serve one ``POST`` of ``api.path``, in a ``tao.turn`` span (shared.infra.tracing);
        count its outcome and log its ``request_done`` line, once (:class:`Outcome`)."""
        out = Outcome()
        with _tracer.start_as_current_span(
            "tao.turn", kind=SpanKind.SERVER, attributes={"tao.endpoint": api.name}
        ) as span:
            try:
                response = await self._handle(request, api, out)
            except asyncio.CancelledError:  # the client left before it was answered
                out.label = out.label or CLIENT_CLOSED.kind
                raise
            finally:
                self.hold_budget.give_back(request)
                self._done(api.name, out)
            span.set_attribute("http.response.status_code", response.status)
            return response

    def unauthorized(self, api: Api, endpoint: str) -> web.Response:
        """401 for a ``DELETE`` or ``GET /v1/models`` without a known API key (:mod:`.auth`),
        counted under ``endpoint`` (a model request's 401 is counted by :meth:`handle`)."""
        self.metrics.requests.inc(endpoint=endpoint, outcome="unauthorized")
        return self._needs_key(api)

    def _paced_s(self) -> float:
        pacer = self.bodies.pacer
        return 0.0 if pacer is None else pacer.paced_s

    @staticmethod
    def _needs_key(api: Api) -> web.Response:
        return api.error(
            401,
            "a valid API key is required (Authorization: Bearer <key>, or x-api-key)",
            api.auth_error_type,
        )

    async def _handle(self, request: web.Request, api: Api, out: Outcome) -> Answered:
        caller = self.auth.client(request.headers)
        if caller is None:
            return out.answer("unauthorized", self._needs_key(api))
        try:
            body, info = await self.bodies.read(request, api.describe, caller.name)
            check_headers(request.headers)
            named_harness = harness_of(request.headers)
        except BodyRefused as exc:  # the rest of the body is not read: the connection closes
            refused = api.error(exc.status, exc.message, "invalid_request_error")
            refused.force_close()
            return out.answer(exc.outcome, refused)
        except BadRequest as exc:
            return out.answer("bad_request", api.error(400, exc.message, "invalid_request_error"))
        served = self.nodes.models()
        if served and info.model and info.model not in served:
            # As vLLM answers an unknown model: 404 at once, never a hold that cannot end.
            return out.answer(
                "model_not_found",
                api.error(404, f"The model `{info.model}` does not exist.", "NotFoundError"),
            )
        tenant = caller.tenant.name if caller.tenant is not None else None
        try:
            named_id, source = api.identity(
                request.headers,
                body,
                lambda: GENERATED_PREFIX + self.new_id(),
                lambda rid: self.response_ids.session(tenant, rid, self.clock()),
            )
        except BadRequest as exc:  # an id too long or with a control character
            return out.answer("bad_request", api.error(400, exc.message, "invalid_request_error"))
        unknown = self._foreign_response(api, caller, tenant, body)
        if unknown is not None:
            return out.answer("response_not_found", unknown)
        session_id = caller.session(named_id)
        chain_end: Conversation | None = None
        fresh = False
        if source == "generated" and self.continuations is not None:
            chain_end = await self.bodies.run(request, _conversation, tenant, api, body)
            if chain_end is not None:
                found = self.continuations.claim(
                    tenant, chain_end.exact, self.clock(), chain_end.loose
                )
                if found is not None:
                    session_id, source = found, "continued"
                    named_id = caller.client_id(found)
                else:
                    fresh = True
                    self.continuations.begin(tenant, session_id, self.clock())
        try:
            return await self._session_turn(
                request,
                api,
                out,
                caller,
                body,
                info,
                named_harness,
                named_id,
                source,
                session_id,
                chain_end,
                fresh,
            )
        finally:
            if chain_end is not None and not out.continuation_settled:
                self._unsettled(session_id, fresh)

    def _foreign_response(
        self, api: Api, caller: Caller, tenant: str | None, body: dict[str, Any]
    ) -> web.Response | None:
        """404 for a Responses request's ``previous_response_id`` that this caller's tenant
        was not served (with named tenants; :func:`.response_ids.not_found`), else ``None``:
        the id goes on."""
        previous = body.get("previous_response_id")
        if api.name != "responses" or not caller.name:
            return None
        if not isinstance(previous, str) or not previous.strip():
            return None
        if self.response_ids.session(tenant, previous.strip(), self.clock()) is not None:
            return None
        return not_found(previous.strip())

    def _unsettled(self, session_id: str, fresh: bool) -> None:
        """A request whose continuation was tracked ended without a complete answer: a new
        session is forgotten (its end is reported where one-turn sessions' are), a continued
        one gets its tip back (a retry joins it)."""
        assert self.continuations is not None
        if fresh:
            self.continuations.forget(session_id)
        else:
            self.continuations.release(session_id, self.clock())

    async def _session_turn(
        self,
        request: web.Request,
        api: Api,
        out: Outcome,
        caller: Caller,
        body: dict[str, Any],
        info: RequestInfo,
        named_harness: str | None,
        named_id: str,
        source: IdSource,
        session_id: str,
        chain_end: Conversation | None,
        fresh: bool,
    ) -> Answered:
        """The rest of :meth:`_handle`, once the session is known."""
        if self._tenant_full(caller, session_id):
            return out.answer(
                "tenant_limit",
                api.error(
                    429,
                    "too many requests of this tenant are waiting for admission; retry later",
                    "rate_limit_error",
                    headers={"Retry-After": retry_after(self.settings.retry_after_s)},
                ),
            )
        if self.placements.node_of(session_id) is None and not self.hold_budget.take(
            request, request.get(BODY_BYTES, 0)
        ):
            return out.answer("gateway_full", self._unavailable(api, self.hold_budget.refusal()))
        harness = api.harness(named_harness, source, request.headers)
        request_id = "req-" + self.new_id()
        one_turn = source == "generated" and not fresh
        ends_if_failed = one_turn or fresh
        out.session_id, out.request_id = session_id, request_id
        span = trace.get_current_span()
        span.set_attribute("tao.session_id", session_id)
        span.set_attribute("tao.request_id", request_id)
        registered = SessionRequest(
            session_id=session_id,
            request_id=request_id,
            model=info.model,
            arrived_at=self.clock(),
            gateway_id=self.settings.gateway_id,
            prompt_tokens_estimate=self.calibration.scale(
                info.model,
                info.prompt_tokens_estimate,
                caller.tenant.name if caller.tenant else None,
            ),
            messages_count=info.messages_count,
            stream=info.stream,
            max_tokens=info.max_tokens,
            harness=harness,
            parent_session_id=_maybe(caller.session, parent_session(request.headers, named_id)),
        )
        try:
            subject_for(registered)  # the session id must fit a subject token
        except ContractError as exc:
            return out.answer(
                "bad_request", api.error(400, f"bad session id: {exc}", "invalid_request_error")
            )
        registering = self.report(session_id, registered)
        try:
            registered_ok = await asyncio.shield(registering)
        except asyncio.CancelledError:  # the client left; the cancel follows the request
            self._cancel(session_id, request_id, END_CLIENT_CLOSED, ends_if_failed)
            raise
        if not registered_ok:
            return out.answer(
                "bus_error", self._unavailable(api, "the scheduler cannot be reached; retry later")
            )
        node = self.placements.node_of(session_id)  # hot path: no store read
        if node is None:
            try:
                node = await self.stored.lookup(session_id, "arrival")
            except asyncio.CancelledError:  # the client left during the store read
                self._cancel(session_id, request_id, END_CLIENT_CLOSED, ends_if_failed)
                raise
        if node is not None:
            self.hold_budget.give_back(request)
        turn = Turn(
            request,
            api,
            body,
            info,
            caller,
            session_id,
            request_id,
            one_turn,
            out,
            tenant=caller.tenant.name if caller.tenant is not None else None,
            client_id=named_id,
            chain_end=chain_end,
            fresh=fresh,
            transcribe=chain_end is not None or api.name == "responses",
        )
        if node is None:
            with _tracer.start_as_current_span(
                "tao.hold", attributes={"tao.session_id": session_id}
            ) as held:
                node_or_reply = await self._held(turn)
                if not isinstance(node_or_reply, str):
                    held.set_attribute("tao.outcome", f"answered {node_or_reply.status}")
                    return node_or_reply
                node = node_or_reply
                held.set_attribute("tao.node", node)
                held.set_attribute("tao.outcome", "placed")
        with _tracer.start_as_current_span(
            "tao.forward",
            kind=SpanKind.CLIENT,
            attributes={"tao.session_id": session_id, "tao.node": node},
        ):
            return await self._forward(turn, node)

    def _unavailable(self, api: Api, message: str) -> web.Response:
        retry = retry_after(self.settings.retry_after_s)
        return api.error(503, message, "service_unavailable", headers={"Retry-After": retry})

    def _cancel(self, session_id: str, request_id: str, reason: str, one_turn: bool) -> None:
        msgs = [self._cancel_msg(session_id, request_id, reason, self.clock())]
        if one_turn:
            msgs.append(self._end_msg(session_id, reason, self.clock()))
        self.report(session_id, *msgs)

    def _tenant_full(self, caller: Caller, session_id: str) -> bool:
        """The caller's tenant holds ``max_held`` requests already and this session is not
        known admitted here (it would be held too)."""
        tenant = caller.tenant
        if tenant is None or tenant.max_held is None:
            return False
        held = self._held_by.get(caller.name, 0)
        return held >= tenant.max_held and self.placements.node_of(session_id) is None

    async def _held(self, turn: Turn) -> str | Answered:
        """:meth:`_hold`, counted against the caller's tenant while it waits."""
        if turn.caller.tenant is None:
            return await self._hold(turn)
        name = turn.caller.tenant.name
        self._held_by[name] = self._held_by.get(name, 0) + 1
        try:
            return await self._hold(turn)
        finally:
            self._held_by[name] -= 1
            if not self._held_by[name]:
                del self._held_by[name]

    async def _hold(self, turn: Turn) -> str | Answered:
        """Wait for the session's placement: its node, or the answer when none came."""
        api, out, one_turn = turn.api, turn.outcome, turn.one_turn or turn.fresh
        session_id, request_id = turn.session_id, turn.request_id
        started = self.clock()
        timeout = self.settings.hold_timeout_s
        waiting = self.holds.wait(session_id, timeout, request_id)
        self.stored.watch(session_id)
        try:
            node = await waiting
        except HoldEnded:
            self.metrics.hold_seconds.observe(self.clock() - started)
            answered = out.answer(
                CANCEL_SESSION_ENDED,
                api.error(
                    409,
                    f"session {session_id!r} was ended while the request was held",
                    CANCEL_SESSION_ENDED,
                ),
            )
            await self._reports_of(session_id)  # end_session reported the cancel
            return answered
        except HoldTimeout:
            self.metrics.hold_seconds.observe(self.clock() - started)
            self.metrics.unavailable.inc()
            answered = out.answer(
                END_WAIT_TIMEOUT,
                self._unavailable(
                    api,
                    f"session {session_id!r} was not admitted within {timeout:g} s; retry later",
                ),
            )
            self._cancel(session_id, request_id, END_WAIT_TIMEOUT, one_turn)
            await self._reports_of(session_id)
            return answered
        except asyncio.CancelledError:
            self.metrics.hold_seconds.observe(self.clock() - started)
            if request_id not in self._ended_holds:  # else end_session reported its cancel
                self._cancel(session_id, request_id, END_CLIENT_CLOSED, one_turn)
            raise
        finally:
            self._ended_holds.discard(request_id)
            self.hold_budget.give_back(turn.request)  # its place in the gateway-wide bound
        self.metrics.hold_seconds.observe(self.clock() - started)
        return node

    async def _forward(self, turn: Turn, node: str) -> Answered:
        """Send the turn to ``node`` and report its response once; how it went (``done``) is
        the request's outcome."""
        api, info = turn.api, turn.info
        session_id, request_id, one_turn = turn.session_id, turn.request_id, turn.one_turn
        shown = (
            turn.client_id if turn.client_id.isascii() and turn.client_id.isprintable() else None
        )
        done = Forwarded(node_id=node, session_id=shown or None)
        turn.outcome.forwarded = done
        reported: list[asyncio.Task[bool]] = []

        def report_now() -> None:
            if not reported:
                self._settle(turn, done)
                ends = one_turn or (turn.fresh and done.error is not None)
                reported.append(
                    self._report_response(session_id, request_id, done, ends, info.model)
                )

        url = self.nodes.endpoint(node, api.path)
        response: web.StreamResponse
        try:
            if url is None:
                done.error = ForwardError("unknown_node", f"no URL known for node {node!r}")
                response = api.error(502, f"node {node!r} has no known URL", "upstream_error")
            elif self.nodes.down(node).is_set():  # its sessions are moved; the retry is placed
                done.error = ForwardError("node_down", f"node {node!r} is unhealthy")
                self.metrics.upstream_errors.inc(node=node, kind="node_down")
                response = self._unavailable(api, f"node {node!r} is unhealthy; retry later")
            else:
                self.metrics.forwarded.inc(node=node)
                response = await self._send(turn, url, done, report_now)
        except asyncio.CancelledError:
            # A client that closes once it has the whole answer (the OpenAI SDK does, right
            # after [DONE]) cancels the handler too: the answer was complete (its report
            # started at the end marker, no error), so it counts and logs as served.
            if not (reported and done.error is None):
                done.error = done.error or CLIENT_CLOSED
            report_now()
            raise
        except Exception as exc:  # a bug or a closed client session: reported, then a 500
            done.error = ForwardError(INTERNAL_ERROR, describe(exc))
            report_now()
            raise
        report_now()
        if done.error is None:
            self.calibration.observe(
                info.model,
                info.prompt_tokens_estimate,
                done.stats.usage.prompt_tokens,
                turn.tenant,
            )
        await asyncio.shield(reported[0])
        return Answered(response)

    def _settle(self, turn: Turn, done: Forwarded) -> None:
        """The forward is over (``done`` complete): remember the Responses id it served, and
        record the session's new continuation tip, or give the claimed one back."""
        answer = done.stats.answer
        ok = done.error is None and done.status == 200 and answer is not None
        now = self.clock()
        if ok and answer.response_id:
            self.response_ids.served(turn.tenant, answer.response_id, turn.client_id, now)
        if turn.chain_end is None or self.continuations is None:
            return
        turn.outcome.continuation_settled = True
        if ok:
            tip = turn.chain_end.tip(answer_items(answer.text, answer.calls))
            self.continuations.answered(turn.session_id, tip, now)
        elif not turn.fresh:
            self.continuations.release(turn.session_id, now)
        else:
            self.continuations.forget(turn.session_id)

    def _done(self, endpoint: str, out: Outcome) -> None:
        """Count the request by its outcome and log its ``request_done`` line, the one line
        of every model request (a forwarded one's with the node's answer)."""
        outcome = out.final()
        self.metrics.requests.inc(endpoint=endpoint, outcome=outcome)
        done = out.forwarded
        self.log.info(
            "request_done",
            endpoint=endpoint,
            outcome=outcome,
            session_id=out.session_id,
            request_id=out.request_id,
            node_id=None if done is None else done.node_id,
            status=None if done is None else done.status,
            error=None if done is None else done.error_text,
            ttft_s=None if done is None else done.ttft_s,
            duration_s=None if done is None else done.duration_s,
        )

    def _asks_ids(self, api: Api, node: str) -> bool:
        """Ask ``node`` for token ids: the API has them, the node takes them, and its block
        size is known (else no keys could be made of them)."""
        return api.token_ids and self.token_ids.ask(node) and bool(self.nodes.block_size(node))

    async def _send(
        self, turn: Turn, url: str, done: Forwarded, before_done: Callable[[], None]
    ) -> web.StreamResponse:
        assert self.client is not None, "Relay.client is set by the app's startup"
        client = self.client
        request, api, body, info = turn.request, turn.api, turn.body, turn.info
        headers = upstream_headers(
            request.headers,
            self.auth.node_headers(request.headers),
            {SESSION_HEADER: turn.session_id, "X-Request-ID": turn.request_id},
        )

        down = self.nodes.down(done.node_id)

        async def send(ids: bool) -> web.StreamResponse:
            outgoing = api.upstream(body, info, token_ids=ids)
            read = api.reader(body, ids)
            if turn.transcribe:
                read = transcribing_reader(read, api.name)
            if info.stream:
                tracker = api.tracker(body, info, ids)
                if turn.transcribe:
                    tracker = Transcribing(tracker, api.name)
                return await forward_stream(
                    request,
                    client,
                    url,
                    outgoing,
                    headers,
                    self.clock,
                    done,
                    tracker=tracker,
                    read=read,
                    before_done=before_done,
                    error_event=api.error_event,
                    abort=down,
                )
            return await forward_json(
                client, url, outgoing, headers, self.clock, done, read, abort=down
            )

        asked = self._asks_ids(api, done.node_id)
        try:
            response = await send(asked)
            refusal = response.body if isinstance(response, web.Response) else None
            if asked and isinstance(refusal, bytes) and rejects_field(done.status, refusal):
                if self.token_ids.refused(done.node_id):
                    detail = refusal.decode(errors="replace")[:200]
                    self.log.warning("token_ids_unsupported", node_id=done.node_id, detail=detail)
                done.restart()
                response = await send(False)
            return response
        except UpstreamError as exc:
            self.metrics.upstream_errors.inc(node=done.node_id, kind=exc.kind)
            done.error = ForwardError(f"upstream_{exc.kind}", exc.detail)
            return api.error(
                502, f"model node {done.node_id!r} failed: {exc.detail}", "upstream_error"
            )

    def _report_response(
        self,
        session_id: str,
        request_id: str,
        done: Forwarded,
        one_turn: bool,
        model: str | None = None,
    ) -> asyncio.Task[bool]:
        stats = done.stats
        block_size = self.nodes.block_size(done.node_id) if stats.prompt_ids else None
        keys = block_keys_of(stats.prompt_ids, block_size)
        msgs: list[Message] = [
            SessionResponse(
                session_id=session_id,
                request_id=request_id,
                node_id=done.node_id,
                gateway_id=self.settings.gateway_id,
                finished_at=self.clock(),
                usage=done.stats.usage,
                finish_reason=done.stats.finish_reason,
                tool_calls=list(done.stats.tool_calls),
                ttft_s=done.ttft_s,
                duration_s=done.duration_s,
                error=done.error_text,
                block_size=block_size if keys is not None else None,
                block_keys=keys,
                model=model,
            )
        ]
        if one_turn:
            reason = END_COMPLETED
            if done.error == CLIENT_CLOSED:
                reason = END_CLIENT_CLOSED
            elif done.error is not None:
                reason = END_ERROR
            msgs.append(self._end_msg(session_id, reason, self.clock()))
        return self.report(session_id, *msgs)
