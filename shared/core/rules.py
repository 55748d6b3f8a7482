"""TAO's rule sets: which rules act in a round, and their parameters, validated once.

A rule set is a named set of rules plus parameters (:class:`RuleSet`). Its rules are of two
kinds:

* **signals**, which shape the valuation: ``cache`` (decayed credit), ``ready`` (readiness and
  known remaining tool times), ``cost`` (the priced valuation: the mean residual of a call's
  history, a per-session readiness horizon, releases by net seconds, only where worth it),
  ``tier`` (host-tier credit and load prices), ``growth`` (a reserve from each session's
  per-turn growth), ``need`` (only sessions that will use the GPU now are placed), ``stay``
  (an admit goes to the session's last node when it is of equal value), ``wait`` (a release
  also costs the wait the released session's next request will have in the pool: the mean
  wait so far of the pool's pending requests);
* **proposers**, the pure functions of :mod:`shared.core.round` that propose releases and
  admits, each priced in seconds: ``payback`` (contexts over a node's KV release tool-running
  sessions, most net seconds first), ``payback-reserved`` (the paper's: reservations over
  capacity × target, ``(k, r, t)`` order, ``r = 1`` protected), ``tail`` (a request waiting
  ``starve_s`` is placed first, with a node cleared for it), ``home`` (a session whose last
  node holds the most of its prefix is served there: room released for it, moves priced),
  ``demand`` (the pool's demand releases tool-running sessions). Evacuation of a dead node
  always acts.

Dependencies are declared in :data:`REQUIRES` and checked at construction, with
:data:`EXCLUSIVE` pairs. The full account, with the rule sets that were retired and where their
measured results stay: docs/internals.md, "The priced round".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

__all__ = [
    "DEFAULT_RULES",
    "EXCLUSIVE",
    "PAPER",
    "REQUIRES",
    "RULES",
    "RULE_SETS",
    "RuleSet",
    "RuleSetError",
    "expected_remaining",
    "growth_reserve",
    "rule_set",
]

SIGNALS: Final = ("cache", "ready", "cost", "tier", "growth", "need", "stay", "wait")
PROPOSERS: Final = ("payback", "payback-reserved", "tail", "home", "demand")
RULES: Final = frozenset((*SIGNALS, *PROPOSERS))
"""Every rule a rule set may name."""

REQUIRES: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "home": frozenset({"demand", "cost"}),  # its room comes from the demand step's test
        "wait": frozenset({"cost"}),  # it is a term of the release price
    }
)
"""A rule → the rules it needs."""

EXCLUSIVE: Final = (frozenset({"payback", "payback-reserved"}),)
"""Rules that may not act together."""


class RuleSetError(ValueError):
    """A rule set that names an unknown rule, misses a dependency or a bad parameter."""


@dataclass(frozen=True, slots=True)
class RuleSet:
    """A validated rule set (module docstring): ``rules`` and the parameters they read."""

    name: str
    rules: frozenset[str]
    payback_headroom: int = 100
    """``payback``: tokens a context is counted above its length (ThunderAgent's +100 per
    program, ``backend/state.py``)."""
    growth_z: float = 2.0
    """``growth``: standard deviations of a session's per-turn growth reserved above its
    mean (the sweep of docs/evaluation.md, "Tool-awareness that pays", defaults)."""
    growth_min: int = 256
    growth_max: int = 16_384
    starve_s: float = 200.0
    """``tail``: how long a request waits before it is placed first (docs/evaluation.md,
    "The tail": the sweep chose 200 s)."""
    notes: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        unknown = sorted(self.rules - RULES)
        if unknown:
            raise RuleSetError(
                f"rule set {self.name!r}: unknown rule(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(RULES))}"
            )
        for rule, needs in REQUIRES.items():
            missing = sorted(needs - self.rules) if rule in self.rules else []
            if missing:
                raise RuleSetError(f"rule set {self.name!r}: {rule} needs {', '.join(missing)}")
        for pair in EXCLUSIVE:
            if pair <= self.rules:
                raise RuleSetError(
                    f"rule set {self.name!r}: {' and '.join(sorted(pair))} exclude each other"
                )
        if not (self.starve_s > 0 and self.growth_z >= 0 and self.payback_headroom >= 0):
            raise RuleSetError(
                f"rule set {self.name!r}: starve_s must be > 0, growth_z and payback_headroom >= 0"
            )
        if not 0 <= self.growth_min <= self.growth_max:
            raise RuleSetError(f"rule set {self.name!r}: need 0 <= growth_min <= growth_max")

    def __contains__(self, rule: object) -> bool:
        return rule in self.rules

    def without(self, name: str, *rules: str) -> RuleSet:
        """This set named ``name`` without ``rules`` (an ablation)."""
        return _derive(self, name, self.rules - set(rules))

    def plus(self, name: str, *rules: str, **params: float) -> RuleSet:
        """This set named ``name`` with ``rules`` added and ``params`` set."""
        return _derive(self, name, self.rules | set(rules), **params)


def _derive(base: RuleSet, name: str, rules: Iterable[str], **params: float) -> RuleSet:
    values = {
        "payback_headroom": base.payback_headroom,
        "growth_z": base.growth_z,
        "growth_min": base.growth_min,
        "growth_max": base.growth_max,
        "starve_s": base.starve_s,
    }
    values.update(params)
    return RuleSet(
        name,
        frozenset(rules),
        payback_headroom=int(values["payback_headroom"]),
        growth_z=float(values["growth_z"]),
        growth_min=int(values["growth_min"]),
        growth_max=int(values["growth_max"]),
        starve_s=float(values["starve_s"]),
    )


DEFAULT_RULES: Final = RuleSet(
    "tao",
    frozenset(
        {"cache", "ready", "cost", "tier", "growth", "need", "stay", "payback", "home", "demand"}
    ),
)
"""``tao``: the priced round: contexts over a node's KV are paid back, the pool's demand (its
home first) releases tool-running sessions only where the release nets seconds, released
sessions come back by their readmission time."""

PAPER: Final = RuleSet(
    "tao-paper", frozenset({"cache", "ready", "tier", "payback-reserved", "demand"})
)
"""``tao-paper``: the paper's round (DESIGN 3.2–3.3): reservations paid back and the pool's
demand met by releases in ``(k, r, t)`` order, ``r = 1`` protected; the paper's 1 s horizon."""

_ABLATIONS: Final = (
    DEFAULT_RULES.without("tao-no-cache", "cache"),
    DEFAULT_RULES.without("tao-no-ready", "ready"),
    DEFAULT_RULES.without("tao-no-cache-no-ready", "cache", "ready"),
    DEFAULT_RULES.without("tao-no-tier", "tier"),
    DEFAULT_RULES.without("tao-no-home", "home"),
    DEFAULT_RULES.without("tao-no-growth", "growth"),
    DEFAULT_RULES.without("tao-no-stay", "stay"),
    DEFAULT_RULES.without("tao-no-need", "need"),
    DEFAULT_RULES.plus("tao-fair", "tail"),
    DEFAULT_RULES.plus("tao-slo", "wait"),
    PAPER,
)

RULE_SETS: Final[Mapping[str, RuleSet]] = MappingProxyType(
    {DEFAULT_RULES.name: DEFAULT_RULES, **{r.name: r for r in _ABLATIONS}}
)
"""Every named rule set: ``tao``, its single-rule ablations, ``tao-fair`` (the default with a
bounded tail, not the default: it costs mean latency where the wait is the price of a KV-starved
node), ``tao-slo`` (the default with the released session's wait priced: fewer releases, a
lower TTFT p90 at an SLO's edge, a higher mean latency under contention; docs/evaluation.md,
"The released session's wait") and ``tao-paper``."""


def rule_set(name: str) -> RuleSet:
    """The rule set called ``name`` (:class:`RuleSetError` naming the known ones)."""
    try:
        return RULE_SETS[name]
    except KeyError:
        raise RuleSetError(f"unknown rule set {name!r}; known: {', '.join(RULE_SETS)}") from None


def growth_reserve(n: int, mean: float, m2: float, default: int, rules: RuleSet) -> int:
    """Tokens to reserve for the next turn from ``n`` observed per-turn growths (Welford's
    ``mean`` and ``m2``): ``mean + z·sd`` clipped to ``[growth_min, growth_max]``; ``default``
    with fewer than two observations or without the ``growth`` rule."""
    if "growth" not in rules or n < 2:
        return default
    sd = (max(m2, 0.0) / (n - 1)) ** 0.5
    est = mean + rules.growth_z * sd
    return int(min(max(est, rules.growth_min), rules.growth_max) + 0.5)


def expected_remaining(predicted_end: float, started_at: float, now: float) -> float:
    """Expected remaining seconds of a running call without the ``cost`` rule: until its
    predicted end, or, once it has run past that, as long again as it has run so far."""
    if now < predicted_end:
        return predicted_end - now
    return max(0.0, now - started_at)
