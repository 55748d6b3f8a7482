"""Who is calling: client API keys and hook tokens mapped to tenants (:mod:`shared.infra.tenants`).

On with a tenants file (``TAO_TENANTS_FILE``), or with the gateway's own key (secure by default
beyond loopback, :mod:`.gatewaykey`), which is one implicit tenant (:data:`IMPLICIT`: its key is
both its API key and its hook token, and its session ids are the clients' own, unprefixed). Off
(everyone trusted) only on loopback or with ``TAO_GATEWAY_AUTH=off``. When on:

* a model request, ``GET /v1/models`` and ``DELETE /v1/sessions/{id}`` need a tenant's API
  key, as ``Authorization: Bearer <key>`` (OpenAI clients) or ``x-api-key: <key>`` (Anthropic
  clients, Claude Code); without one: 401 in the endpoint's error format, counted as
  ``outcome="unauthorized"``;
* ``POST /hooks/{harness}`` needs a tenant's hook token, as ``Authorization: Bearer <token>``
  or ``X-TAO-Hook-Token: <token>`` (Claude Code's HTTP hooks send configured ``headers``);
  without one: 401, counted in ``tao_gateway_hooks_total{result="unauthorized"}``;
* every session id the tenant names (its header or body id, a sub-agent's parent, a generated
  one-turn id, the id in a ``DELETE``, the ids inside its hook payloads) is served as
  ``<tenant>:<id>``, so no tenant can reach another's session;
* the client's credentials are not forwarded to the nodes: ``TAO_NODE_API_KEY`` (if set) is
  sent instead, as ``Authorization: Bearer`` (vLLM's ``--api-key``);
* a tenant with ``max_held`` has at most that many requests held at once; one more is
  answered 429 with ``Retry-After``, counted as ``outcome="tenant_limit"``.

``/healthz``, ``/readyz`` and ``/metrics`` stay open (probes and Prometheus on the operator's
network).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from services.gateway.requests import header
from shared.infra.errors import ConfigFileError
from shared.infra.tenants import (
    SecretKind,
    Tenant,
    Tenants,
    TenantsWatch,
    digest,
    qualify,
    unqualify,
)

__all__ = ["HOOK_TOKEN_HEADER", "IMPLICIT", "OPEN", "Auth", "Caller"]

HOOK_TOKEN_HEADER: Final = "X-TAO-Hook-Token"
IMPLICIT: Final = ""
"""The name of the gateway key's tenant: no file's tenant can have it (names are non-empty),
and its sessions are not prefixed."""


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: its tenant, or ``None`` when authentication is off."""

    tenant: Tenant | None = None

    @property
    def name(self) -> str:
        """The tenant's name; ``""`` when authentication is off or for the gateway key."""
        return self.tenant.name if self.tenant is not None else IMPLICIT

    def session(self, session_id: str) -> str:
        """The id TAO keeps for the caller's ``session_id``."""
        return qualify(self.name, session_id) if self.name else session_id

    def client_id(self, session_id: str) -> str:
        """The caller's own id of a kept ``session_id``."""
        return unqualify(self.name, session_id) if self.name else session_id


OPEN: Final = Caller()


def _bearer(headers: Mapping[str, str]) -> str:
    value = header(headers, "Authorization")
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class Auth:
    """The gateway's view of the tenants file (``watch``) or of its own ``key``; neither:
    authentication off."""

    def __init__(
        self,
        watch: TenantsWatch | None,
        node_api_key: str | None = None,
        *,
        key: str | None = None,
    ) -> None:
        self.watch = watch
        self.node_api_key = node_api_key
        self.implicit: Tenants | None = None
        if key is not None:
            if watch is not None:
                raise ValueError("a gateway key and a tenants file exclude each other")
            d = digest(key)
            self.implicit = Tenants((Tenant(IMPLICIT, api_keys=(d,), hook_tokens=(d,)),))

    @classmethod
    def from_file(
        cls,
        path: str | None,
        node_api_key: str | None,
        clock: Callable[[], float],
        on_error: Callable[[ConfigFileError], None] | None = None,
        *,
        key: str | None = None,
    ) -> Auth:
        """Auth from ``TAO_TENANTS_FILE`` (``None``: the gateway ``key``, or off without one);
        a bad file raises at start, a reload that fails keeps the last good tenants and is
        passed to ``on_error``."""
        if path is None:
            return cls(None, node_api_key, key=key)
        return cls(TenantsWatch(path, clock=clock, on_error=on_error), node_api_key, key=key)

    @property
    def enabled(self) -> bool:
        return self.watch is not None or self.implicit is not None

    def _find(self, kind: SecretKind, secret: str) -> Caller | None:
        tenants = self.watch.current() if self.watch is not None else self.implicit
        if tenants is None:
            return OPEN
        tenant = tenants.find(kind, secret)
        return None if tenant is None else Caller(tenant)

    def client(self, headers: Mapping[str, str]) -> Caller | None:
        """The caller of a model or session request; ``None``: no known API key."""
        return self._find("api", _bearer(headers) or header(headers, "x-api-key"))

    def hook(self, headers: Mapping[str, str]) -> Caller | None:
        """The caller of a hook post; ``None``: no known hook token."""
        return self._find("hook", _bearer(headers) or header(headers, HOOK_TOKEN_HEADER))

    def node_headers(self, client: Mapping[str, str]) -> dict[str, str]:
        """Credentials for the node: ``TAO_NODE_API_KEY`` when set; else the client's own
        (``Authorization`` / ``x-api-key``) when authentication is off, none when it is on."""
        if self.node_api_key:
            return {"Authorization": f"Bearer {self.node_api_key}"}
        if self.enabled:
            return {}
        out: dict[str, str] = {}
        for name in ("Authorization", "x-api-key"):
            value = header(client, name)
            if value:
                out[name] = value
        return out
