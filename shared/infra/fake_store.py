"""In-memory :class:`~shared.infra.store_types.StateStore` for service tests (STYLE rule 11).

Same semantics as :class:`shared.infra.store.Store`; the same test bodies run against both
(``tests/integration/test_store_*.py``). Each method runs without awaiting in between, so on
one event loop every call is atomic, as the Redis transactions and scripts are. ``apply`` calls
:func:`shared.core.tick.apply_decision` itself, the reference the Lua script mirrors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

import msgspec

from shared.contracts.node import NodeStatus
from shared.core.predictor import History, ToolStats, censor, update
from shared.core.session import Session
from shared.core.tick import Applied, Decision, apply_decision, live_free
from shared.core.valuation import NodeView
from shared.infra.keys import (
    SOLVE_SAMPLES,
    Keys,
    check_node_id,
    check_session_id,
    tool_field,
)
from shared.infra.store_codec import encode_chain, encode_session, read_chain
from shared.infra.store_stats import planner_stats_from, status_dict
from shared.infra.store_types import (
    ChainsRead,
    NodeRecord,
    NodeUpdate,
    PlannerReady,
    Samples,
    SessionFn,
    SessionFnWith,
    check_new,
    context_of,
    fold_tools,
    fold_updates,
    merge_node,
    no_value,
    node_status_update,
)

__all__ = ["FakeStore"]

T = TypeVar("T")


class FakeStore:
    """Dict-backed state store for one scheduling domain."""

    def __init__(self, domain: str = "default") -> None:
        self.keys = Keys(domain)
        self.domain = self.keys.domain
        self._reset()

    def _reset(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._status: dict[str, NodeRecord] = {}
        self._reserved: dict[str, int] = {}
        self._residency: dict[str, dict[str, tuple[int, float, int]]] = {}  # k0, t_obs, host
        self._chains: dict[str, str] = {}  # sid -> encoded chain (no TTL here)
        self._tools: dict[str, ToolStats] = {}
        self._overall = ToolStats()
        self._ready: PlannerReady | None = None
        self._counters: dict[str, int] = {}
        self._solve_ms: list[float] = []

    # --- sessions ---------------------------------------------------------------------------

    async def get_session(self, sid: str) -> Session | None:
        check_session_id(sid)
        return self._sessions.get(sid)

    async def sessions(self, ids: Iterable[str] | None = None) -> list[Session]:
        if ids is None:
            return [self._sessions[i] for i in sorted(self._sessions)]
        wanted = list(ids)
        for i in wanted:
            check_session_id(i)
        return [self._sessions[i] for i in wanted if i in self._sessions]

    async def session_ids(self) -> set[str]:
        return set(self._sessions)

    async def pool_ids(self) -> set[str]:
        return {i for i, s in self._sessions.items() if s.pooled}

    async def admitted_tool_ids(self) -> set[str]:
        return {i for i, s in self._sessions.items() if s.node is not None and s.activity == "tool"}

    def _write(self, sid: str, old: Session | None, new: Session | None) -> None:
        if old is not None and old.node is not None and old.weight:
            self._reserved[old.node] = self._reserved.get(old.node, 0) - old.weight
        if new is not None and new.node is not None and new.weight:
            self._reserved[new.node] = self._reserved.get(new.node, 0) + new.weight
        if new is None:
            self._sessions.pop(sid, None)
        else:
            self._sessions[sid] = new

    async def update_session(self, sid: str, fn: SessionFn) -> Session | None:
        stored, _ = await self.update_session_with(sid, no_value(fn))
        return stored

    async def update_session_with(
        self, sid: str, fn: Callable[[Session | None], tuple[Session | None, T]]
    ) -> tuple[Session | None, T]:
        check_session_id(sid)
        old = self._sessions.get(sid)
        new, extra = fn(old)
        if new is None or new == old:
            return old, extra
        check_new(sid, new)
        encode_session(new)  # the same validation (finite floats) as the real store
        self._write(sid, old, new)
        return new, extra

    async def update_sessions(
        self, updates: Sequence[tuple[str, SessionFn]], *, record: Samples | None = None
    ) -> list[Session | None]:
        pairs = [(sid, no_value(fn)) for sid, fn in updates]
        return [stored for stored, _ in await self.update_sessions_with(pairs, record=record)]

    async def update_sessions_with(
        self, updates: Sequence[tuple[str, SessionFnWith[T]]], *, record: Samples | None = None
    ) -> list[tuple[Session | None, T]]:
        stored = {sid: self._sessions.get(sid) for sid, _ in updates}
        for sid in stored:
            check_session_id(sid)
        results, folded = fold_updates(updates, stored, encode_session)
        samples = [] if record is None else list(record())
        tools, overall = self._folded_tools(samples)  # validates before anything is written
        for sid, (new, _) in folded.writes.items():
            self._sessions[sid] = new
        for node, delta in folded.reserved.items():
            self._reserved[node] = self._reserved.get(node, 0) + delta
        self._tools.update(tools)
        self._overall = overall
        return results

    async def put_probe_marks(
        self, marks: Mapping[str, float | None], versions: Mapping[str, int] | None = None
    ) -> int:
        written = 0
        for sid, mark in marks.items():
            check_session_id(sid)
            s = self._sessions.get(sid)
            want = None if versions is None else versions.get(sid)
            if s is None or (want is not None and s.version != want):
                continue
            self._sessions[sid] = msgspec.structs.replace(
                s, probe_mark=None if mark is None else float(mark)
            )
            written += 1
        return written

    async def delete_session(self, sid: str) -> bool:
        check_session_id(sid)
        old = self._sessions.get(sid)
        self._write(sid, old, None)
        self._residency.pop(sid, None)
        self._chains.pop(sid, None)
        return old is not None

    # --- nodes ------------------------------------------------------------------------------

    async def put_node_status(self, node: str, update: NodeUpdate) -> NodeRecord:
        check_node_id(node)
        rec = merge_node(self._status.get(node) or NodeRecord(id=node), update)
        rec.usable  # noqa: B018 - validates capacity × target like the real store's encoding
        self._status[node] = rec
        return self._with_reserved(rec)

    async def put_node_status_msg(
        self, status: NodeStatus, *, target_utilisation: float, failures: int = 0
    ) -> NodeRecord:
        return await self.put_node_status(
            status.node_id, node_status_update(status, target_utilisation, failures)
        )

    def _contexts(self) -> dict[str, tuple[int, int]]:
        """Per node, Σ tokens and count of the sessions holding a context there, counted from
        the records themselves (the Redis store keeps them as running totals)."""
        out: dict[str, tuple[int, int]] = {}
        for s in self._sessions.values():
            held = context_of(s)
            if held is not None:
                tokens, n = out.get(held[0], (0, 0))
                out[held[0]] = (tokens + held[1], n + 1)
        return out

    def _with_reserved(
        self, rec: NodeRecord, counts: dict[str, tuple[int, int]] | None = None
    ) -> NodeRecord:
        """``rec`` with the live ``reserved`` and context totals (``counts``: the
        :meth:`_contexts` of this read, counted once for many records)."""
        tokens, held = (self._contexts() if counts is None else counts).get(rec.id, (0, 0))
        return replace(rec, reserved=self._reserved.get(rec.id, 0), contexts=tokens, held=held)

    async def get_node(self, node: str) -> NodeRecord | None:
        check_node_id(node)
        counts = self._contexts()
        rec = self._status.get(node)
        if rec is None:
            if node not in self._reserved and node not in counts:
                return None
            rec = NodeRecord(id=node)
        return self._with_reserved(rec, counts)

    async def nodes(self) -> list[NodeRecord]:
        counts = self._contexts()
        return [self._with_reserved(self._status[n], counts) for n in sorted(self._status)]

    async def node_views(self) -> list[NodeView]:
        return [rec.view() for rec in await self.nodes()]

    async def delete_node(self, node: str) -> bool:
        check_node_id(node)
        return self._status.pop(node, None) is not None

    # --- residency --------------------------------------------------------------------------

    async def put_residency(self, sid: str, node: str, k0: int, t_obs: float) -> None:
        await self.put_residencies(((sid, node, k0, t_obs),))

    async def put_residencies(self, items: Iterable[tuple[str, str, int, float]]) -> None:
        await self.put_tiered_residencies((sid, node, k0, t, 0) for sid, node, k0, t in items)

    async def put_tiered_residencies(
        self, items: Iterable[tuple[str, str, int, float, int]]
    ) -> None:
        for sid, node, k0, t_obs, host in items:
            check_session_id(sid)
            check_node_id(node)
            per = self._residency.setdefault(sid, {})
            if k0 > 0 or host > 0:
                per[node] = (max(0, int(k0)), float(t_obs), int(host) if host > 0 else 0)
            else:
                per.pop(node, None)
            if not per:
                del self._residency[sid]

    async def residency(self, sids: Iterable[str]) -> dict[str, dict[str, tuple[int, float]]]:
        out: dict[str, dict[str, tuple[int, float]]] = {}
        for sid in sids:
            check_session_id(sid)
            per = self._residency.get(sid, {})
            out[sid] = {node: (k0, t) for node, (k0, t, _) in per.items() if k0 > 0}
        return out

    async def host_residency(self, sids: Iterable[str]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for sid in sids:
            check_session_id(sid)
            per = {node: h for node, (_, _, h) in self._residency.get(sid, {}).items() if h > 0}
            if per:
                out[sid] = per
        return out

    async def clear_node_residency(self, node: str) -> None:
        check_node_id(node)
        for sid in list(self._residency):
            per = self._residency[sid]
            per.pop(node, None)
            if not per:
                del self._residency[sid]

    # --- chains -----------------------------------------------------------------------------

    async def put_chains(self, items: Iterable[tuple[str, int, Sequence[int], float]]) -> None:
        encoded: dict[str, str] = {}
        for sid, block_size, keys, stamp in items:
            check_session_id(sid)
            encoded[sid] = encode_chain(block_size, keys, stamp)
        self._chains.update(encoded)  # all or nothing, as the Redis pipeline

    async def chains(self) -> ChainsRead:
        found: list[tuple[str, int, list[int], float]] = []
        corrupt: list[str] = []
        for sid in sorted(self._chains):
            entry = read_chain(sid, self._chains[sid])
            if entry is None:
                corrupt.append(sid)
                del self._chains[sid]
            else:
                found.append(entry)
        return ChainsRead(found, corrupt)

    async def drop_chains(self, sids: Iterable[str]) -> None:
        wanted = list(sids)
        for sid in wanted:  # all checked first: a bad id drops nothing, as in Redis
            check_session_id(sid)
        for sid in wanted:
            self._chains.pop(sid, None)

    # --- tool statistics --------------------------------------------------------------------

    async def record_tool(self, tool: str, duration: float, *, censored: bool = False) -> None:
        tool_field(tool)
        step = censor if censored else update
        own = step(self._tools.get(tool, ToolStats()), duration)
        self._overall = step(self._overall, duration)
        self._tools[tool] = own

    async def record_tools(self, items: Sequence[tuple[str, float, bool]]) -> None:
        tools, self._overall = self._folded_tools(items)
        self._tools.update(tools)

    def _folded_tools(
        self, items: Sequence[tuple[str, float, bool]]
    ) -> tuple[dict[str, ToolStats], ToolStats]:
        names = list(dict.fromkeys(tool for tool, _, _ in items))
        for tool in names:
            tool_field(tool)
        return fold_tools(items, {t: self._tools.get(t, ToolStats()) for t in names}, self._overall)

    async def history(self) -> History:
        return History(tools=dict(self._tools), overall=self._overall)

    # --- apply ------------------------------------------------------------------------------

    async def apply(self, decision: Decision, at: float, *, epoch: int = 0) -> Applied:
        moves = (*decision.interrupts, *decision.admits)
        if not moves:
            return Applied(discarded=False)
        for m in moves:
            check_session_id(m.session)
            check_node_id(m.node)
        if epoch > 0:
            if epoch < self._counters.get("epoch", 0):
                self._count("plans_fenced", 1)
                return Applied(discarded=True, fenced=True)
            self._counters["epoch"] = epoch
        live = {m.session: self._sessions[m.session] for m in moves if m.session in self._sessions}
        views = await self.node_views()
        applied = apply_decision(decision, live, live_free(views), at, nodes=views)
        if applied.discarded:
            self._count("plans_discarded", 1)
            return applied
        for sid, new in applied.sessions.items():
            self._write(sid, live[sid], new)
        self._count("plans_applied", 1)
        self._count("sessions_admitted", len(applied.admitted))
        self._count("sessions_interrupted", len(applied.interrupted))
        if applied.truncated:
            self._count("plans_truncated", 1)
        return applied

    async def rebuild_contexts(self) -> int:
        """The totals are counted from the records on every read here: nothing to rebuild."""
        return sum(n for _, n in self._contexts().values())

    async def fence(self, epoch: int) -> bool:
        if epoch < self._counters.get("epoch", 0):
            return False
        self._counters["epoch"] = int(epoch)
        return True

    # --- counters and status ----------------------------------------------------------------

    def _count(self, name: str, n: int) -> None:
        self._counters[name] = self._counters.get(name, 0) + int(n)

    async def incr(self, **counts: int) -> None:
        for name, n in counts.items():
            self._count(name, n)

    async def record_solve(
        self, ms: float, method: str, exact: bool, *, fallback: bool | None = None
    ) -> None:
        self._solve_ms.insert(0, float(ms))
        del self._solve_ms[SOLVE_SAMPLES:]
        self._count("solves", 1)
        if exact:
            self._count("solves_exact", 1)
        if (not exact) if fallback is None else fallback:
            self._count("fallbacks", 1)
        self._count(f"method:{method}", 1)

    async def planner_stats(self) -> dict[str, object]:
        return planner_stats_from(self._counters, self._solve_ms)

    async def put_planner_ready(self, record: PlannerReady) -> None:
        self._ready = record  # no expiry here: readers check PlannerReady.fresh

    async def planner_ready(self) -> PlannerReady | None:
        return self._ready

    async def status(self) -> dict[str, object]:
        return status_dict(
            self.domain, await self.nodes(), await self.sessions(), await self.planner_stats()
        )

    async def clear(self) -> int:
        n = len(self._sessions) + len(self._status) + len(self._residency) + len(self._chains)
        self._reset()
        return n
