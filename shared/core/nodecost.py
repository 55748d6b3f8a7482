"""What a decision costs on one node, in seconds: one model, per node (DESIGN §8).

A :class:`NodeCost` holds a node's prices: prefill seconds per recomputed token, attention
seconds per (recomputed token, context token) pair, host-tier load seconds per token (0: no host
tier) and the control loop's round trip for a readmission. Every price TAO puts on an admit, a
release or a move is computed here from it (:meth:`NodeCost.recompute_s`, :meth:`release_s`,
:meth:`move_s`, :meth:`readmit_s`), and the round (:mod:`shared.core.round`), the valuation
(:mod:`shared.core.tick`) and the tiers (:mod:`shared.core.tiers`) read the same object.

Where a node's cost comes from:

* the simulator: its engine profile's ``prefill_b`` / ``prefill_f`` and its host link, with the
  simulated control loop's round trip (:func:`from_profile`);
* live: the node's own vLLM metrics, by :class:`PrefillEstimator` (docs/internals.md, "The cost
  of a node"), warmed up from the profile the nodes file names (or the default profile) and
  converging on what the node measures; a nodes file may pin the prefill terms instead.

No price is a literal here: the defaults are the default engine profile's and the control loop's
measured latencies (:class:`ControlLatency`). Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final, Literal

from shared.core.engine.profiles import DEFAULT_PROFILE, PROFILES, Profile

__all__ = [
    "DEFAULT_COST",
    "ControlLatency",
    "CostSource",
    "NodeCost",
    "PrefillEstimator",
    "PrefillSample",
    "from_profile",
]

CostSource = Literal["profile", "measured", "pinned"]


@dataclass(frozen=True, slots=True)
class ControlLatency:
    """The live control loop's latencies: the time from an event to its placement, by hop.

    Defaults are the measured figures of docs/benchmarks.md ("Tool end → placement", 1,000
    sessions, p50, from the services' log stamps): the tools service has written the event
    2.5 ms after it happened (``debounce_s`` 0.5 ms of that is the valuation's wake-up
    debounce, ``TAO_DEBOUNCE_S``), the valuation has published the snapshot 5.4 ms later
    (``value_s``), the planner solves (``solve_s`` + ``solve_per_session_s`` × sessions valued:
    0.6 / 0.9 / 5.9 ms at 100 / 1,000 / 10,000 sessions) and applies and publishes
    (``apply_s``, 12.8 − 7.9 − 0.9 ≈ 4.0 ms), and the gateway forwards the held request
    (``forward_s``, 1 ms assumed). The simulator charges them in virtual time
    (:mod:`shared.sim.des`); the round prices a readmission by :attr:`round_trip_s`.
    """

    debounce_s: float = 0.0005
    hop_in_s: float = 0.002
    value_s: float = 0.0054
    solve_s: float = 0.00085
    solve_per_session_s: float = 5.6e-7
    apply_s: float = 0.004
    forward_s: float = 0.001

    def solve_time(self, sessions: int) -> float:
        return self.solve_s + self.solve_per_session_s * sessions

    @property
    def round_trip_s(self) -> float:
        """Seconds from an event to its placement reaching the node (no per-session term)."""
        return (
            self.debounce_s
            + self.hop_in_s
            + self.value_s
            + self.solve_s
            + self.apply_s
            + self.forward_s
        )


@dataclass(frozen=True, slots=True)
class NodeCost:
    """One node's prices (module docstring). ``source`` says where the prefill terms came
    from; ``observed_tokens`` how many computed prompt tokens the estimate rests on."""

    prefill_s: float
    """Seconds of prefill per recomputed token (a profile's ``prefill_b``)."""
    attn_s: float
    """Seconds per (recomputed token, context token) pair (a profile's ``prefill_f``)."""
    requeue_s: float
    """The control loop's round trip for a readmission (:attr:`ControlLatency.round_trip_s`)."""
    load_s: float = 0.0
    """Seconds to load one token from the node's host KV tier (0: no host tier)."""
    source: CostSource = "profile"
    observed_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prefill_s", "attn_s", "requeue_s", "load_s"):
            value = getattr(self, name)
            if not (value >= 0.0 and math.isfinite(value)):
                raise ValueError(f"NodeCost.{name}: must be finite and >= 0, got {value}")

    def recompute_s(self, evicted: int, kept: int) -> float:
        """Seconds of prefill to recompute ``evicted`` tokens after ``kept`` cached ones."""
        e, k = max(0, evicted), max(0, kept)
        return e * (self.prefill_s + self.attn_s * (k + e / 2))

    def refill_s(
        self, tokens: int, kept: int, host_tokens: int = 0, tier: bool = True
    ) -> tuple[float, float]:
        """(recompute seconds, load seconds) to make a ``tokens``-long context usable again
        when its first ``kept`` tokens stay on the GPU and the host tier holds its first
        ``host_tokens``: the host covers what it holds beyond ``kept`` (by its load, or by the
        recompute where that is faster), the rest is recomputed (``tier`` off: no host)."""
        tokens = max(0, tokens)
        kept = min(max(0, kept), tokens)
        loaded = max(0, min(tokens, host_tokens) - kept) if tier and self.load_s > 0 else 0
        recomputed = tokens - kept - loaded
        load = min(loaded * self.load_s, self.recompute_s(loaded, kept))
        return self.recompute_s(recomputed, kept + loaded), load

    def release_s(
        self, tokens: int, running: int, host_tokens: int = 0, tier: bool = True
    ) -> float:
        """Expected seconds a release of a ``tokens``-long session costs: the recompute of its
        whole context (the pool that takes the room prefills into the node's cache, whose LRU
        evicts the idle released blocks first) times the ``1 + running`` requests that
        prefill delays, plus the re-queue; the part the host tier holds costs its load, which
        delays no other request (vLLM loads without stalling a step: docs/kv-tier.md §3)."""
        rec, load = self.refill_s(tokens, 0, host_tokens, tier)
        return (1 + max(0, running)) * rec + load + self.requeue_s

    def move_s(self, home_credit: int, there_credit: int, running: int) -> float:
        """Expected seconds a session loses by running on a node holding ``there_credit``
        tokens of credit for it instead of its home's ``home_credit``: the recompute of the
        difference after what this node keeps, times the ``1 + running`` requests it delays
        (credit is in tokens of recompute saved, :mod:`shared.core.tiers`)."""
        gone = max(0, home_credit - there_credit)
        return (1 + max(0, running)) * self.recompute_s(gone, max(0, there_credit))

    def readmit_s(self, tokens: int, host_tokens: int = 0, tier: bool = True) -> float:
        """How long before a released session's call returns it must be taken back so that
        it can run when it does: the control loop's round trip plus the time to make its whole
        context usable again (its load where the host tier holds it, its prefill where not)."""
        rec, load = self.refill_s(tokens, 0, host_tokens, tier)
        return self.requeue_s + rec + load

    def release_net_s(
        self,
        remaining_s: float,
        tokens: int,
        running: int,
        host_tokens: int = 0,
        tier: bool = True,
    ) -> float:
        """Seconds a release nets: the room's expected idle time ``remaining_s`` minus
        :meth:`release_s` (``inf`` when the remaining time is unknown)."""
        if math.isinf(remaining_s):
            return math.inf
        return remaining_s - self.release_s(tokens, running, host_tokens, tier)

    def with_prefill(
        self, prefill_s: float, attn_s: float, source: CostSource, observed: int = 0
    ) -> NodeCost:
        """This cost with other prefill terms (a measurement or a pin)."""
        return NodeCost(prefill_s, attn_s, self.requeue_s, self.load_s, source, observed)


def from_profile(
    profile: Profile, latency: ControlLatency | None = None, load_s: float = 0.0
) -> NodeCost:
    """A node's cost from its engine profile and its control loop (the simulator's, or the
    live prior the estimator starts from)."""
    lat = ControlLatency() if latency is None else latency
    return NodeCost(profile.prefill_b, profile.prefill_f, lat.round_trip_s, load_s)


DEFAULT_COST: Final = from_profile(PROFILES[DEFAULT_PROFILE])
"""The default engine profile's prices with the measured control loop: a node's cost until its
own profile or measurements say otherwise."""


@dataclass(frozen=True, slots=True)
class PrefillSample:
    """One scrape's cumulative prefill counters of a vLLM node (``/metrics``):
    ``vllm:request_prefill_time_seconds`` (``_sum``, ``_count``), ``vllm:prompt_tokens_total``
    and ``vllm:prefix_cache_hits_total`` (prompt tokens served from the cache)."""

    prefill_s: float
    requests: int
    prompt_tokens: int
    cached_tokens: int


@dataclass(slots=True)
class PrefillEstimator:
    """A node's prefill price from its own counters (docs/internals.md, "The cost of a node").

    Model: a request that computes ``n`` prompt tokens after ``c`` cached ones spends
    ``α·(b·n + f·n·(c + n/2))`` seconds in prefill, where ``b`` and ``f`` are the prior
    profile's terms and ``α`` the node's factor. Between two scrapes the counters give the
    requests ``R``, the computed tokens ``N`` (prompt minus cached) and the prompt tokens
    ``P``; the profile predicts ``T̂ = R·(b·n̄ + f·n̄·(c̄ + n̄/2))`` with ``n̄ = N/R``,
    ``c̄ = (P − N)/R``, and the node measured ``T``. The estimate is the ratio of sums with a
    prior, ``α = (W + ΣT) / (W + ΣT̂)``, where ``W`` = :attr:`prior_s` seconds of predicted
    prefill count as evidence for ``α = 1`` (the profile): it starts at the profile and
    converges to ``ΣT/ΣT̂`` as the node computes; each interval's sums are discounted by
    ``2^(−T̂/half_life_s)`` of the new evidence so the estimate follows a node that changes.
    A counter that goes backwards (engine restart) restarts the interval, keeping the sums.
    """

    prior: NodeCost
    prior_s: float = 2.0
    half_life_s: float = 600.0
    """Predicted prefill seconds after which old evidence counts half."""
    sum_measured: float = 0.0
    sum_predicted: float = 0.0
    observed_tokens: int = 0
    last: PrefillSample | None = field(default=None)

    def observe(self, sample: PrefillSample) -> None:
        """Take one scrape's counters."""
        last, self.last = self.last, sample
        if last is None:
            return
        d_s = sample.prefill_s - last.prefill_s
        d_r = sample.requests - last.requests
        d_p = sample.prompt_tokens - last.prompt_tokens
        d_c = sample.cached_tokens - last.cached_tokens
        if d_s < 0 or d_r < 0 or d_p < 0 or d_c < 0:
            return  # counters reset: the engine restarted; this scrape starts a new interval
        computed = d_p - d_c
        if d_r == 0 or computed <= 0 or d_s <= 0:
            return
        n = computed / d_r
        c = max(0.0, (d_p - computed) / d_r)
        predicted = d_r * (self.prior.prefill_s * n + self.prior.attn_s * n * (c + n / 2))
        if predicted <= 0:
            return
        keep = 2.0 ** (-predicted / self.half_life_s) if self.half_life_s > 0 else 1.0
        self.sum_measured = self.sum_measured * keep + d_s
        self.sum_predicted = self.sum_predicted * keep + predicted
        self.observed_tokens += computed

    @property
    def factor(self) -> float:
        """``α``: the node's prefill time over the prior profile's prediction."""
        return (self.prior_s + self.sum_measured) / (self.prior_s + self.sum_predicted)

    def cost(self) -> NodeCost:
        """The node's cost now: the prior's prefill terms × :attr:`factor`."""
        if self.observed_tokens == 0:
            return self.prior
        a = self.factor
        return self.prior.with_prefill(
            self.prior.prefill_s * a, self.prior.attn_s * a, "measured", self.observed_tokens
        )
