"""Held requests: waiting, per session, for the placement that admits it.

A request of a session that is not admitted waits here until :meth:`Holds.admit` names a node
for its session (all of the session's held requests go), until :meth:`Holds.end` says the
session was ended (they raise :class:`HoldEnded`), or until its timeout. Waiting is on an
asyncio future, so a test awaits the event itself; nothing polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["HoldEnded", "HoldTimeout", "Holds"]


class HoldTimeout(Exception):
    """A held request was not admitted within ``timeout_s``."""

    def __init__(self, session_id: str, timeout_s: float) -> None:
        self.session_id = session_id
        self.timeout_s = timeout_s
        super().__init__(f"session {session_id!r} not admitted within {timeout_s:g} s")


class HoldEnded(Exception):
    """The session of a held request was ended (``DELETE /v1/sessions/{id}``) while it waited."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(f"session {session_id!r} was ended while the request was held")


class Holds:
    """Futures of held requests, by session."""

    def __init__(self) -> None:
        self._waiting: dict[str, dict[asyncio.Future[str], str]] = {}  # future -> request id

    def held(self) -> int:
        """How many requests are held now."""
        return sum(len(w) for w in self._waiting.values())

    def is_held(self, session_id: str) -> bool:
        """Whether a request of ``session_id`` is held now."""
        return bool(self._waiting.get(session_id))

    def wait(
        self, session_id: str, timeout_s: float, request_id: str = ""
    ) -> Coroutine[Any, Any, str]:
        """Hold request ``request_id`` until the session is admitted; the awaitable gives its
        node or raises :class:`HoldTimeout` / :class:`HoldEnded`. The hold is registered at this
        call, before any await, so an admit that arrives from then on is never missed.
        Cancelling the awaiting task (client gone) releases the hold."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(session_id, {})[fut] = request_id
        return self._wait(session_id, fut, timeout_s)

    async def _wait(self, session_id: str, fut: asyncio.Future[str], timeout_s: float) -> str:
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise HoldTimeout(session_id, timeout_s) from None
        finally:
            waiters = self._waiting.get(session_id)
            if waiters is not None:
                waiters.pop(fut, None)
                if not waiters:
                    del self._waiting[session_id]

    def admit(self, session_id: str, node_id: str) -> int:
        """Release every held request of the session to ``node_id``; return how many."""
        woken = 0
        for fut in self._waiting.get(session_id, {}):
            if not fut.done():
                fut.set_result(node_id)
                woken += 1
        return woken

    def end(self, session_id: str) -> list[str]:
        """Release every held request of the session with :class:`HoldEnded`; return their
        request ids."""
        ended: list[str] = []
        for fut, request_id in self._waiting.get(session_id, {}).items():
            if not fut.done():
                fut.set_exception(HoldEnded(session_id))
                ended.append(request_id)
        return ended
