"""Hook ingestion: harness hook payloads on ``tao.v1.hook.<harness>`` → tool and session events.

The hook process (``tao hook claude``), the gateway (``POST /hooks/<harness>``), plugins and
wrappers forward a harness's hook payload unparsed, with its receive time in the
``Tao-Received-At`` header (:mod:`shared.harness.base`). A durable consumer of
``TAO_V1_HOOK`` (all harnesses) reads them in stream order:

1. decode (by the bus): a marker of an oversized payload, more than ``MAX_HOOK_BYTES``, bytes
   that are not JSON (a truncated payload) or JSON that is not an object raise a
   :class:`~shared.contracts.errors.DecodeError`, which the bus dead-letters at once;
2. map: the harness (the subject's last token) picks its mapper (:mod:`shared.harness.registry`,
   one instance per harness, kept for its state), which turns the payload into messages at
   the receive time (header; else when the bus delivered it). A payload it cannot read
   (missing or wrongly typed field, unknown harness, a session id that cannot name a record)
   is dead-lettered here with the mapper's reason, and the batch goes on;
3. the tool events go through the tools service's own path
   (:meth:`ToolsHandlers.on_tool_batch`, as if they had come on ``tao.v1.tool.*``); a
   :class:`SessionEnd` is published on the session stream, where the gateway's go, so the
   tools service ends the record and the gateway forgets the session's placement;
4. one log line per batch.

A payload the gateway forwarded with a tenant (``Tao-Tenant`` header: posted with that
tenant's hook token, :mod:`services.gateway.auth`) names that tenant's sessions: every message
it maps to has its session id qualified (``<tenant>:<id>``), as the gateway serves them.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson
from structlog.typing import FilteringBoundLogger

from services.tools.handlers import ToolsHandlers
from shared.contracts import subjects
from shared.contracts.base import Message
from shared.contracts.errors import ContractError, DecodeError
from shared.contracts.session import SessionEnd
from shared.contracts.tool import ToolEnd, ToolEvent, ToolProgress, ToolStart
from shared.harness.base import MAX_HOOK_BYTES, HookMapper
from shared.harness.hookclient import OVERSIZED_MARKER
from shared.harness.registry import UnknownHarnessError, mapper_for
from shared.infra.busapi import Delivery, MessageBus, dead_letter_for, received_at
from shared.infra.shard import ONE, Shard
from shared.infra.tenants import TENANT_HEADER, qualify, valid_name

__all__ = ["HookIngest", "HookPayload", "decode_hook", "received_at"]

_TARGET = "hook payload"


@dataclass(frozen=True, slots=True)
class HookPayload:
    """A decoded hook payload: the JSON object and the bytes it came from (for dead letters)."""

    body: dict[str, Any]
    data: bytes


def _kind(value: object) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), "null" if value is None else "number"
    )


def decode_hook(data: bytes) -> HookPayload:
    """The payload's JSON object; :class:`DecodeError` (dead letter) for anything else."""
    if data.startswith(OVERSIZED_MARKER):
        size = data[len(OVERSIZED_MARKER) :].split(b"\n", 1)[0].decode("ascii", "replace")
        raise DecodeError(
            _TARGET,
            f"oversized: {size} bytes or more, limit {MAX_HOOK_BYTES} (only a marker "
            "was forwarded)",
        )
    if len(data) > MAX_HOOK_BYTES:
        raise DecodeError(_TARGET, f"oversized: {len(data)} bytes, limit {MAX_HOOK_BYTES}")
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(_TARGET, f"not valid JSON (truncated?): {exc}") from None
    if not isinstance(body, dict):
        raise DecodeError(_TARGET, f"expected a JSON object, got {_kind(body)}")
    return HookPayload(body=body, data=data)


@dataclass(slots=True)
class HookIngest:
    """Maps hook payloads and feeds them to ``tools`` (module docstring)."""

    tools: ToolsHandlers
    bus: MessageBus
    log: FilteringBoundLogger
    service: str = "tools"
    shard: Shard = ONE
    """This process's share of the sessions (``TAO_SHARD``): every shard maps every payload
    (stateful mappers see them all), and keeps its own sessions' events and ends."""
    mappers: dict[str, HookMapper] = field(default_factory=dict)
    handled: int = 0
    rejected: int = 0
    memo_size: int = 65_536
    memo: OrderedDict[int, list[Message] | None] = field(default_factory=OrderedDict)
    """What each recently mapped message (by stream sequence) mapped to; ``None``: it was
    dead-lettered. A batch the bus delivers again is answered from here, because stateful
    mappers (OpenHands' start/end pairing, the Claude ``user`` call) must see each payload
    once: mapping it twice would pair the wrong calls."""

    def _map(self, payload: HookPayload, d: Delivery) -> list[Message] | None:
        seq = d.stream_seq
        if seq is not None and seq in self.memo:
            return self.memo[seq]
        msgs = self._mapper(d.subject).map(payload.body, received_at(d))
        tenant = d.headers.get(TENANT_HEADER)
        if tenant is not None and not valid_name(tenant):
            raise DecodeError(_TARGET, f"header {TENANT_HEADER} is not a tenant name: {tenant!r}")
        if tenant:  # posted with a tenant's hook token: that tenant's sessions only
            msgs = [
                msgspec.structs.replace(m, session_id=qualify(tenant, m.session_id))
                if hasattr(m, "session_id")
                else m
                for m in msgs
            ]
        for m in msgs:
            subjects.escape_token(getattr(m, "session_id", ""))
        self._remember(seq, msgs)
        return msgs

    def _remember(self, seq: int | None, msgs: list[Message] | None) -> None:
        if seq is None:
            return
        self.memo[seq] = msgs
        while len(self.memo) > self.memo_size:
            self.memo.popitem(last=False)

    def _mapper(self, subject: str) -> HookMapper:
        token = subject.rsplit(".", 1)[-1]
        mapper = self.mappers.get(token)
        if mapper is None:
            mapper = self.mappers[token] = mapper_for(token)
        return mapper

    async def on_hook_batch(self, items: list[tuple[HookPayload, Delivery]]) -> None:
        """Map each payload in order; apply the tool events as one batch, then publish the
        session ends. Idempotent: a delivered-again payload reuses what it mapped to (``memo``)
        and the tool path is idempotent itself."""
        tool_items: list[tuple[ToolEvent, Delivery]] = []
        ends: list[SessionEnd] = []
        rejected: list[str] = []
        for payload, d in items:
            try:
                msgs = self._map(payload, d)
            except (ContractError, UnknownHarnessError) as exc:
                self._remember(d.stream_seq, None)
                if self.shard.index == 0:  # one shard dead-letters what none can read
                    await self._reject(payload, d, exc)
                rejected.append(str(exc))
                continue
            if msgs is None:  # dead-lettered when first delivered
                continue
            for m in msgs:
                if isinstance(m, ToolStart | ToolEnd | ToolProgress):
                    tool_items.append((m, d))
                elif isinstance(m, SessionEnd):
                    ends.append(m)
        if tool_items:
            await self.tools.on_tool_batch(tool_items)  # keeps this shard's sessions only
        for end in ends:
            if self.shard.owns(end.session_id):
                await self.bus.publish_msg(end)
        self.handled += len(items)
        self.rejected += len(rejected)
        self.log.info(
            "hook_events",
            n=len(items),
            harnesses=dict(Counter(d.subject.rsplit(".", 1)[-1] for _, d in items)),
            tool_events=len(tool_items) or None,
            session_ends=len(ends) or None,
            rejected=len(rejected) or None,
            reason=rejected[0] if len(rejected) == 1 else None,
        )

    async def _reject(self, payload: HookPayload, d: Delivery, exc: Exception) -> None:
        """Dead-letter one payload at once with the mapper's reason (as the bus does for a
        decode error: retrying cannot make it readable)."""
        letter = dead_letter_for(
            self.service, d.subject, payload.data, d.headers, exc, received_at=d.received_at
        )
        await self.bus.publish_msg(letter)
        self.log.warning(
            "dead_lettered",
            service=self.service,
            subject=d.subject,
            reason=letter.reason,
            error_type=letter.error_type,
            size=len(payload.data),
        )
