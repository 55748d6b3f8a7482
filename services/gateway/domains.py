"""One gateway for several scheduling domains: which domain's relay serves a request.

With ``TAO_GATEWAY_DOMAINS=pool-a,pool-b`` the gateway runs one :class:`~.relay.Relay` per
domain, each on that domain's bus namespace (the domain's name, as its services run with
``TAO_NAMESPACE=<domain>``), store keys and nodes, exactly as a one-domain gateway would; this
module picks the relay of each request (docs/scale-out.md, "The upper-level choice"). A session
stays in one domain for its life, and the choice is made once, when the gateway first sees it:

1. a ``X-TAO-Domain`` header naming a served domain (an operator's pin) wins;
2. a session this gateway routed before stays where it went (bounded memory, newest kept);
3. a session another gateway replica routed is found in a domain's store (its record exists
   there and has not ended);
4. a new session goes where :func:`shared.core.domains.choose_domain` says: among the domains
   that serve its model and have capacity, the one least loaded after it by
   ``(demand + weight) / capacity``. Each domain's load is the last ``DomainLoadReport`` its
   valuation published (each tick), plus the weights this gateway routed there since that
   report (a burst of arrivals between two ticks is not all sent to one domain).

A domain whose models the request's model is not among, or that has reported no load yet, is
not chosen by rule 4; when no domain qualifies the first domain serving the model takes it (the
relay then answers as a one-domain gateway would: 404 for an unknown model, or a hold). A
remembered domain that does not serve the request's model is chosen again (the session moves).
Hook posts are routed the same way by the session their payload names, with no model.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from services.gateway.apis import Api
from services.gateway.relay import Relay
from shared.contracts.domain import DomainLoadReport
from shared.core.domains import DomainLoad, choose_domain
from shared.core.valuation import session_weight

__all__ = ["DOMAIN_HEADER", "REMEMBERED", "DomainRouter", "Route"]

DOMAIN_HEADER: Final = "X-TAO-Domain"
REMEMBERED: Final = 100_000
"""Sessions whose domain the router remembers (the oldest are forgotten first; a forgotten
one is found again in its domain's store)."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where a request goes and why (``pinned``, ``remembered``, ``stored``, ``least_loaded``,
    ``fallback``)."""

    domain: str
    reason: str


@dataclass(slots=True)
class _Pending:
    """Weights routed to a domain since its last load report."""

    since: float = 0.0
    weight: int = 0


@dataclass
class DomainRouter:
    """The relays of the served domains, in configured order, and the choice between them."""

    relays: Mapping[str, Relay]
    reserve: int
    loads: dict[str, DomainLoadReport] = field(default_factory=dict)
    remembered: OrderedDict[str, str] = field(default_factory=OrderedDict)
    pending: dict[str, _Pending] = field(default_factory=dict)
    routed: dict[tuple[str, str], int] = field(default_factory=dict)
    """Sessions routed, per ``(domain, reason)``."""

    @property
    def names(self) -> list[str]:
        return list(self.relays)

    def on_load(self, report: DomainLoadReport) -> None:
        """Keep a domain's newest load report; what was routed before it is counted in it."""
        known = self.loads.get(report.domain)
        if report.domain not in self.relays or (known is not None and known.ts > report.ts):
            return
        self.loads[report.domain] = report
        pending = self.pending.get(report.domain)
        if pending is not None and pending.since <= report.ts:
            del self.pending[report.domain]

    def _serves(self, domain: str, model: str | None) -> bool:
        if model is None:
            return True
        report = self.loads.get(domain)
        models = report.models if report is not None and report.models is not None else None
        if models is None:
            known = self.relays[domain].nodes.models()
            models = known or None
        return models is None or model in models

    def _load(self, domain: str) -> DomainLoad:
        report = self.loads.get(domain)
        if report is None:
            return DomainLoad(domain, 0, 0)  # no report yet: not chosen by load
        extra = self.pending.get(domain)
        return DomainLoad(
            domain, report.capacity, report.demand + (extra.weight if extra is not None else 0)
        )

    async def route(
        self,
        session_id: str | None,
        model: str | None,
        tokens: int,
        pinned: str | None,
        now: float,
    ) -> Route:
        """The domain of a request of ``session_id`` (None: a one-turn session) asking for
        ``model`` with about ``tokens`` prompt tokens (module docstring)."""
        if pinned is not None and pinned in self.relays:
            return self._keep(session_id, Route(pinned, "pinned"), 0, now)
        if session_id is not None:
            known = self.remembered.get(session_id)
            if known is not None and self._serves(known, model):
                self.remembered.move_to_end(session_id)
                return Route(known, "remembered")
            if known is None:
                stored = await self._stored(session_id)
                if stored is not None and self._serves(stored, model):
                    return self._keep(session_id, Route(stored, "stored"), 0, now)
        weight = session_weight(tokens, 0, self.reserve)
        loads = [self._load(d) for d in self.relays if self._serves(d, model)]
        chosen = choose_domain(loads, weight)
        if chosen is not None:
            return self._keep(session_id, Route(chosen, "least_loaded"), weight, now)
        fallback = next((d for d in self.relays if self._serves(d, model)), self.names[0])
        return self._keep(session_id, Route(fallback, "fallback"), weight, now)

    async def _stored(self, session_id: str) -> str | None:
        """The first domain (in configured order) whose store holds the live session."""

        async def live(relay: Relay) -> bool:
            store = relay.stored.store
            if store is None:
                return False
            try:
                s = await store.get_session(session_id)
            except Exception:  # a bad id or a store hiccup: not found there
                return False
            return s is not None and not s.ended

        found = await asyncio.gather(*(live(r) for r in self.relays.values()))
        return next((d for d, ok in zip(self.relays, found, strict=True) if ok), None)

    def _keep(self, session_id: str | None, route: Route, weight: int, now: float) -> Route:
        key = (route.domain, route.reason)
        self.routed[key] = self.routed.get(key, 0) + 1
        if weight:
            pending = self.pending.setdefault(route.domain, _Pending(since=now))
            pending.weight += weight
        if session_id is not None:
            self.remembered[session_id] = route.domain
            self.remembered.move_to_end(session_id)
            while len(self.remembered) > REMEMBERED:
                self.remembered.popitem(last=False)
        return route

    async def for_request(self, request: web.Request, api: Api, now: float) -> str:
        """The domain of a model request. A request the first relay cannot even read (no key,
        bad JSON, no model) goes to it, which answers the error as a one-domain gateway."""
        first = self.names[0]
        caller = self.relays[first].auth.client(request.headers)
        if caller is None:
            return first
        try:  # read once: the relay finds the outcome on the request
            body, info = await self.relays[first].bodies.read(request, api.describe)
        except Exception:  # the relay answers 400/413 itself
            return first
        named, source = api.identity(request.headers, body, lambda: "")
        session = None if source == "generated" else caller.session(named)
        pinned = request.headers.get(DOMAIN_HEADER)
        route = await self.route(session, info.model, info.prompt_tokens_estimate, pinned, now)
        return route.domain

    async def for_hook(self, headers: Mapping[str, str], session: str, now: float) -> str:
        """The domain whose tools service gets a hook post naming ``session`` ('' none)."""
        first = self.names[0]
        caller = self.relays[first].auth.hook(headers)
        if caller is None or not session:
            return first
        route = await self.route(caller.session(session), None, 0, headers.get(DOMAIN_HEADER), now)
        return route.domain

    def for_session(self, session_id: str) -> Sequence[str]:
        """The domains to end ``session_id`` in: its own if known, else every one."""
        known = self.remembered.get(session_id)
        return [known] if known is not None else self.names
