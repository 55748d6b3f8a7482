"""One gateway for several scheduling domains: which domain's relay serves a request.

With ``TAO_GATEWAY_DOMAINS=pool-a,pool-b`` the gateway runs one :class:`~.relay.Relay` per
domain, each on that domain's bus namespace (the domain's name, as its services run with
``TAO_NAMESPACE=<domain>``), store keys and nodes, exactly as a one-domain gateway would; this
module picks the relay of each request (docs/scale-out.md, "The upper-level choice"). A session
stays in one domain for its life, and the choice is made once, when the gateway first sees it:

1. a ``X-TAO-Domain`` header naming a served domain (an operator's pin) wins;
2. a session this gateway routed before stays where it went (bounded memory: at most
   :data:`REMEMBERED_PER_TENANT` sessions of one tenant and :data:`REMEMBERED` in all, the
   least recently used forgotten first, :class:`.bounded.TenantLRU`);
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

Nothing is remembered before the request is checked: a request whose body or ids the relay
would refuse (bad JSON, an id over 512 characters or with a control character, :mod:`.ids`)
goes to the first domain's relay, which answers it, and no session is kept for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from services.gateway.apis import Api
from services.gateway.bounded import TenantLRU
from services.gateway.ids import id_problem
from services.gateway.relay import Relay
from shared.contracts.domain import DomainLoadReport
from shared.core.domains import DomainLoad, choose_domain
from shared.core.valuation import session_weight

__all__ = ["DOMAIN_HEADER", "REMEMBERED", "DomainRouter", "Route"]

DOMAIN_HEADER: Final = "X-TAO-Domain"
REMEMBERED: Final = 100_000
"""Sessions whose domain the router remembers (the oldest are forgotten first; a forgotten
one is found again in its domain's store)."""
REMEMBERED_PER_TENANT: Final = 50_000
"""Sessions of one tenant the router remembers."""


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
    remembered: TenantLRU[str, str, str] = field(
        default_factory=lambda: TenantLRU(REMEMBERED_PER_TENANT, REMEMBERED)
    )
    """Sessions' domains, per tenant (the caller's name)."""
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
        tenant: str = "",
    ) -> Route:
        """The domain of a request of ``tenant``'s ``session_id`` (None: a one-turn session)
        asking for ``model`` with about ``tokens`` prompt tokens (module docstring)."""
        keep = (tenant, session_id)
        if pinned is not None and pinned in self.relays:
            return self._keep(keep, Route(pinned, "pinned"), 0, now)
        if session_id is not None:
            known = self.remembered.get(tenant, session_id)
            if known is not None and self._serves(known, model):
                return Route(known, "remembered")
            if known is None:
                stored = await self._stored(session_id)
                if stored is not None and self._serves(stored, model):
                    return self._keep(keep, Route(stored, "stored"), 0, now)
        weight = session_weight(tokens, 0, self.reserve)
        loads = [self._load(d) for d in self.relays if self._serves(d, model)]
        chosen = choose_domain(loads, weight)
        if chosen is not None:
            return self._keep(keep, Route(chosen, "least_loaded"), weight, now)
        fallback = next((d for d in self.relays if self._serves(d, model)), self.names[0])
        return self._keep(keep, Route(fallback, "fallback"), weight, now)

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

    def _keep(
        self, session: tuple[str, str | None], route: Route, weight: int, now: float
    ) -> Route:
        key = (route.domain, route.reason)
        self.routed[key] = self.routed.get(key, 0) + 1
        if weight:
            pending = self.pending.setdefault(route.domain, _Pending(since=now))
            pending.weight += weight
        tenant, session_id = session
        if session_id is not None:
            self.remembered.put(tenant, session_id, route.domain)
        return route

    async def for_request(self, request: web.Request, api: Api, now: float) -> str:
        """The domain of a model request. A request the first relay cannot even read (no key,
        bad JSON, no model) goes to it, which answers the error as a one-domain gateway."""
        first = self.names[0]
        caller = self.relays[first].auth.client(request.headers)
        if caller is None:
            return first
        try:  # read once: the relay finds the outcome on the request
            body, info = await self.relays[first].bodies.read(request, api.describe, caller.name)
            named, source = api.identity(request.headers, body, lambda: "")
        except Exception:  # the relay answers 400/413 itself; nothing is remembered
            return first
        session = None if source == "generated" else caller.session(named)
        pinned = request.headers.get(DOMAIN_HEADER)
        route = await self.route(
            session, info.model, info.prompt_tokens_estimate, pinned, now, caller.name
        )
        return route.domain

    async def for_hook(self, headers: Mapping[str, str], session: str, now: float) -> str:
        """The domain whose tools service gets a hook post naming ``session`` ('' none)."""
        first = self.names[0]
        caller = self.relays[first].auth.hook(headers)
        if caller is None or not session or id_problem(session) is not None:
            return first  # its forwarder answers (a bad id: 400), nothing is remembered
        route = await self.route(
            caller.session(session), None, 0, headers.get(DOMAIN_HEADER), now, caller.name
        )
        return route.domain

    def for_session(self, session_id: str, tenant: str = "") -> Sequence[str]:
        """The domains to end ``tenant``'s ``session_id`` in: its own if known, else every
        one."""
        known = self.remembered.get(tenant, session_id, touch=False)
        return [known] if known is not None else self.names
