"""Small parametric distributions for workload files, sampled with a seeded numpy Generator.

A distribution is written in a workload file (TOML) or a built-in family as a table::

    {dist = "constant", value = 5.0}
    {dist = "uniform", lo = 60, hi = 600}
    {dist = "lognormal", median = 0.4, p90 = 0.7}      # or sigma = 0.44 instead of p90
    {dist = "choice", values = [1, 2, 3], weights = [0.5, 0.3, 0.2]}

Optional ``min`` / ``max`` clip every kind. A log-normal given by its median ``m`` and 90th
percentile ``q`` has ``mu = ln m`` and ``sigma = ln(q / m) / z_0.90`` with ``z_0.90 = 1.2815516``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from shared.core.problem import ProblemError

Z90 = 1.2815515655446004
"""Standard normal 90 % quantile."""


class WorkloadError(ProblemError):
    """A workload file or trace that cannot be used: names the field and the reason (a
    :class:`~shared.core.problem.ProblemError`, so the CLI reports it as bad input, exit 2)."""


@dataclass(frozen=True, slots=True)
class Dist:
    """One parsed distribution (see the module docstring)."""

    kind: str
    a: float = 0.0
    b: float = 0.0
    values: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()
    lo: float = -math.inf
    hi: float = math.inf

    def sample(self, rng: np.random.Generator) -> float:
        """One draw, clipped to ``[min, max]``."""
        if self.kind == "constant":
            x = self.a
        elif self.kind == "uniform":
            x = float(rng.uniform(self.a, self.b))
        elif self.kind == "lognormal":
            x = float(math.exp(self.a + self.b * float(rng.standard_normal())))
        else:  # choice
            idx = int(rng.choice(len(self.values), p=np.asarray(self.weights)))
            x = self.values[idx]
        return min(max(x, self.lo), self.hi)


def _num(spec: Mapping[str, object], key: str, where: str) -> float:
    if key not in spec:
        raise WorkloadError(f"{where}.{key}", "missing")
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise WorkloadError(f"{where}.{key}", f"must be a finite number, got {value!r}")
    return float(value)


def parse_dist(spec: object, where: str) -> Dist:
    """Parse one distribution table; a bare number means a constant."""
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return Dist("constant", float(spec))
    if not isinstance(spec, Mapping):
        raise WorkloadError(where, f"must be a number or a table with 'dist', got {spec!r}")
    kind = spec.get("dist")
    lo = _num(spec, "min", where) if "min" in spec else -math.inf
    hi = _num(spec, "max", where) if "max" in spec else math.inf
    if lo > hi:
        raise WorkloadError(f"{where}.min", f"must be <= max, got {lo} > {hi}")
    if kind == "constant":
        return Dist("constant", _num(spec, "value", where), lo=lo, hi=hi)
    if kind == "uniform":
        a, b = _num(spec, "lo", where), _num(spec, "hi", where)
        if a > b:
            raise WorkloadError(f"{where}.lo", f"must be <= hi, got {a} > {b}")
        return Dist("uniform", a, b, lo=lo, hi=hi)
    if kind == "lognormal":
        median = _num(spec, "median", where)
        if median <= 0:
            raise WorkloadError(f"{where}.median", f"must be > 0, got {median}")
        if "sigma" in spec:
            sigma = _num(spec, "sigma", where)
        else:
            p90 = _num(spec, "p90", where)
            if p90 < median:
                raise WorkloadError(f"{where}.p90", f"must be >= median, got {p90} < {median}")
            sigma = math.log(p90 / median) / Z90
        if sigma < 0:
            raise WorkloadError(f"{where}.sigma", f"must be >= 0, got {sigma}")
        return Dist("lognormal", math.log(median), sigma, lo=lo, hi=hi)
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            raise WorkloadError(f"{where}.values", "must be a non-empty list of numbers")
        vals = tuple(_num({"v": v}, "v", f"{where}.values") for v in values)
        raw = spec.get("weights", [1.0] * len(vals))
        if not isinstance(raw, list) or len(raw) != len(vals):
            raise WorkloadError(f"{where}.weights", "must be a list as long as values")
        ws = [_num({"w": w}, "w", f"{where}.weights") for w in raw]
        if any(w < 0 for w in ws) or sum(ws) <= 0:
            raise WorkloadError(f"{where}.weights", "must be >= 0 with a positive sum")
        total = sum(ws)
        return Dist("choice", values=vals, weights=tuple(w / total for w in ws), lo=lo, hi=hi)
    raise WorkloadError(
        f"{where}.dist", f"must be constant, uniform, lognormal or choice, got {kind!r}"
    )
