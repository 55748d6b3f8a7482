"""Cache credit decay (DESIGN 3.1, paper §3.3 eq. 4).

A node's observation that ``k0`` of a session's prefix tokens are resident there ages: the longer
ago it was made, the less it is worth, because the engine may have evicted the prefix since. The
credit used for planning is::

    k = round_to(U, k0 * 2 ** (-age / h)),   age = max(0, now - t_obs)

with ``h`` the half-life (10 s by default) and ``U`` the rounding unit in tokens. Rounding makes
near-equal credits tie, so that readiness (the next key of the lexicographic value) decides.

``round_to`` is exact: the float is split into an integer ratio and rounded with integer
arithmetic, so no intermediate ``x / U + 0.5`` can round the wrong way. Ties go **half up**
(towards +∞): ``round_to(4, 6.0) == 8``. With ``U == 1`` it is plain rounding to the nearest
integer, halves up.

Evidence (:func:`confirmed_t_obs`, :func:`with_evidence`). An observation is worth less with
age because the prefix may have been evicted since; a node whose KV-event stream reports every
eviction, and has reported all of them since the observation, says it has not been: the
prefix is still resident at the stream's latest batch. So when the node's stream has been
complete (no lost batches, no restart or clear) from ``since`` up to ``until``, an observation
made at ``t_obs >= since`` ages from ``until``, not from ``t_obs``; one made before ``since``
(evidence a lost batch may have contradicted), and every observation on a node without such a
stream (usage-based residency), ages from its ``t_obs`` as before.

Pure: no clock; ``now`` is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

DEFAULT_HALF_LIFE_S = 10.0
"""Half-life ``h`` of a residency observation, seconds (paper §3.3)."""

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "Evidence",
    "confirmed_t_obs",
    "decay_factor",
    "decayed_credit",
    "decayed_credits",
    "round_to",
    "with_evidence",
]

Evidence = tuple[float, float]
"""``(since, until)``: a node's KV-event stream has been complete from ``since`` to ``until``
(its latest batch)."""


def round_to(unit: int, x: float) -> int:
    """The multiple of ``unit`` nearest to ``x``, ties half up; ``unit`` must be ≥ 1.

    Exact for every finite float: ``floor(x / unit + 1/2) * unit`` computed on the integer ratio
    of ``x``, never in floating point.
    """
    if unit < 1:
        raise ValueError(f"unit: must be >= 1, got {unit}")
    if not math.isfinite(x):
        raise ValueError(f"x: must be finite, got {x}")
    num, den = x.as_integer_ratio()
    # floor(num / (den * unit) + 1/2) == floor((2 * num + den * unit) / (2 * den * unit))
    return ((2 * num + den * unit) // (2 * den * unit)) * unit


def decay_factor(age_s: float, half_life_s: float = DEFAULT_HALF_LIFE_S) -> float:
    """``2 ** (-age / h)`` with a negative age (clock skew) treated as 0, so the factor is ≤ 1."""
    if not half_life_s > 0.0 or not math.isfinite(half_life_s):
        raise ValueError(f"half_life_s: must be finite and > 0, got {half_life_s}")
    if math.isnan(age_s):
        raise ValueError("age_s: must not be NaN")
    if age_s <= 0.0:
        return 1.0
    return math.exp2(-age_s / half_life_s)


def decayed_credit(
    k0: int,
    t_obs: float,
    now: float,
    *,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    unit: int,
) -> int:
    """Decayed, rounded credit of an observation of ``k0`` resident tokens made at ``t_obs``.

    ``now < t_obs`` (clock skew between the observer and the caller) counts as age 0, so a
    credit never exceeds its observation. ``k0 <= 0`` gives 0. Non-increasing in ``now``.
    """
    if unit < 1:
        raise ValueError(f"unit: must be >= 1, got {unit}")
    if math.isnan(t_obs) or math.isnan(now):
        raise ValueError("t_obs, now: must not be NaN")
    if k0 <= 0:
        return 0
    age = now - t_obs if now > t_obs else 0.0
    # ``now - t_obs`` is inf when one side is infinite: the factor is then 0, the credit 0.
    factor = decay_factor(age, half_life_s) if math.isfinite(age) else 0.0
    # At factor 1 round the int itself, which stays exact even beyond 2**53 tokens.
    return round_to(unit, k0 if factor == 1.0 else k0 * factor)


def decayed_credits(
    residency: Mapping[str, tuple[int, float]],
    now: float,
    *,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    unit: int,
) -> dict[str, int]:
    """Per-node decayed credit of ``{node: (k0, t_obs)}``; nodes whose credit rounds to 0 are
    left out (absent means 0 in :class:`shared.core.problem.Candidate`)."""
    out: dict[str, int] = {}
    for node_id in sorted(residency):
        k0, t_obs = residency[node_id]
        k = decayed_credit(k0, t_obs, now, half_life_s=half_life_s, unit=unit)
        if k > 0:
            out[node_id] = k
    return out


def confirmed_t_obs(t_obs: float, evidence: Evidence | None) -> float:
    """The latest time the evidence confirms an observation made at ``t_obs``: the stream's
    ``until`` when the observation lies in its complete stretch (``since <= t_obs < until``),
    else ``t_obs`` itself (no stream, or one that lost batches after the observation)."""
    if evidence is None:
        return t_obs
    since, until = evidence
    return until if since <= t_obs < until else t_obs


def with_evidence(
    residency: Mapping[str, Mapping[str, tuple[int, float]]],
    evidence: Mapping[str, Evidence],
) -> Mapping[str, Mapping[str, tuple[int, float]]]:
    """``{session: {node: (k0, t_obs)}}`` with each ``t_obs`` moved to
    :func:`confirmed_t_obs` by its node's evidence; the maps of sessions nothing moved are
    returned as they are (never changed in place)."""
    if not evidence:
        return residency
    out: dict[str, Mapping[str, tuple[int, float]]] = {}
    for sid, nodes in residency.items():
        moved: dict[str, tuple[int, float]] | None = None
        for node, (k0, t_obs) in nodes.items():
            ev = evidence.get(node)
            if ev is None:
                continue
            t = confirmed_t_obs(t_obs, ev)
            if t != t_obs:
                if moved is None:
                    moved = dict(nodes)
                moved[node] = (k0, t)
        out[sid] = nodes if moved is None else moved
    return out
