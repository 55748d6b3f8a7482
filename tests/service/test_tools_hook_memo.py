"""A hook batch the bus delivers again is answered from what it first mapped to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.tools.hooks import HookIngest, HookPayload
from shared.contracts.base import Message
from shared.contracts.tool import ToolEvent
from shared.harness.base import HookPayloadError
from shared.harness.openhands import OpenHandsMapper
from shared.infra import Delivery, FakeBus
from shared.infra.logging import get_logger


class Tools:
    """Records the tool batches handed to the tools path."""

    def __init__(self) -> None:
        self.batches: list[list[ToolEvent]] = []

    async def on_tool_batch(self, items: list[tuple[ToolEvent, Delivery]]) -> None:
        self.batches.append([m for m, _ in items])


class Refusing:
    harness = "openhands"
    calls = 0

    def map(self, body: Mapping[str, Any], received_at: float) -> list[Message]:
        self.calls += 1
        raise HookPayloadError("openhands", "session_id: missing")


def _item(seq: int, event: str, num_delivered: int = 1) -> tuple[HookPayload, Delivery]:
    body = {"event_type": event, "tool_name": "terminal", "session_id": "oh1", "tool_input": {}}
    d = Delivery("tao.v1.hook.openhands", {}, num_delivered, seq, 1000.0 + seq)
    return HookPayload(body=body, data=b"{}"), d


async def test_redelivered_batch_maps_the_same_and_pairs_once() -> None:
    tools, bus = Tools(), FakeBus()
    ingest = HookIngest(tools, bus, get_logger("test"), mappers={"openhands": OpenHandsMapper()})  # type: ignore[arg-type]
    batch = [_item(1, "PreToolUse"), _item(2, "PostToolUse")]
    await ingest.on_hook_batch(batch)
    again = [_item(1, "PreToolUse", 2), _item(2, "PostToolUse", 2)]
    await ingest.on_hook_batch(again)
    first, second = tools.batches
    assert first == second  # same call ids, start then end: nothing re-paired
    assert first[0].call_id == first[1].call_id  # type: ignore[union-attr]
    # a new start after the redelivery still pairs normally with its own end
    await ingest.on_hook_batch([_item(3, "PreToolUse"), _item(4, "PostToolUse")])
    third = tools.batches[2]
    assert third[0].call_id == third[1].call_id != first[0].call_id  # type: ignore[union-attr]


async def test_rejected_payload_is_dead_lettered_once() -> None:
    tools, bus = Tools(), FakeBus()
    mapper = Refusing()
    ingest = HookIngest(tools, bus, get_logger("test"), mappers={"openhands": mapper})  # type: ignore[arg-type]
    await ingest.on_hook_batch([_item(7, "PreToolUse")])
    await ingest.on_hook_batch([_item(7, "PreToolUse", 2)])
    assert mapper.calls == 1 and ingest.rejected == 1
    assert len([p for p in bus.published if p[0].endswith("dlq.tools")]) == 1
