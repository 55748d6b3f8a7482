"""Telemetry's answers to ``tao inspect``: core-NATS request/reply on ``tao.v1.inspect.<what>``.

Bodies and replies are the JSON structs of :mod:`shared.contracts.inspect`; a request that
cannot be answered gets ``{"error": "..."}`` (the CLI prints it and exits 2).

* ``inspect.node`` ``{"node"}`` → distinct resident blocks, their tokens, the last applied
  ``seq`` and the incarnation from the KV-event index (and the host KV tier's blocks and
  tokens); ``healthy`` from the store's node record
  (the scraper's verdict); ``capacity_tokens`` from the nodes file's override when set, else the
  store's record (``vllm:cache_config_info``).
* ``inspect.prefix`` ``{"node", "tokens"}`` → ``resident_prefix_tokens``: TAO's own keys of the
  token ids walked from the root against the node's resident blocks, with the node's block size
  (the one its KV events report, else the store's record, else 16); ``host_prefix_tokens``: the
  same walk against its host KV tier.

A node is known when it is in the nodes file, has sent KV events, or has a store record.

Sharded (``TAO_SHARD``), every shard gets each request and only the one owning the node's id
replies, known node or not; an unreadable request is answered by shard 0.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.contracts import subjects
from shared.contracts.errors import ContractError
from shared.contracts.inspect import (
    InspectFailure,
    NodeQuery,
    PrefixInspect,
    PrefixQuery,
    decode_query,
    encode_body,
)
from shared.core.blockkeys import DEFAULT_BLOCK_SIZE
from shared.core.kvindex import KvIndex
from shared.core.tiers import CPU
from shared.infra.busapi import MessageBus, Subscription
from shared.infra.settings import NodeSpec
from shared.infra.shard import ONE, Shard
from shared.infra.store_types import NodeRecord, StateStore

__all__ = ["DEFAULT_BLOCK_SIZE", "Inspector"]


class _Unknown(LookupError):
    pass


class Inspector:
    """Answers ``inspect.node`` and ``inspect.prefix`` from a :class:`KvIndex` and the store."""

    def __init__(
        self, index: KvIndex, store: StateStore, nodes: Sequence[NodeSpec], shard: Shard = ONE
    ) -> None:
        self.index = index
        self.store = store
        self.specs = {n.id: n for n in nodes}
        self.shard = shard

    async def start(self, bus: MessageBus, service: str) -> list[Subscription]:
        return [
            await bus.serve(subjects.inspect("node"), service, self.on_node),
            await bus.serve(subjects.inspect("prefix"), service, self.on_prefix),
        ]

    async def _record(self, node: str) -> NodeRecord | None:
        """The store's record of ``node``; _Unknown if nothing knows the node."""
        try:
            record = await self.store.get_node(node)
        except ValueError:  # not a valid node id for the store
            record = None
        if record is None and node not in self.specs and not self.index.has_node(node):
            raise _Unknown(f"unknown node {node!r}")
        return record

    def _answers(self, node: str | None) -> bool:
        """Whether this shard replies about ``node`` (``None``: an unreadable request)."""
        return self.shard.index == 0 if node is None else self.shard.owns(node)

    async def on_node(self, body: bytes) -> bytes | None:
        try:
            node = decode_query(body, NodeQuery).node
        except ContractError as exc:
            return encode_body(InspectFailure(str(exc))) if self._answers(None) else None
        if not self._answers(node):
            return None
        try:
            record = await self._record(node)
        except _Unknown as exc:
            return encode_body(InspectFailure(str(exc)))
        spec = self.specs.get(node)
        capacity = spec.capacity_tokens if spec is not None else None
        if capacity is None and record is not None:
            capacity = record.capacity_tokens
        healthy = record is not None and record.healthy
        return encode_body(self.index.inspect_node(node, healthy, capacity))

    async def on_prefix(self, body: bytes) -> bytes | None:
        try:
            ask = decode_query(body, PrefixQuery)
        except ContractError as exc:
            return encode_body(InspectFailure(str(exc))) if self._answers(None) else None
        if not self._answers(ask.node):
            return None
        try:
            record = await self._record(ask.node)
            bs = self.index.block_size(ask.node) or (
                record.block_size if record is not None else DEFAULT_BLOCK_SIZE
            )
            n = self.index.walk_tokens(ask.node, ask.tokens, bs)
            host = self.index.walk_tokens(ask.node, ask.tokens, bs, CPU)
        except (ContractError, _Unknown) as exc:
            return encode_body(InspectFailure(str(exc)))
        except ValueError as exc:  # a token id outside uint32
            return encode_body(InspectFailure(f"tokens: {exc}"))
        return encode_body(PrefixInspect(n, host))
