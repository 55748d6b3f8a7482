"""Reading round records: why a session was admitted, released, held or kept waiting.

A round's :class:`~shared.core.round.RoundRecord` lands in two places as the same plain
values (:meth:`RoundRecord.to_dict`): the planner's ``plan_round`` log line (JSON, with
``applied`` / ``discarded``) and, in the simulator, ``tao sim --record FILE`` (one JSON line per
applied round). :func:`rounds_from_lines` reads either; :func:`explain` picks the entries about
one session up to a time and words them. Pure: lines in, lines out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from shared.core.round import RoundRecord

__all__ = [
    "ExplainError",
    "ReleaseAudit",
    "Said",
    "TurnSeen",
    "audit_releases",
    "explain",
    "round_fields",
    "rounds_from_lines",
]

_MAX_LOGGED = 500
"""Entries one ``plan_round`` log line carries at most (the rest are counted)."""


class ExplainError(ValueError):
    """A line that is neither a round record nor a log line, or a session never named."""


def round_fields(record: RoundRecord, applied: object | None = None) -> dict[str, object]:
    """The planner's ``plan_round`` log fields: the record, and whether it was applied."""
    out = record.to_dict()
    entries = out["entries"]
    assert isinstance(entries, list)
    if len(entries) > _MAX_LOGGED:
        out["entries"] = entries[:_MAX_LOGGED]
        out["omitted"] = len(entries) - _MAX_LOGGED
    if applied is not None:
        out["discarded"] = bool(getattr(applied, "discarded", False))
        out["truncated"] = bool(getattr(applied, "truncated", False))
    return out


@dataclass(frozen=True, slots=True)
class Said:
    """One decision read back from a record: about ``subject``, made ``for_session``."""

    now: float
    tick: int
    rules: str
    kind: str
    subject: str
    node: str
    rule: str
    gain_s: float
    cost_s: float
    for_session: str
    note: str
    applied: bool

    def words(self, session: str) -> str:
        """One line: when, what, by which rule, at what price, and whether it took effect."""
        what = {
            "admit": f"admitted on {self.node}",
            "release": f"released from {self.node}",
            "hold": f"held on {self.node}, not released",
            "wait": "kept waiting" + (f" for {self.node}" if self.node else ""),
        }.get(self.kind, self.kind)
        if self.subject != session:
            what = f"{self.subject} {what} to make room for it"
        elif self.for_session:
            what += f" to make room for {self.for_session}"
        net = self.gain_s - self.cost_s
        price = f"gain {_fmt(self.gain_s)} s, cost {_fmt(self.cost_s)} s, net {_fmt(net)} s"
        extra = f"; {self.note}" if self.note else ""
        took = "" if self.applied else " [plan discarded]"
        return (
            f"t={self.now:.3f} tick {self.tick} [{self.rules}] {what} by rule {self.rule}: "
            f"{price}{extra}{took}"
        )


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.3f}"


def _num(v: object) -> float:
    if v == "inf":
        return math.inf
    if v == "-inf":
        return -math.inf
    if isinstance(v, int | float):
        return float(v)
    raise ExplainError(f"a price must be a number or 'inf', got {v!r}")


def rounds_from_lines(lines: Iterable[str]) -> list[Mapping[str, object]]:
    """The round records in ``lines``: a simulator record file's lines and the planner's
    ``plan_round`` log lines; other log lines are skipped, a line that is not JSON is an
    :class:`ExplainError` naming its number."""
    out: list[Mapping[str, object]] = []
    for no, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            if line.startswith("{"):
                raise ExplainError(f"line {no}: not JSON") from None
            continue  # a console log line or other text around the JSON
        if not isinstance(obj, dict):
            continue
        if obj.get("event") not in (None, "plan_round") or "entries" not in obj:
            continue
        if not isinstance(obj["entries"], list):
            raise ExplainError(f"line {no}: entries must be a list")
        out.append(obj)
    return out


def explain(
    rounds: Iterable[Mapping[str, object]], session: str, at: float | None = None
) -> list[str]:
    """Every decision the rounds record about ``session`` (as subject, or as the one room was
    made for) up to time ``at`` (all, when None), oldest first, worded."""
    said: list[Said] = []
    for r in rounds:
        now = _num(r.get("now", 0.0))
        if at is not None and now > at:
            continue
        entries = r.get("entries", [])
        assert isinstance(entries, list)
        for e in entries:
            if not isinstance(e, dict) or session not in (e.get("session"), e.get("for")):
                continue
            said.append(
                Said(
                    now=now,
                    tick=int(_num(r.get("tick", 0))),
                    rules=str(r.get("rules", "")),
                    kind=str(e.get("kind", "")),
                    subject=str(e.get("session", "")),
                    node=str(e.get("node", "")),
                    rule=str(e.get("rule", "")),
                    gain_s=_num(e.get("gain_s", 0.0)),
                    cost_s=_num(e.get("cost_s", 0.0)),
                    for_session=str(e.get("for", "")),
                    note=str(e.get("note", "")),
                    applied=not bool(r.get("discarded", False)),
                )
            )
    if not said:
        raise ExplainError(
            f"session {session!r}: no round records it" + ("" if at is None else f" up to t={at}")
        )
    said.sort(key=lambda s: (s.now, s.tick))
    return [s.words(session) for s in said]


@dataclass(frozen=True, slots=True)
class TurnSeen:
    """A model request as its client saw it: when it was sent (epoch s), its prompt tokens
    and how many of them the engine served from its cache."""

    session: str
    sent: float
    prompt: int
    cached: int


@dataclass(frozen=True, slots=True)
class ReleaseAudit:
    """Releases that took effect, and how many recomputed more seconds than holding the room
    until the session came back would have cost (``costly``)."""

    applied: int
    costly: int
    followed: int
    """Releases whose session sent another request afterwards (the others cannot be judged)."""


def audit_releases(
    rounds: Iterable[Mapping[str, object]], turns: Iterable[TurnSeen]
) -> ReleaseAudit:
    """Judge each applied release (a ``release`` entry of a round not discarded) by the
    session's next request: the release recomputed ``(prompt − cached) × prefill_s`` seconds
    (the node's price in the round's ``prices``; the engine's own cached count), and holding
    the room instead would have cost the seconds until that request was sent. A release is
    costly when the first exceeds the second."""
    by_session: dict[str, list[TurnSeen]] = {}
    for t in turns:
        by_session.setdefault(t.session, []).append(t)
    for seen in by_session.values():
        seen.sort(key=lambda t: t.sent)
    applied = costly = followed = 0
    for r in rounds:
        if r.get("discarded"):
            continue
        now = _num(r.get("now", 0.0))
        prices = r.get("prices", {})
        entries = r.get("entries", [])
        assert isinstance(entries, list) and isinstance(prices, dict)
        for e in entries:
            if not isinstance(e, dict) or e.get("kind") != "release":
                continue
            applied += 1
            nxt = next((t for t in by_session.get(str(e.get("session")), ()) if t.sent > now), None)
            if nxt is None:
                continue
            followed += 1
            price = _num(prices.get(str(e.get("node")), 0.0))
            if max(0, nxt.prompt - nxt.cached) * price > nxt.sent - now:
                costly += 1
    return ReleaseAudit(applied, costly, followed)
