"""Node status published by telemetry on ``tao.v1.node.status.<node_id>``.

Built from a node's vLLM ``/metrics`` scrape (``vllm:kv_cache_usage_perc``,
``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:prefix_cache_*``,
``vllm:cache_config_info{block_size, num_gpu_blocks}``) and its health check.
"""

from __future__ import annotations

import msgspec

from .base import Message

__all__ = ["NodeStatus"]


class NodeStatus(Message, tag="NodeStatus", frozen=True, kw_only=True):
    """The state of serving node ``node_id`` observed at ``ts``.

    ``capacity_tokens`` is the KV capacity (``num_gpu_blocks × block_size``); ``used_tokens``
    and ``usage`` (a fraction in [0, 1]) are the resident KV load. ``models`` lists the model
    names the node serves; eligibility requires the session's model to be among them. ``url``
    is the OpenAI-compatible base URL the gateway forwards to.
    """

    node_id: str
    ts: float
    models: list[str] = msgspec.field(default_factory=list)
    capacity_tokens: int = 0
    used_tokens: int = 0
    usage: float = 0.0
    running: int = 0
    waiting: int = 0
    healthy: bool = True
    block_size: int = 16
    url: str | None = None
    prefix_cache_queries: int | None = None
    prefix_cache_hits: int | None = None
