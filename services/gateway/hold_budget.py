"""The gateway-wide bound on held requests: how many, and how many bytes of body.

A request waiting for admission keeps its decoded body (what it will forward), so held requests
are the gateway's memory that grows with its clients. Tenants' ``max_held`` bounds each tenant
(:mod:`.auth`), but a gateway with one key, or none, had no bound at all. :class:`HoldBudget`
bounds every mode: a request that would be held is first given a place (``TAO_MAX_HELD``
requests, ``TAO_MAX_HELD_BYTES`` bytes of decoded body); without one it is answered 503 with
``Retry-After`` before anything is registered, as a full server answers (RFC 9110 §15.6.4).
The place is taken before the request is registered (so two arrivals cannot both take the last
one) and given back when its hold ends, or at once when its session turns out to be admitted.
Places are kept on the request (``request[HOLD_PLACE]``), so giving one back twice is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aiohttp import web

__all__ = ["HOLD_PLACE", "HoldBudget"]

HOLD_PLACE: Final = web.RequestKey("hold_place", int)
"""Request key: the place the request holds in the budget (its body's bytes)."""


@dataclass(slots=True)
class HoldBudget:
    """Places for held requests (module docstring)."""

    max_held: int
    max_bytes: int
    held: int = 0
    bytes: int = 0

    def take(self, request: web.BaseRequest, nbytes: int) -> bool:
        """Give ``request`` a place for a body of ``nbytes``; ``False`` when none is left (a
        request that has one keeps it)."""
        if HOLD_PLACE in request:
            return True
        if self.held + 1 > self.max_held or self.bytes + nbytes > self.max_bytes:
            return False
        self.held += 1
        self.bytes += nbytes
        request[HOLD_PLACE] = nbytes
        return True

    def give_back(self, request: web.BaseRequest) -> None:
        """The request no longer waits: its place is free (nothing if it had none)."""
        nbytes = request.pop(HOLD_PLACE, None)
        if nbytes is not None:
            self.held -= 1
            self.bytes -= nbytes

    def refusal(self) -> str:
        """What a request refused for want of a place is told."""
        return (
            f"the gateway already holds {self.held} requests ({self.bytes} bytes of body) "
            f"waiting for admission, its limit (TAO_MAX_HELD={self.max_held}, "
            f"TAO_MAX_HELD_BYTES={self.max_bytes}); retry later"
        )
