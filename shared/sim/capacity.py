"""Agents within an SLO: per policy, the most concurrent agent sessions per node that meet it.

``tao sim --capacity --slo ttft_p90=2`` (:mod:`shared.cli.capacity`). An SLO is one or more
terms, all of which must hold in a run (:class:`Slo`):

* ``ttft_pXX=S`` / ``latency_pXX=S`` — the XX-th percentile of the requests' time to first
  token (issued → first token, the hold in a scheduler's pool included) or of the tasks'
  latency is at most S seconds; ``ttft_mean`` / ``latency_mean`` likewise for the mean;
* ``decode_pXX=R`` — a floor: the XX-th percentile of the requests' decode rates (completion
  tokens / (finished − first token), tok/s, each request while it runs) is at least R.

The search (:func:`search_capacity`), per (policy, seed), over the closed-loop worker count W
(concurrent agent sessions on the cluster; agents per node = W / nodes): doubling from
``start`` while the SLO holds (up to ``max_workers``), then bisection between the last W that
held and the first that failed, until they are ``resolution`` apart relative to the lower
(at least one worker). It assumes the SLO is monotone in W (a W that fails above one that
holds is not searched for) and returns the last W that held (0 when even one worker fails;
``max_workers`` with ``capped`` when nothing failed). Every policy runs the same tasks per
seed (common random numbers), so the per-seed capacities pair: :func:`summarise` reports
each policy's mean with its 95 % Student-t interval over seeds, and the ratio of each
compared policy to the best baseline (by mean capacity) per seed, with its interval.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from shared.sim.metrics import mean, pct, t_quantile
from shared.sim.records import SimResult

__all__ = [
    "DEFAULT_SLO",
    "CapacityRow",
    "Search",
    "Slo",
    "SloTerm",
    "interval",
    "parse_slo",
    "search_capacity",
    "slo_values",
]

DEFAULT_SLO = "ttft_p90=2"
_TERM = re.compile(r"^(ttft|latency|decode)_(p(\d{1,2}(?:\.\d+)?)|mean)$")


@dataclass(frozen=True, slots=True)
class SloTerm:
    """One bound: ``metric`` (e.g. ``ttft_p90``) at most ``limit`` (a floor for ``decode_*``)."""

    metric: str
    limit: float

    @property
    def floor(self) -> bool:
        """A lower bound (decode rates), else an upper bound (times)."""
        return self.metric.startswith("decode_")

    def met(self, value: float | None) -> bool:
        """Whether ``value`` meets the bound (no value — no requests — fails)."""
        if value is None or math.isnan(value):
            return False
        return value >= self.limit if self.floor else value <= self.limit


@dataclass(frozen=True, slots=True)
class Slo:
    """All of ``terms`` must hold."""

    terms: tuple[SloTerm, ...]

    def __str__(self) -> str:
        return ",".join(f"{t.metric}{'>=' if t.floor else '<='}{t.limit:g}" for t in self.terms)

    def met(self, values: Mapping[str, float | None]) -> bool:
        """Whether every term holds on ``values`` (from :func:`slo_values`)."""
        return all(t.met(values.get(t.metric)) for t in self.terms)


def parse_slo(text: str) -> Slo:
    """``metric=value[,metric=value...]``; ``ValueError`` naming what was wrong."""
    terms: list[SloTerm] = []
    for part in (p.strip() for p in text.split(",")):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or not _TERM.match(name):
            raise ValueError(
                f"slo: {part!r} is not METRIC=VALUE with METRIC ttft_pXX, latency_pXX, "
                "decode_pXX, ttft_mean or latency_mean"
            )
        m = _TERM.match(name)
        assert m is not None
        if m.group(3) is not None and not 0 < float(m.group(3)) < 100:
            raise ValueError(f"slo: percentile of {name!r} must be in (0, 100)")
        if name == "decode_mean":
            raise ValueError("slo: decode takes a percentile floor (decode_pXX), not a mean")
        try:
            limit = float(value)
        except ValueError:
            raise ValueError(f"slo: {name} needs a number, got {value!r}") from None
        if not (math.isfinite(limit) and limit > 0):
            raise ValueError(f"slo: {name} must be a finite number > 0, got {value!r}")
        terms.append(SloTerm(name, limit))
    if len({t.metric for t in terms}) != len(terms):
        raise ValueError("slo: a metric is named twice")
    return Slo(tuple(terms))


def slo_values(res: SimResult, slo: Slo) -> dict[str, float | None]:
    """The value of each of ``slo``'s metrics on one run."""
    series: dict[str, list[float]] = {
        "ttft": [r.first_token - r.issued for r in res.requests],
        "latency": [t.end - t.start for t in res.tasks],
        "decode": [
            r.completion / (r.finished - r.first_token)
            for r in res.requests
            if r.completion > 1 and r.finished > r.first_token
        ],
    }
    out: dict[str, float | None] = {}
    for t in slo.terms:
        kind, _, stat = t.metric.partition("_")
        vals = series[kind]
        out[t.metric] = mean(vals) if stat == "mean" else pct(vals, float(stat[1:]))
    return out


@dataclass(slots=True)
class Search:
    """One capacity search: ``best`` (the largest W that met the SLO), ``tried`` (W → met, in
    the order tried), ``capped`` (the SLO still held at ``max_workers``)."""

    best: int = 0
    tried: dict[int, bool] = field(default_factory=dict)
    capped: bool = False


def search_capacity(
    meets: Callable[[int], bool],
    *,
    start: int = 4,
    max_workers: int = 512,
    resolution: float = 0.1,
) -> Search:
    """Doubling from ``start`` then bisection (module docstring); ``meets(W)`` runs W."""
    if start < 1 or max_workers < start:
        raise ValueError(f"need 1 <= start <= max_workers, got {start}, {max_workers}")
    if resolution < 0:
        raise ValueError(f"resolution: must be >= 0, got {resolution}")
    s = Search()

    def run(w: int) -> bool:
        if w not in s.tried:
            s.tried[w] = bool(meets(w))
        return s.tried[w]

    lo, hi = 0, start
    while run(hi):
        lo = hi
        if hi >= max_workers:
            s.best, s.capped = hi, True
            return s
        hi = min(2 * hi, max_workers)
    while hi - lo > max(1.0, resolution * lo):
        mid = (lo + hi) // 2
        if run(mid):
            lo = mid
        else:
            hi = mid
    s.best = lo
    return s


def interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the Student-t half-width (None for fewer than two values)."""
    arr = np.asarray(values, dtype=float)
    m = float(arr.mean())
    if len(arr) < 2:
        return m, None
    half = t_quantile(0.5 + confidence / 2, len(arr) - 1) * float(arr.std(ddof=1))
    return m, half / math.sqrt(len(arr))


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """A policy's capacity over seeds: per-seed agents per node, their mean ± half-width,
    and (compared policies) the paired ratio to ``baseline`` per seed, mean ± half-width."""

    policy: str
    per_seed: dict[int, float]
    capped: bool
    baseline: str | None = None
    ratio: tuple[float, float | None] | None = None

    @property
    def mean(self) -> tuple[float, float | None]:
        """Mean agents per node over seeds, and its 95 % half-width."""
        return interval(list(self.per_seed.values()))
