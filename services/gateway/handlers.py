"""HTTP and bus handlers of the gateway: thin, each delegating to :class:`.relay.Relay`.

HTTP (OpenAI-compatible, plus two of TAO's own):

    POST   /v1/chat/completions   held until admitted, then forwarded (stream or not)
    POST   /v1/completions        same
    POST   /v1/messages           same, Anthropic Messages API (Claude Code; :mod:`.anthropic`)
    POST   /v1/responses          same, OpenAI Responses API (Codex CLI; :mod:`.openai_responses`)
    GET    /v1/models             union of the nodes' models
    DELETE /v1/sessions/{id}      end a session now: its held requests are answered at once
                                  (409, error type "session_ended", each reported as
                                  SessionCancel reason "session_ended"), then SessionEnd is
                                  published; 200 with
                                  {"id", "object": "session.deleted", "deleted": true};
                                  400 for an id over 512 characters or with a control
                                  character (:mod:`.ids`), nothing ended
    GET    /healthz               liveness: {"status": "ok", "gateway_id", "held", "admitted"}
    GET    /readyz                readiness (:mod:`.ready`): 200 {"status": "ready", ...} once
                                  the planner is warm and planning and a node is healthy,
                                  else 503 {"status": "not_ready", "reason", ...}
    GET    /metrics               Prometheus text

A model request's body is read in one place (:class:`.bodies.BodyReader`, bounded in size,
compression, time and items; :mod:`.bodies`, :func:`.requests.read_json`): one that is not
strict JSON (invalid UTF-8, a lone surrogate, ``NaN`` / ``Infinity`` / ``1e400``), nests
deeper than :data:`.requests.MAX_BODY_DEPTH` levels or gives a field the gateway reads the
wrong type is answered 400 in the endpoint's error format, naming the field.

Request headers read by the model endpoints:

    X-Session-ID      the session id. First of: (/v1/messages) Claude Code's
                      ``metadata.user_id``, ``X-Claude-Code-Session-Id``, ``X-Session-ID``,
                      OpenCode's ``x-session-affinity``, ``X-SMG-Routing-Key``,
                      ``X-Dynamo-Session-ID``, Codex's ``session-id`` / ``session_id``,
                      AIPerf's ``X-Correlation-ID``, the body's ``session_id`` (OpenRouter's)
                      and ``conversation_id`` (vLLM's multi-turn benchmark),
                      (/v1/responses) ``previous_response_id``'s session, the body's
                      ``user``, ``program_id``; none: the session the conversation
                      continues, else a new one (:mod:`.requests`, :mod:`.continuation`)
    x-parent-session-id  optional: the session that started this one as a sub-agent
                      (OpenCode), reported as SessionRequest.parent_session_id
    X-TAO-Harness     optional: the agent harness sending the request (set by harness hooks or
                      clients, e.g. ``claude-code``), at most 128 characters (else 400);
                      reported as SessionRequest.harness, not forwarded to the node; without
                      it, Claude Code's ids or a harness's ``User-Agent`` name the harness
    Authorization     with a tenants file (TAO_TENANTS_FILE), the client's API key
                      (or ``x-api-key``; :mod:`.auth`), not forwarded; without one,
                      forwarded to the node unchanged (so is ``x-api-key``); with
                      TAO_NODE_API_KEY that key goes instead. ``anthropic-version`` and
                      ``anthropic-beta`` are forwarded

Bus: placements for this gateway (JetStream; with TAO_PLACEMENT_KEYS only those the planner
signed, recently: :mod:`shared.infra.signing`, the others counted by reason in
``tao_gateway_placements_total{result}``), node statuses (core NATS; URL and models of each
node), session ends (core NATS; forget the session's admission).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from services.gateway.apis import CHAT, COMPLETIONS, MESSAGES, RESPONSES, openai_error
from services.gateway.cluster_metrics import cluster_lines
from services.gateway.ids import id_problem
from services.gateway.ready import readiness
from services.gateway.relay import Relay
from shared.contracts import DecodeError, NodeStatus, Placement, SessionEnd, decode
from shared.infra.busapi import Delivery

__all__ = ["BusHandlers", "HttpHandlers", "bad_delete", "decode_placement", "ready_response"]

MODELS_TIMEOUT_S = 2.0


def decode_placement(data: bytes) -> Placement:
    """Decode a Placement; an ``admit`` without a node is unusable (dead-lettered)."""
    placement = decode(data, Placement)
    if placement.kind == "admit" and not placement.node_id:
        raise DecodeError("Placement", "admit without node_id")
    return placement


def bad_delete(relay: Relay, named: str) -> web.Response | None:
    """400 for a ``DELETE /v1/sessions/{id}`` whose id is no id (:mod:`.ids`: too long, a
    control character), counted as ``outcome="bad_request"``; ``None`` for a good one."""
    problem = id_problem(named)
    if problem is None:
        return None
    relay.metrics.requests.inc(endpoint="delete", outcome="bad_request")
    return openai_error(400, f"session id {problem}", "invalid_request_error")


def ready_response(gateway_id: str, reason: str | None, detail: dict[str, object]) -> web.Response:
    """``/readyz``'s answer: 200 ready, or 503 with the ``reason``."""
    body: dict[str, object] = {"status": "ready" if reason is None else "not_ready"}
    if reason is not None:
        body["reason"] = reason
    body.update(gateway_id=gateway_id, **detail)
    return web.json_response(body, status=200 if reason is None else 503)


class HttpHandlers:
    """The gateway's HTTP endpoints."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self.relay.handle(request, CHAT)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.relay.handle(request, COMPLETIONS)

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self.relay.handle(request, MESSAGES)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self.relay.handle(request, RESPONSES)

    async def delete_session(self, request: web.Request) -> web.Response:
        caller = self.relay.auth.client(request.headers)
        if caller is None:
            return self.relay.unauthorized(CHAT, "delete")
        named = request.match_info["session_id"]
        refused = bad_delete(self.relay, named)
        if refused is not None:
            return refused
        session_id = caller.session(named)
        released = await self.relay.end_session(session_id)
        self.relay.log.info("session_deleted", session_id=session_id, held_released=released)
        return web.json_response({"id": named, "object": "session.deleted", "deleted": True})

    async def healthz(self, request: web.Request) -> web.Response:
        relay = self.relay
        return web.json_response(
            {
                "status": "ok",
                "gateway_id": relay.settings.gateway_id,
                "held": relay.holds.held(),
                "admitted": relay.placements.admitted_count(),
            }
        )

    async def readyz(self, request: web.Request) -> web.Response:
        relay = self.relay
        reason, detail = await readiness(relay.stored.store, relay.clock())
        return ready_response(relay.settings.gateway_id, reason, detail)

    async def metrics(self, request: web.Request) -> web.Response:
        cluster = await cluster_lines(self.relay.stored.store)
        text = self.relay.metrics.render() + "".join(f"{line}\n" for line in cluster)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        if self.relay.auth.client(request.headers) is None:
            return self.relay.unauthorized(CHAT, "models")
        known = self.relay.nodes.models()
        if known:
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "tao"} for m in known]
        else:
            data = await self._ask_nodes()
        return web.json_response({"object": "list", "data": data})

    async def _ask_nodes(self) -> list[dict[str, Any]]:
        """No node reported its models yet: ask each node's ``/v1/models`` and merge."""
        client = self.relay.client
        nodes = self.relay.nodes
        if client is None:
            return []
        urls = [u for n, _ in nodes.items() if (u := nodes.endpoint(n, "/v1/models"))]

        async def one(url: str) -> list[dict[str, Any]]:
            try:
                timeout = aiohttp.ClientTimeout(total=MODELS_TIMEOUT_S)
                async with client.get(url, timeout=timeout) as resp:
                    body = orjson.loads(await resp.read())
            except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
                self.relay.log.warning("models_unavailable", url=url, error=str(exc))
                return []
            data = body.get("data") if isinstance(body, dict) else None
            return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

        merged: dict[str, dict[str, Any]] = {}
        for models in await asyncio.gather(*(one(u) for u in urls)):
            for model in models:
                merged.setdefault(str(model.get("id")), model)
        return [merged[k] for k in sorted(merged)]


class BusHandlers:
    """Handlers of the messages the gateway consumes."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def on_placement(self, placement: Placement, delivery: Delivery) -> None:
        relay = self.relay
        verifier = relay.verifier  # TAO_PLACEMENT_KEYS: act only on what the planner signed
        verdict = "ok" if verifier is None else verifier.verdict(placement)
        woken = 0
        if verdict != "ok":
            result: str = verdict
        else:
            result = relay.placements.apply(placement)
            if result == "admitted" and placement.node_id:
                woken = relay.holds.admit(placement.session_id, placement.node_id)
        relay.metrics.placements.inc(kind=placement.kind, result=result)
        (relay.log.info if verdict == "ok" else relay.log.warning)(
            "placement",
            session_id=placement.session_id,
            kind=placement.kind,
            node_id=placement.node_id,
            version=placement.version,
            key_id=placement.key_id,
            result=result,
            woken=woken,
        )

    async def on_node_status(self, status: NodeStatus, delivery: Delivery) -> None:
        self.relay.nodes.update(status)

    async def on_session_end(self, end: SessionEnd, delivery: Delivery) -> None:
        """Whoever ended the session (idle timeout, DELETE, one-turn), its admission is over,
        and no request continues it by content."""
        self.relay.placements.forget(end.session_id)
        if self.relay.continuations is not None:
            self.relay.continuations.forget(end.session_id)
