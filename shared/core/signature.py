"""Versioned candidate signatures for the apply-time check (DESIGN 3.4, paper §3.5).

A candidate's signature is ``(session id, version, eligibility digest)``. The planner records
the signatures of the sessions its plan selects; just before publishing, the apply step compares
them with the live ones. If any differs (the session changed, or the set of nodes it may go to
changed) the whole plan is discarded.

The eligibility digest is a stable, order-free fingerprint of a set of node ids: the sorted,
de-duplicated ids, each length-prefixed (so no id can forge a boundary), hashed with BLAKE2b
(8-byte digest, personalised ``tao-elig-v1``) and written as 16 hex characters. The same set
gives the same digest in every process and on every machine, so a Redis script can compare
digests the valuation service computed.

Pure: hashing is deterministic.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from shared.core.problem import Candidate, PlanResult, Problem

__all__ = [
    "DIGEST_HEX_CHARS",
    "Signature",
    "changed",
    "eligibility_digest",
    "selected",
    "set_digest",
    "signature_of",
    "signatures",
]

DIGEST_HEX_CHARS: Final = 16
_PERSON: Final = b"tao-elig-v1"


@dataclass(frozen=True, slots=True)
class Signature:
    """What must still hold at apply time for a selected session."""

    session_id: str
    version: int
    eligibility_digest: str


def eligibility_digest(eligible_node_ids: Iterable[str]) -> str:
    """16-hex-character BLAKE2b digest of a set of node ids (order and duplicates ignored)."""
    h = hashlib.blake2b(digest_size=DIGEST_HEX_CHARS // 2, person=_PERSON)
    for node_id in sorted(set(eligible_node_ids)):
        raw = node_id.encode("utf-8")
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return h.hexdigest()


@functools.lru_cache(maxsize=4096)
def set_digest(eligible: frozenset[str]) -> str:
    """:func:`eligibility_digest` of a frozen set, cached: a tick values every pooled session,
    and their eligible sets are a handful of the nodes' subsets (a fifth of a wake-up tick's
    valuation went to hashing the same few sets again)."""
    return eligibility_digest(eligible)


def signature_of(candidate: Candidate, version: int, all_node_ids: Iterable[str]) -> Signature:
    """Signature of a planner candidate; ``eligible=None`` means every node in ``all_node_ids``."""
    nodes = all_node_ids if candidate.eligible is None else candidate.eligible
    return Signature(candidate.id, version, eligibility_digest(nodes))


def signatures(problem: Problem, versions: Mapping[str, int]) -> dict[str, Signature]:
    """Signature of every candidate of ``problem``, at the session versions it was built from.

    A candidate without a version is an error: the snapshot and its versions must come from one
    read of the store.
    """
    node_ids = [nd.id for nd in problem.nodes]
    out: dict[str, Signature] = {}
    for c in problem.candidates:
        if c.id not in versions:
            raise KeyError(f"versions: no version for session {c.id!r}")
        out[c.id] = signature_of(c, versions[c.id], node_ids)
    return out


def selected(plan: PlanResult, table: Mapping[str, Signature]) -> list[Signature]:
    """Signatures of the sessions a plan selects, in plan order (what the apply step checks)."""
    return [table[a.session] for a in plan.assignments]


def changed(selected: Sequence[Signature], live: Mapping[str, Signature]) -> list[str]:
    """Ids of selected sessions whose live signature differs or is gone, in ``selected`` order,
    each once. Empty means the plan may be applied."""
    out: list[str] = []
    seen: set[str] = set()
    for sig in selected:
        if sig.session_id in seen:
            continue
        seen.add(sig.session_id)
        if live.get(sig.session_id) != sig:
            out.append(sig.session_id)
    return out
