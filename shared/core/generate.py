"""Seeded synthetic one-tick snapshots for tests and benchmarks.

Pure: every random draw comes from a ``numpy.random.Generator`` built from the ``seed``
argument, so the same arguments always give the same :class:`~shared.core.problem.Problem`
(no clock, no I/O, no global state).

The shape follows coding-agent traces (DESIGN 3.1, 3.2):

* **tokens** — context size: a 3.5k–6.5k system/tool prefix plus 0–35 turns of lognormal
  growth (median ≈ 900 tokens a turn), so most sessions sit at 5k–40k with a lognormal-ish
  body; one session in twenty grows three times faster (long-running sessions, up to 120k).
  Clipped to [4k, 120k].
* **weight** — ``tokens − shared + 512``: ``shared`` (0–2048) is the system-prompt share held
  with other sessions, 512 the reserve for the next turn.
* **credit** — ``"one"``: with probability 0.6 a session has credit on exactly one node;
  ``"several"``: with probability 0.6 on 1–3 nodes, with distinct amounts; ``"none"``: never.
  An amount is the resident prefix (70–100 % of tokens) decayed with a 10 s half-life over a
  0–40 s tool time, rounded to 256 tokens (zero amounts are dropped).
* **ready** — Bernoulli(0.4).
* **eligibility** — every node, except ~5 % of sessions restricted to a random proper subset.
* **free capacity** — ``Σ weights / Σ free == load`` (demand over capacity). Shares are
  heterogeneous (uniform 0.4–1.6, normalised) unless ``interchangeable``; node ``load`` (tokens
  already reserved) is 0.5–3 × its free capacity.

With ``interchangeable=True`` every node gets the same free capacity, and the last
``max(2, m // 2)`` nodes (capped at m) form a block that never carries credit, shares one
``load`` value and is included in or excluded from a restricted eligibility set as a whole, so
those nodes are truly interchangeable (same capacity, value column and eligibility).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import numpy as np

from shared.core.problem import Candidate, Node, Problem

CreditMode = Literal["one", "several", "none"]

RESERVE = 512
CREDIT_UNIT = 256
HALF_LIFE_S = 10.0
P_CREDIT = 0.6
P_READY = 0.4
P_RESTRICTED = 0.05
MIN_TOKENS = 4_000
MAX_TOKENS = 120_000


def _round_to(unit: int, x: float) -> int:
    return round(float(x) / unit) * unit


def _tokens(rng: np.random.Generator) -> int:
    base = rng.uniform(3_500.0, 6_500.0)
    turns = int(rng.integers(0, 36))
    growth = float(rng.lognormal(np.log(900.0), 0.45))
    if rng.random() < 0.05:
        growth *= 3.0
    return int(np.clip(round(base + turns * growth), MIN_TOKENS, MAX_TOKENS))


def _credit_amount(rng: np.random.Generator, tokens: int) -> int:
    resident = tokens * rng.uniform(0.7, 1.0)
    age_s = rng.uniform(0.0, 40.0)
    return _round_to(CREDIT_UNIT, resident * 2.0 ** (-age_s / HALF_LIFE_S))


def _credit(
    rng: np.random.Generator, tokens: int, mode: CreditMode, places: list[str]
) -> dict[str, int]:
    """Credit map for one session over the nodes in ``places`` (eligible, credit-bearing)."""
    if mode == "none" or not places or rng.random() >= P_CREDIT:
        return {}
    count = 1 if mode == "one" else int(rng.integers(1, min(3, len(places)) + 1))
    picked = rng.choice(len(places), size=count, replace=False)
    out: dict[str, int] = {}
    for j in picked:
        amount = _credit_amount(rng, tokens)
        while amount > 0 and amount in out.values():
            amount -= CREDIT_UNIT  # keep the amounts distinct across nodes
        if amount > 0:
            out[places[int(j)]] = amount
    return out


def _eligible(
    rng: np.random.Generator, node_ids: list[str], block: list[str]
) -> frozenset[str] | None:
    """``None`` (every node) for most sessions; a random proper subset for ~5 %.

    Nodes in ``block`` (the interchangeable ones) are kept together as one group.
    """
    if rng.random() >= P_RESTRICTED:
        return None
    groups: list[list[str]] = [[x] for x in node_ids if x not in block]
    if block:
        groups.append(list(block))
    if len(groups) < 2:
        return None
    size = int(rng.integers(1, len(groups)))
    picked = rng.choice(len(groups), size=size, replace=False)
    return frozenset(x for j in picked for x in groups[int(j)])


def generate(
    seed: int,
    *,
    nodes: int,
    candidates: int,
    load: float,
    credit: CreditMode,
    interchangeable: bool,
    quantum: int = 512,
) -> Problem:
    """A synthetic snapshot with ``nodes`` nodes (``n0..``) and ``candidates`` sessions
    (``s0..``) whose total weight is ``load`` times the total free capacity."""
    if nodes < 1:
        raise ValueError(f"nodes: must be >= 1, got {nodes}")
    if candidates < 0:
        raise ValueError(f"candidates: must be >= 0, got {candidates}")
    if not load > 0:
        raise ValueError(f"load: must be > 0, got {load}")
    if quantum < 1:
        raise ValueError(f"quantum: must be >= 1, got {quantum}")
    if credit not in ("one", "several", "none"):
        raise ValueError(f"credit: must be one, several or none, got {credit!r}")

    rng = np.random.default_rng(seed)
    node_ids = [f"n{b}" for b in range(nodes)]
    block = node_ids[nodes - min(nodes, max(2, nodes // 2)) :] if interchangeable else []

    cands: list[Candidate] = []
    for i in range(candidates):
        tokens = _tokens(rng)
        shared = min(int(rng.integers(0, 2049)), tokens)
        ready = int(rng.random() < P_READY)
        eligible = _eligible(rng, node_ids, block)
        places = [x for x in node_ids if x not in block and (eligible is None or x in eligible)]
        cands.append(
            Candidate(
                id=f"s{i}",
                weight=tokens - shared + RESERVE,
                tokens=tokens,
                ready=ready,
                credit=_credit(rng, tokens, credit, places),
                eligible=eligible,
            )
        )

    total_free = round(sum(c.weight for c in cands) / load)
    if interchangeable:
        free = [round(total_free / nodes)] * nodes
    else:
        shares = rng.uniform(0.4, 1.6, size=nodes)
        free = [round(float(x)) for x in total_free * shares / shares.sum()]
        free[-1] += total_free - sum(free)
    reserved = [round(f * float(rng.uniform(0.5, 3.0))) for f in free]
    if block:
        shared_load = reserved[node_ids.index(block[0])]
        reserved = [
            shared_load if x in block else v for x, v in zip(node_ids, reserved, strict=True)
        ]

    return Problem(
        quantum=quantum,
        nodes=tuple(
            Node(id=x, free=f, load=r) for x, f, r in zip(node_ids, free, reserved, strict=True)
        ),
        candidates=tuple(cands),
    )


class Family(NamedTuple):
    """One benchmark family: the non-seed arguments of :func:`generate`."""

    nodes: int
    candidates: int
    load: float
    credit: CreditMode = "one"
    interchangeable: bool = False

    @property
    def name(self) -> str:
        ix = "-ix" if self.interchangeable else ""
        return f"m{self.nodes}-n{self.candidates}-L{self.load:g}-{self.credit}{ix}"

    def problem(self, seed: int, quantum: int = 512) -> Problem:
        return generate(
            seed,
            nodes=self.nodes,
            candidates=self.candidates,
            load=self.load,
            credit=self.credit,
            interchangeable=self.interchangeable,
            quantum=quantum,
        )


NODE_COUNTS = (2, 4, 8, 16)
CANDIDATE_COUNTS = (8, 16, 32, 64, 128, 160, 256)
LOADS = (0.5, 1.0, 2.0, 3.0, 5.0)


def families() -> list[Family]:
    """The benchmark grid (173 families), in a stable order.

    1. Main grid, credit ``"one"``, heterogeneous nodes: every node count × every candidate
       count with at least two candidates per node (fewer leave nodes idle or unable to fit
       anyone) × every load — 125 families.
    2. ``"several"`` slice: every node count × candidates {16, 64, 160} (where ≥ 2 per node)
       × loads {1, 3} — 22 families.
    3. Interchangeable slice, credit ``"one"``: nodes {4, 8, 16} × candidates {32, 64, 160}
       × loads {1, 3} — 18 families (exercises exact symmetry merging).
    4. No-credit slice (readiness and tokens decide): nodes {4, 8} × candidates {32, 160}
       × loads {1, 3} — 8 families.
    """
    out: list[Family] = []
    for m in NODE_COUNTS:
        for n in CANDIDATE_COUNTS:
            if n < 2 * m:
                continue
            out.extend(Family(m, n, x) for x in LOADS)
    for m in NODE_COUNTS:
        for n in (16, 64, 160):
            if n >= 2 * m:
                out.extend(Family(m, n, x, "several") for x in (1.0, 3.0))
    for m in (4, 8, 16):
        for n in (32, 64, 160):
            out.extend(Family(m, n, x, "one", True) for x in (1.0, 3.0))
    for m in (4, 8):
        for n in (32, 160):
            out.extend(Family(m, n, x, "none") for x in (1.0, 3.0))
    return out
