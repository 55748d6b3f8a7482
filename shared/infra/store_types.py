"""The state-store boundary: the ``StateStore`` Protocol and the records it returns.

Two implementations keep the same semantics: :class:`shared.infra.store.Store` (Redis, with
the atomic steps in Lua) and :class:`shared.infra.fake_store.FakeStore` (in memory, for service
tests). The same test bodies run against both (``tests/integration/test_store_*.py``).

What the store holds per scheduling domain (key layout: :mod:`shared.infra.keys`):

* sessions (:class:`shared.core.session.Session`), with the index sets ``pool`` (pooled ids)
  and ``admitted_tool`` (interrupt candidates) kept consistent with every write;
* nodes (:class:`NodeRecord`): telemetry's status fields plus ``reserved``, the sum of the
  weights of the sessions admitted there, kept consistent with every session write;
* residency: per (session, node) the resident prefix tokens ``k0`` observed at ``t_obs``, and
  the tokens of the session's context from its start in the node's host KV tier (``host``,
  vLLM's OffloadingConnector; 0 without one);
* chains: per session the block keys of its latest tokens (``block_size``, keys, stamp), kept
  by the telemetry service so that a restart of it can match them against the KV events again
  (a day's TTL, renewed on each write, bounds what sessions that never end leave behind);
* tool statistics (:class:`shared.core.predictor.History`);
* planner counters and recent solve times for ``tao status``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Final, Generic, NamedTuple, Protocol, TypeVar, cast

from shared.contracts.node import NodeStatus
from shared.core.nodecost import ControlLatency, CostSource, NodeCost
from shared.core.predictor import History, ToolStats, censor, update
from shared.core.session import Session
from shared.core.tick import Applied, Decision
from shared.core.valuation import NodeView, free_capacity
from shared.infra.keys import KeyNameError, StoreError, check_node_id

__all__ = [
    "CHAIN_TTL_S",
    "KEEP",
    "ChainsRead",
    "Folded",
    "Keep",
    "KeyNameError",
    "NodeRecord",
    "NodeUpdate",
    "PlannerReady",
    "SessionFn",
    "SessionFnWith",
    "StateStore",
    "StoreError",
    "check_finite",
    "check_new",
    "context_moves",
    "context_of",
    "fold_tools",
    "fold_updates",
    "merge_node",
    "no_value",
    "node_status_update",
]


T = TypeVar("T")
E = TypeVar("E")


class Keep(enum.Enum):
    """Marks a :meth:`StateStore.put_node_status` field that is left as stored."""

    KEEP = "keep"


KEEP: Final = Keep.KEEP

CHAIN_TTL_S: Final = 24 * 3600
"""How long a stored chain lives after its last write (the store's other session state is
deleted when the session is; a chain of a session that was never ended expires)."""


class ChainsRead(NamedTuple):
    """What :meth:`StateStore.chains` found: ``(sid, block_size, keys, stamp)`` per stored
    chain, and the ids whose stored chain could not be read (dropped)."""

    chains: list[tuple[str, int, list[int], float]]
    corrupt: list[str]


SessionFn = Callable[[Session | None], Session | None]
"""A pure transition for :meth:`StateStore.update_session`; it may be called several times."""

SessionFnWith = Callable[[Session | None], tuple[Session | None, T]]
"""A pure transition that also returns a value (:meth:`StateStore.update_session_with`)."""

Samples = Callable[[], Sequence[tuple[str, float, bool]]]
"""The tool samples ``(tool, duration, censored)`` a batch of transitions records in its own
transaction (:meth:`StateStore.update_sessions`): called after the run whose write wins."""


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A serving node as stored: telemetry's last status plus the live ``reserved`` total.

    ``models=None`` means the node serves any model. A node only known through a reservation
    (no status written yet) reads as unhealthy with capacity 0.
    """

    id: str
    url: str | None = None
    capacity_tokens: int = 0
    target_utilisation: float = 1.0
    reserved: int = 0
    healthy: bool = False
    models: frozenset[str] | None = None
    block_size: int = 16
    used_tokens: int = 0
    usage: float = 0.0
    running: int = 0
    waiting: int = 0
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
    updated_at: float = 0.0
    failures: int = 0
    contexts: int = 0
    """Σ tokens of the sessions admitted here and not ended (kept beside ``reserved`` by
    every session write, :func:`context_of`)."""
    held: int = 0
    """How many sessions ``contexts`` sums."""
    kv_since: float | None = None
    """The node's KV-event stream has been complete (no lost batch, restart or clear) since
    this time, as the telemetry service applied it; ``None``: no KV events (usage-based
    residency only)."""
    kv_until: float | None = None
    """... up to this time (its latest batch): residency observed on the node at or after
    ``kv_since`` is confirmed up to here (:func:`shared.core.decay.with_evidence`)."""
    prefill_s: float | None = None
    """The node's prefill seconds per recomputed token (telemetry's estimate from the node's
    own metrics, its nodes-file pin, or its profile's: ``cost_source``); ``None``: unknown."""
    attn_s: float | None = None
    """... and seconds per (recomputed token, context token) pair."""
    cost_tokens: int | None = None
    """Computed prompt tokens the measured price rests on."""
    cost_source: str = ""
    """``profile``, ``measured`` or ``pinned`` (empty: no price written)."""

    def cost(self, requeue_s: float | None = None) -> NodeCost | None:
        """The node's prices (its host tier's load rate is the valuation's to add), or
        ``None`` while telemetry has written none."""
        if self.prefill_s is None or self.attn_s is None:
            return None
        source = self.cost_source if self.cost_source in COST_SOURCES else "profile"
        if requeue_s is None:
            requeue_s = CONTROL_ROUND_TRIP_S
        return NodeCost(
            self.prefill_s,
            self.attn_s,
            requeue_s,
            0.0,
            cast(CostSource, source),
            self.cost_tokens or 0,
        )

    @property
    def evidence(self) -> tuple[float, float] | None:
        """``(kv_since, kv_until)`` when both are known."""
        if self.kv_since is None or self.kv_until is None:
            return None
        return self.kv_since, self.kv_until

    @property
    def usable(self) -> int:
        """``floor(capacity × target)``: the most the planner may reserve here, empty."""
        return free_capacity(self.capacity_tokens, self.target_utilisation, ())

    @property
    def free(self) -> int:
        """``max(0, usable - reserved)`` when healthy, else 0."""
        return max(0, self.usable - self.reserved) if self.healthy else 0

    def view(self) -> NodeView:
        """What the valuation reads."""
        return NodeView(
            id=self.id,
            capacity_tokens=self.capacity_tokens,
            target_utilisation=self.target_utilisation,
            reserved=self.reserved,
            healthy=self.healthy,
            models=self.models,
            running=self.running,
            contexts=self.contexts,
            held=self.held,
            used=self.used_tokens,
            waiting=self.waiting,
            cost=self.cost(),
        )


_INTS: Final = (
    "capacity_tokens",
    "block_size",
    "used_tokens",
    "running",
    "waiting",
    "failures",
)
_OPT_INTS: Final = ("prefix_cache_queries", "prefix_cache_hits", "cost_tokens")
_FLOATS: Final = ("usage", "updated_at")
_OPT_FLOATS: Final = ("kv_since", "kv_until", "prefill_s", "attn_s")
COST_SOURCES: Final = frozenset({"profile", "measured", "pinned"})
CONTROL_ROUND_TRIP_S: Final = ControlLatency().round_trip_s
"""The control loop's measured round trip (:class:`shared.core.nodecost.ControlLatency`): a
live node's requeue price."""


def _bad(name: str, value: object, problem: str) -> StoreError:
    return StoreError(f"node status {name}: {problem}, got {value!r}")


def check_new(sid: str, new: Session) -> None:
    """Refuse a transition result that cannot be stored under ``sid``."""
    if new.id != sid:
        raise StoreError(f"update_session({sid!r}): fn returned id {new.id!r}")
    if new.node is not None:
        check_node_id(new.node)


def check_finite(s: Session) -> None:
    """Refuse a record with a non-finite time (what the hash encoding refuses)."""
    for name, x in (
        ("created_at", s.created_at),
        ("updated_at", s.updated_at),
        ("probe_mark", s.probe_mark),
    ):
        if x is not None and not math.isfinite(x):
            raise StoreError(f"{name}: must be finite, got {x!r}")


def no_value(fn: SessionFn) -> SessionFnWith[None]:
    """``fn`` as a transition that returns no value (``update_session`` over ``..._with``)."""
    return lambda s: (fn(s), None)


def context_of(s: Session | None) -> tuple[str, int] | None:
    """``(node, tokens)`` when ``s`` holds a context on a node (admitted, not ended): what
    the node's ``contexts`` / ``held`` totals count."""
    if s is None or s.node is None or s.ended:
        return None
    return s.node, s.tokens


def context_moves(old: Session | None, new: Session | None) -> list[tuple[str, int, int]]:
    """``(node, tokens delta, held delta)`` moves of the context totals for ``old -> new``
    (none when what it holds did not change)."""
    a, b = context_of(old), context_of(new)
    if a == b:
        return []
    out: list[tuple[str, int, int]] = []
    if a is not None:
        out.append((a[0], -a[1], -1))
    if b is not None:
        out.append((b[0], b[1], 1))
    return out


@dataclass(slots=True)
class Folded(Generic[E]):
    """What a batch of session transitions does (:func:`fold_updates`): per written session
    its final record and ``encode(final)``, per node the net ``reserved`` change (0 for a
    node a step touched and another step restored, so the node's hash exists as after the
    single updates) and the net ``[contexts, held]`` change (likewise)."""

    writes: dict[str, tuple[Session, E]]
    reserved: dict[str, int]
    contexts: dict[str, list[int]] = field(default_factory=dict)


def _same(new: Session, old: Session) -> bool:
    """``new == old``, without building both records' field tuples when the versions differ
    (every transition that changes a record bumps its version)."""
    return new.version == old.version and new == old


def fold_updates(
    updates: Sequence[tuple[str, SessionFnWith[T]]],
    stored: Mapping[str, Session | None],
    encode: Callable[[Session], E],
) -> tuple[list[tuple[Session | None, T]], Folded[E]]:
    """Apply ``updates`` in order on ``stored`` (every touched id -> its record or None), as
    the single :meth:`StateStore.update_session_with` calls would one after the other: each fn
    sees the record left by the previous fn on its id; None or an equal record writes nothing.
    Every written record is validated (:func:`check_new`, :func:`check_finite`) as the single
    form does, so one bad result refuses the whole batch; several updates of one id are
    written (and encoded) once, as their last record. Returns ``(stored record, value)`` per
    update and what to write."""
    cur = dict(stored)
    results: list[tuple[Session | None, T]] = []
    finals: dict[str, Session] = {}
    reserved: dict[str, int] = {}
    contexts: dict[str, list[int]] = {}
    for sid, fn in updates:
        old = cur[sid]
        new, extra = fn(old)
        if new is None or new is old or (old is not None and _same(new, old)):
            results.append((old, extra))
            continue
        check_new(sid, new)
        check_finite(new)  # what encode refuses; only each id's last record is encoded
        finals[sid] = new
        if old is None or old.node != new.node or old.weight != new.weight:
            if old is not None and old.node is not None and old.weight:
                reserved[old.node] = reserved.get(old.node, 0) - old.weight
            if new.node is not None and new.weight:
                reserved[new.node] = reserved.get(new.node, 0) + new.weight
        for node, tokens, held in context_moves(old, new):
            total = contexts.setdefault(node, [0, 0])
            total[0] += tokens
            total[1] += held
        cur[sid] = new
        results.append((new, extra))
    writes = {sid: (new, encode(new)) for sid, new in finals.items()}
    return results, Folded(writes, reserved, contexts)


def fold_tools(
    items: Sequence[tuple[str, float, bool]],
    tools: Mapping[str, ToolStats],
    overall: ToolStats,
) -> tuple[dict[str, ToolStats], ToolStats]:
    """``(tool, duration, censored)`` samples folded in order into the touched tools'
    statistics (``tools`` holds each touched tool's current value) and the global aggregate,
    with :func:`shared.core.predictor.update` / :func:`~shared.core.predictor.censor`
    exactly as repeated single records would. Raises ValueError on a bad duration."""
    out = dict(tools)
    for tool, duration, censored in items:
        step = censor if censored else update
        out[tool] = step(out[tool], duration)
        overall = step(overall, duration)
    return out, overall


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUpdate:
    """Telemetry's change to a node's record (:meth:`StateStore.put_node_status`): a field left
    at :data:`KEEP` stays as stored. ``reserved`` is not among them: only ``apply`` moves it.
    The values are checked when the update is merged (:func:`merge_node`)."""

    url: str | Keep | None = KEEP
    capacity_tokens: int | Keep = KEEP
    target_utilisation: float | Keep = KEEP
    healthy: bool | Keep = KEEP
    models: Iterable[str] | Keep | None = KEEP
    """None: serves any model."""
    block_size: int | Keep = KEEP
    used_tokens: int | Keep = KEEP
    usage: float | Keep = KEEP
    running: int | Keep = KEEP
    waiting: int | Keep = KEEP
    prefix_cache_queries: int | Keep | None = KEEP
    prefix_cache_hits: int | Keep | None = KEEP
    updated_at: float | Keep = KEEP
    failures: int | Keep = KEEP
    kv_since: float | Keep | None = KEEP
    kv_until: float | Keep | None = KEEP
    prefill_s: float | Keep | None = KEEP
    attn_s: float | Keep | None = KEEP
    cost_tokens: int | Keep | None = KEEP
    cost_source: str | Keep = KEEP

    def given(self) -> dict[str, object]:
        """The fields that change, by name."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not KEEP:
                out[f.name] = value
        return out


def node_status_update(status: NodeStatus, target_utilisation: float, failures: int) -> NodeUpdate:
    """The :meth:`StateStore.put_node_status` update of a telemetry ``NodeStatus`` (empty model
    list = serves any model; ``url`` is kept when the message has none)."""
    return NodeUpdate(
        url=status.url if status.url is not None else KEEP,
        capacity_tokens=status.capacity_tokens,
        target_utilisation=target_utilisation,
        healthy=status.healthy,
        models=frozenset(status.models) if status.models else None,
        block_size=status.block_size,
        used_tokens=status.used_tokens,
        usage=status.usage,
        running=status.running,
        waiting=status.waiting,
        prefix_cache_queries=status.prefix_cache_queries,
        prefix_cache_hits=status.prefix_cache_hits,
        updated_at=status.ts,
        failures=failures,
    )


def merge_node(old: NodeRecord, update: NodeUpdate) -> NodeRecord:
    """``old`` with telemetry's ``update`` (each value checked: :class:`StoreError` names a bad
    one)."""
    changes: dict[str, object] = {}
    for name, value in update.given().items():
        if name in _INTS or name in _OPT_INTS:
            if value is None and name in _OPT_INTS:
                changes[name] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise _bad(name, value, "must be an integer >= 0")
        elif name in _FLOATS or name in _OPT_FLOATS:
            if value is None and name in _OPT_FLOATS:
                changes[name] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _bad(name, value, "must be a number")
            if not math.isfinite(value):
                raise _bad(name, value, "must be finite")
            value = float(value)
        elif name == "target_utilisation":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            if not ok or not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
                raise _bad(name, value, "must be a number in [0, 1]")
            value = float(value)  # type: ignore[arg-type]
        elif name == "healthy":
            if not isinstance(value, bool):
                raise _bad(name, value, "must be a bool")
        elif name == "url":
            if value is not None and not isinstance(value, str):
                raise _bad(name, value, "must be a string or None")
            value = value or None
        elif name == "models":
            if value is not None:
                if isinstance(value, str) or not isinstance(value, Iterable):
                    raise _bad(name, value, "must be a collection of model names or None")
                value = frozenset(value)
                if not all(isinstance(m, str) for m in value):
                    raise _bad(name, value, "must hold strings")
        elif name == "cost_source":
            if value not in COST_SOURCES:
                raise _bad(name, value, f"must be one of {sorted(COST_SOURCES)}")
        else:
            raise _bad(name, value, "is not a node status field")
        changes[name] = value
    return replace(old, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class PlannerReady:
    """The planner's readiness record (``tao:{domain}:ready``): the replica that plans the
    domain (``instance``, lease ``epoch``, 0 without election) has its kernels loaded
    (``warm_ms`` to load them), has subscribed to the snapshots and, under a lease, fenced the
    domain, since ``since``; it re-writes the record every beat (``beat_at``), and it lapses
    ``ttl_s`` after the last beat (Redis expires it). ``rounds``: plan rounds it ran since it
    started, ``tick``: the last one's valuation tick (0: none yet). The gateway's ``/readyz``
    reads it."""

    instance: str
    epoch: int
    warm_ms: float
    since: float
    beat_at: float
    ttl_s: float
    rounds: int = 0
    tick: int = 0

    def fresh(self, now: float) -> bool:
        """Whether the planner beat within ``ttl_s`` of ``now``."""
        return now - self.beat_at <= self.ttl_s

    def as_hash(self) -> dict[str, str]:
        """The record as hash fields (numbers as ``repr``: floats round-trip exactly)."""
        out = {f.name: repr(getattr(self, f.name)) for f in fields(self)}
        out["instance"] = self.instance
        return out

    @classmethod
    def from_hash(cls, raw: Mapping[str, str]) -> PlannerReady | None:
        """The record of :meth:`as_hash`; ``None`` when a field is missing or unreadable."""
        try:
            return cls(
                instance=raw["instance"],
                epoch=int(raw["epoch"]),
                warm_ms=float(raw["warm_ms"]),
                since=float(raw["since"]),
                beat_at=float(raw["beat_at"]),
                ttl_s=float(raw["ttl_s"]),
                rounds=int(raw.get("rounds", "0")),
                tick=int(raw.get("tick", "0")),
            )
        except (KeyError, ValueError):
            return None


class StateStore(Protocol):
    """The scheduler's shared state (module docstring); every method is a coroutine."""

    domain: str

    # sessions
    async def get_session(self, sid: str) -> Session | None: ...
    async def sessions(self, ids: Iterable[str] | None = None) -> list[Session]: ...
    async def session_ids(self) -> set[str]: ...
    async def pool_ids(self) -> set[str]: ...
    async def admitted_tool_ids(self) -> set[str]: ...
    async def update_session(self, sid: str, fn: SessionFn) -> Session | None: ...
    async def update_session_with(
        self, sid: str, fn: Callable[[Session | None], tuple[Session | None, T]]
    ) -> tuple[Session | None, T]: ...
    async def update_sessions(
        self, updates: Sequence[tuple[str, SessionFn]], *, record: Samples | None = None
    ) -> list[Session | None]: ...
    async def update_sessions_with(
        self, updates: Sequence[tuple[str, SessionFnWith[T]]], *, record: Samples | None = None
    ) -> list[tuple[Session | None, T]]: ...
    async def put_probe_marks(
        self, marks: Mapping[str, float | None], versions: Mapping[str, int] | None = None
    ) -> int: ...
    async def delete_session(self, sid: str) -> bool: ...

    # nodes
    async def put_node_status(self, node: str, update: NodeUpdate) -> NodeRecord: ...
    async def put_node_status_msg(
        self, status: NodeStatus, *, target_utilisation: float, failures: int = 0
    ) -> NodeRecord: ...
    async def get_node(self, node: str) -> NodeRecord | None: ...
    async def nodes(self) -> list[NodeRecord]: ...
    async def node_views(self) -> list[NodeView]: ...
    async def delete_node(self, node: str) -> bool: ...

    # residency
    async def put_residency(self, sid: str, node: str, k0: int, t_obs: float) -> None: ...
    async def put_residencies(self, items: Iterable[tuple[str, str, int, float]]) -> None: ...
    async def put_tiered_residencies(
        self, items: Iterable[tuple[str, str, int, float, int]]
    ) -> None: ...
    async def residency(self, sids: Iterable[str]) -> dict[str, dict[str, tuple[int, float]]]: ...
    async def host_residency(self, sids: Iterable[str]) -> dict[str, dict[str, int]]: ...
    async def clear_node_residency(self, node: str) -> None: ...

    # block-key chains (the telemetry service's, kept across its restarts)
    async def put_chains(self, items: Iterable[tuple[str, int, Sequence[int], float]]) -> None: ...
    async def chains(self) -> ChainsRead: ...
    async def drop_chains(self, sids: Iterable[str]) -> None: ...

    # tool statistics
    async def record_tool(self, tool: str, duration: float, *, censored: bool = False) -> None: ...
    async def record_tools(self, items: Sequence[tuple[str, float, bool]]) -> None: ...
    async def history(self) -> History: ...

    # apply and counters
    async def apply(self, decision: Decision, at: float, *, epoch: int = 0) -> Applied: ...
    async def rebuild_contexts(self) -> int: ...
    async def fence(self, epoch: int) -> bool: ...
    async def incr(self, **counts: int) -> None: ...
    async def record_solve(
        self, ms: float, method: str, exact: bool, *, fallback: bool | None = None
    ) -> None: ...
    async def planner_stats(self) -> dict[str, object]: ...
    async def put_planner_ready(self, record: PlannerReady) -> None: ...
    async def planner_ready(self) -> PlannerReady | None: ...
    async def status(self) -> dict[str, object]: ...
    async def clear(self) -> int: ...
