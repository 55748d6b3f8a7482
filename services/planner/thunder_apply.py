"""ThunderAgent's admissions in the store, by its own accounting (``TAO_POLICY=thunderagent*``).

ThunderAgent's resume places a program whenever its own accounting says the backend has room
(router.py:793–838 of ThunderAgent-org/ThunderAgent: ``tokens + 100`` against the
backend's ``remaining_capacity``, state.py:182–191) and nothing refuses it afterwards. The
store's capacity-checked ``apply`` is a second test on other numbers (TAO's session weights
against capacity × ``TAO_TARGET_UTILISATION``): a resume it refused waited for another
check, a whole interval, in TAO's live ``thunderagent`` and never in ThunderAgent. So the
planner admits the machine's resumes (and its forced resumes, router.py:846–868) here, each
guarded only by the session's version and pool membership on a node that is healthy now; the
machine's own accounting is the capacity check, as in ThunderAgent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anyio

from shared.core.session import Session, admit
from shared.core.tick import Applied, Move
from shared.infra.store_types import StateStore

__all__ = ["admit_unchecked"]


def _if_pooled(m: Move, at: float) -> Callable[[Session | None], tuple[Session | None, bool]]:
    """Admit ``m`` regardless of capacity if the session is still pooled at the version the
    snapshot saw (the signature check of DESIGN 3.4); the flag says it was admitted."""

    def step(s: Session | None) -> tuple[Session | None, bool]:
        if s is None or s.version != m.version or not s.pooled:
            return None, False
        return admit(s, m.node, m.weight, at), True

    return step


async def admit_unchecked(store: StateStore, moves: Sequence[Move], at: float) -> Applied:
    """Admit ``moves`` through the store's atomic batch update (reserved totals and index sets
    stay consistent), each if its session is still pooled at the snapshot's version and its
    node healthy now; ``admitted`` the ones done, ``sessions`` their records."""
    if not moves:
        return Applied(discarded=False)
    healthy = {nd.id for nd in await store.nodes() if nd.healthy}
    live = [m for m in moves if m.node in healthy]
    with anyio.CancelScope(shield=True):
        out = await store.update_sessions_with([(m.session, _if_pooled(m, at)) for m in live])
    done = tuple(m for m, (_, ok) in zip(live, out, strict=True) if ok)
    recs = {m.session: rec for m, (rec, ok) in zip(live, out, strict=True) if ok and rec}
    if done:
        await store.incr(sessions_admitted=len(done))
    return Applied(discarded=False, admitted=done, sessions=recs)
