"""The tools service: keeps the session records' lifecycle from session and tool events.

Durable JetStream consumers (service name ``tools``) on ``TAO_V1_SESSION`` and ``TAO_V1_TOOL``
(and ``TAO_V1_HOOK``: harness hook payloads, mapped to tool events by :mod:`.hooks`),
so a restarted process resumes where it stopped; a payload that does not decode is dead-lettered
by the bus and the consumer goes on. Before it consumes, the shared-prefix registry
(:mod:`shared.core.sharedprefix`) registers the block-key chains the telemetry service stored,
under each session's model, so that a restart does not take the sessions' shared prefixes back
to 0. Run: ``python -m services.tools`` (needs NATS and Redis).
"""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from services._common import serve_forever, store_from
from services.tools.handlers import ToolsHandlers
from services.tools.hooks import HookIngest, decode_hook
from shared.contracts import subjects
from shared.contracts.codec import decode_session_event, decode_tool_event
from shared.contracts.session import SessionEvent
from shared.contracts.tool import ToolEvent
from shared.core.policies import get_policy
from shared.core.rules import RuleSet
from shared.core.sharedprefix import SharedPrefixes
from shared.core.tick import policy_rules
from shared.infra.busapi import MessageBus, Subscription
from shared.infra.logging import get_logger
from shared.infra.runner import ServiceContext
from shared.infra.settings import Settings
from shared.infra.shard import ONE, Shard
from shared.infra.store_types import StateStore

__all__ = ["NAME", "decode_session", "decode_tool", "main", "restore_prefixes", "start"]

NAME = "tools"


def decode_session(data: bytes) -> SessionEvent:
    """A session event whose session id can name a record (else a ContractError: DLQ)."""
    ev = decode_session_event(data)
    subjects.escape_token(ev.session_id)
    return ev


def decode_tool(data: bytes) -> ToolEvent:
    """A tool event whose session id can name a record (else a ContractError: DLQ)."""
    ev = decode_tool_event(data)
    subjects.escape_token(ev.session_id)
    return ev


async def restore_prefixes(
    store: StateStore, prefixes: SharedPrefixes, log: FilteringBoundLogger
) -> int:
    """Register the stored chains of the live sessions in ``prefixes`` (each under its
    record's model); how many. A store that cannot be read is logged: the registry then fills
    from the next responses."""
    try:
        found = await store.chains()
        ids = [sid for sid, *_ in found.chains]
        records = {s.id: s for s in await store.sessions(ids)} if ids else {}
    except Exception as exc:
        log.error("shared_prefix_restore_failed", error=f"{type(exc).__name__}: {exc}")
        return 0
    n = 0
    for sid, block_size, keys, stamp in found.chains:
        rec = records.get(sid)
        if rec is None or rec.ended:
            continue
        try:
            prefixes.observe(sid, keys, block_size, rec.model, stamp)
        except ValueError:
            continue
        n += 1
    prefixes.take_touched()  # the records hold what the last process wrote
    log.info("shared_prefix_restored", sessions=n, keys=prefixes.keys)
    return n


async def start(
    store: StateStore,
    bus: MessageBus,
    *,
    name: str = NAME,
    reserve: int | None = 512,
    rules: RuleSet | None = None,
    shard: Shard = ONE,
    prefixes: SharedPrefixes | None = None,
) -> tuple[ToolsHandlers, list[Subscription]]:
    """Start both consumers; returns the handlers and the subscriptions (to stop them).
    ``reserve`` is ``TAO_RESERVE_TOKENS`` (``None``: admitted weights are never re-weighed);
    ``rules`` the policy's (its growth rule sets the reserve from each session's history);
    ``shard`` this process's share of the sessions (``TAO_SHARD``; its own durables);
    ``prefixes`` the shared-prefix registry (default: a new one with the default bounds,
    restored from the stored chains)."""
    log = get_logger(name)
    if prefixes is None:
        prefixes = SharedPrefixes()
        await restore_prefixes(store, prefixes, log)
    h = ToolsHandlers(
        store=store,
        bus=bus,
        log=log,
        reserve=reserve,
        rules=rules,
        shard=shard,
        prefixes=prefixes,
    )
    member = shard.member(name)
    hooks = HookIngest(h, bus, log, service=member, shard=shard)
    subs = [
        await bus.consume_batch(
            subjects.STREAM_SESSION, member, decode_session, h.on_session_batch
        ),
        await bus.consume_batch(subjects.STREAM_TOOL, member, decode_tool, h.on_tool_batch),
        await bus.consume_batch(subjects.STREAM_HOOK, member, decode_hook, hooks.on_hook_batch),
    ]
    return h, subs


async def main(settings: Settings, ctx: ServiceContext) -> None:
    """Service entry point for the runner."""
    store = store_from(settings, ctx, cache=True)
    rules = policy_rules(get_policy(settings.policy))
    await start(
        store,
        ctx.require_bus(),
        name=ctx.name,
        reserve=settings.reserve_tokens,
        rules=rules,
        shard=settings.shard,
    )
    await serve_forever()
