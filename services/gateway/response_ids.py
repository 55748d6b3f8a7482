"""The Responses ids the gateway served, per tenant: a session name, and a tenant's fence.

Every ``resp_…`` id a node returned through the gateway is remembered with the client's id of
the session that got it, under the tenant that asked (:class:`ResponseIds`). A later request's
``previous_response_id`` then names its session (:mod:`.requests`, "Session identity"), and,
with named tenants (a tenants file), it is forwarded only if this tenant was served it: a
node's response store (vLLM's ``--enable-store``) is one for all tenants, so an id another
tenant learnt would hand it that tenant's stored conversation as context. An id this tenant
was not served is answered as OpenAI's API answers an id it does not know
(:func:`not_found`). With one tenant (the gateway key, or authentication off) every id goes
on to the node unchanged, which answers for its own store.

Bounds (:class:`.bounded.TenantLRU`): at most ``per_tenant`` ids of one tenant, the least
recently used dropped first, and ``total`` over all tenants, dropped from the tenant that
holds the most, so no tenant can evict another's ids; an id lives ``ttl_s`` (TAO's idle
timeout: its session is ended by then).
"""

from __future__ import annotations

from typing import Final

from aiohttp import web

from services.gateway.bounded import TenantLRU

__all__ = ["DEFAULT_PER_TENANT", "DEFAULT_TOTAL", "ResponseIds", "not_found"]

DEFAULT_PER_TENANT: Final = 100_000
"""Ids remembered per tenant: about 60 MB at most (a 512-character session id each)."""
DEFAULT_TOTAL: Final = 4 * DEFAULT_PER_TENANT
"""Ids remembered over all tenants."""


def not_found(response_id: str) -> web.Response:
    """OpenAI's answer to a ``previous_response_id`` it does not hold: 404 with
    ``{"error": {"message": "Previous response with id '…' not found.", "type":
    "invalid_request_error", "param": "previous_response_id", "code":
    "previous_response_not_found"}}`` (the shape clients classify, e.g. codex-lb's
    ``is_previous_response_not_found_error``; docs/reliability.md)."""
    shown = response_id if len(response_id) <= 128 else response_id[:128] + "…"
    error = {
        "message": f"Previous response with id '{shown}' not found.",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }
    return web.json_response({"error": error}, status=404)


class ResponseIds:
    """Served Responses ids per tenant, to the client's id of the session that got each
    (module docstring)."""

    def __init__(
        self,
        *,
        ttl_s: float,
        per_tenant: int = DEFAULT_PER_TENANT,
        total: int = DEFAULT_TOTAL,
    ) -> None:
        self.ttl_s = ttl_s
        self._ids: TenantLRU[str | None, str, tuple[str, float]] = TenantLRU(per_tenant, total)

    def __len__(self) -> int:
        return len(self._ids)

    def count(self, tenant: str | None) -> int:
        """Ids remembered for ``tenant``."""
        return self._ids.count(tenant)

    def served(self, tenant: str | None, response_id: str, session: str, now: float) -> None:
        """``response_id`` was the answer to a request of the client's ``session``."""
        self._ids.put(tenant, response_id, (session, now))

    def session(self, tenant: str | None, response_id: str, now: float) -> str | None:
        """The client's session id of a ``response_id`` served to ``tenant``; ``None`` if
        unknown, another tenant's, or older than ``ttl_s``."""
        found = self._ids.get(tenant, response_id, touch=False)
        if found is None:
            return None
        if found[1] <= now - self.ttl_s:
            self._ids.pop(tenant, response_id)
            return None
        return found[0]
