"""Each node's shared prefix as the valuation knows it (:attr:`NodeView.shared`).

A node holds the prefix its sessions share (a harness's system prompt and tool schemas) once,
and their weights leave it out (:attr:`shared.core.session.Session.shared`, learned by the
tools service: :mod:`shared.core.sharedprefix`); the node's free room must then take it off
once. The store keeps no such total, so the valuation keeps, per node, the largest ``shared``
(at most the session's tokens) among the sessions admitted there that it has seen:

* every admitted record it reads: the first tick reads every admitted session once, the
  interrupt candidates and a dead node's sessions when a tick reads them, and the sessions
  named by the tools service's ``shared`` wake-ups (those whose ``shared`` changed, which
  moved their weights: a session learns its prefix only after its first response, usually
  while it is admitted);
* the admissions of the plans heard on ``tao.v1.plan``, with each candidate's ``shared`` from
  the pool read that valued it (a plan discarded at its apply counts too, until the node
  empties: the error is on the safe side).

It is kept across ticks (a wake-up tick reads only named sessions) and dropped when the node
holds no session (``held == 0`` in a node read that began after it was learned).

Limitation: several different shared prefixes on one node (two harnesses, two system prompts)
count as the largest of them; the others' sessions are weighed without their prefix, so the
node's free room is too large by what the smaller prefixes hold. And a session that left the
node keeps its prefix counted until the node is empty (never too small while it has sessions:
the room is at worst too small by the largest prefix).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from shared.core.session import Session
from shared.core.valuation import NodeView

__all__ = ["NodeShared"]


@dataclass(slots=True)
class NodeShared:
    """Per node, the largest shared prefix of its admitted sessions seen (module docstring)."""

    nodes: dict[str, tuple[int, float]] = field(default_factory=dict)
    """node → (shared tokens, when learned)."""
    candidates: dict[str, int] = field(default_factory=dict)
    """The last pool read's sessions with a shared prefix → its tokens (for plans' admits)."""

    def _raise(self, node: str, tokens: int, at: float) -> None:
        if tokens <= 0:
            return
        old = self.nodes.get(node)
        if old is None or tokens >= old[0]:
            self.nodes[node] = (tokens, at)

    def learn(self, sessions: Iterable[Session], at: float) -> None:
        """Admitted records read at ``at``: their nodes' shared prefix is at least theirs."""
        for s in sessions:
            if s.node is not None and not s.ended:
                self._raise(s.node, min(s.shared, s.tokens), at)

    def pooled(self, sessions: Iterable[Session]) -> None:
        """The pool just read: remember its sessions' shared prefix for the plans' admits."""
        self.candidates = {
            s.id: min(s.shared, s.tokens) for s in sessions if s.shared > 0 and s.node is None
        }

    def admitted(self, session: str, node: str, at: float) -> None:
        """A plan admitted ``session`` on ``node``."""
        tokens = self.candidates.get(session)
        if tokens:
            self._raise(node, tokens, at)

    def views(self, views: Sequence[NodeView], read_at: float) -> list[NodeView]:
        """``views`` (read from the store, beginning at ``read_at``) with each node's shared
        prefix; a node that held no session in that read forgets what was learned before it
        began (a plan's admission heard later may not be in it)."""
        out: list[NodeView] = []
        for v in views:
            got = self.nodes.get(v.id)
            if got is not None and v.held == 0 and got[1] < read_at:
                del self.nodes[v.id]
                got = None
            out.append(v if got is None or got[0] <= v.shared else replace(v, shared=got[0]))
        return out
