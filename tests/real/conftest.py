"""Two real vLLM engines (vLLM's CPU build, a tiny local model) behind a whole TAO stack.

Started once for the tier (``tao engines up`` in code: about a minute on two cores) with a small
KV cache (256 blocks of 32 tokens each, 8,192 tokens) so that a few long prompts evict, then
``shared.cli.stack.Stack`` with no simnodes and ``TAO_NODES_FILE`` naming the engines. The tier
needs the engines' Python (``.venv-vllm``, made by ``scripts/engines.sh install``; CI makes
it); without it every test here is skipped with that one reason.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest

from shared.cli.engines import DEFAULT_PYTHON, EngineConfig, engines_down, engines_up, node_specs
from shared.cli.stack import Stack, StackConfig
from shared.infra.embedded import free_port
from shared.infra.settings import NodeSpec

PYTHON = Path(os.environ.get("TAO_VLLM_PYTHON", str(DEFAULT_PYTHON)))
KV_BLOCKS = 256
BLOCK = 32
MAX_LEN = 4096


@dataclass
class Rig:
    """The engines, their nodes and the stack in front of them."""

    cfg: EngineConfig
    nodes: list[NodeSpec]
    stack: Stack
    namespace: str
    domain: str

    def root(self, node: str) -> str:
        """The engine's own base URL (no ``/v1``), to talk to it past the gateway."""
        return next(n for n in self.nodes if n.id == node).root


def _ports(n: int) -> int:
    """A base port with ``n`` free ports after it (checked one by one)."""
    for _ in range(50):
        base = free_port()
        if base + n < 65_000 and all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no run of free ports")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def rig(tmp_path_factory: pytest.TempPathFactory, nats_url: str, redis_url: str) -> Iterator[Rig]:
    if not PYTHON.exists():
        pytest.skip(f"no vLLM Python at {PYTHON}: run `bash scripts/engines.sh install`")
    state = tmp_path_factory.mktemp("engines")
    cfg = EngineConfig(
        count=2,
        python=PYTHON,
        state_dir=state,
        base_port=_ports(2),
        kv_base_port=_ports(4),
        block_size=BLOCK,
        kv_blocks=KV_BLOCKS,
        max_model_len=MAX_LEN,
        timeout_s=400.0,
    )
    nodes_file = engines_up(cfg, StringIO())
    run = uuid.uuid4().hex[:8]
    namespace, domain = f"real{run}", f"real-{run}"
    env = {"TAO_NATS_URL": nats_url, "TAO_REDIS_URL": redis_url}
    stack = Stack(
        StackConfig(
            sim_nodes=0,
            policy="tao",
            namespace=namespace,
            domain=domain,
            extra_env={"TAO_NODES_FILE": str(nodes_file), "TAO_SCRAPE_S": "0.5"},
            env={**os.environ, **env},
        )
    )
    try:
        stack.start()
        yield Rig(cfg, node_specs(cfg), stack, namespace, domain)
    finally:
        stack.stop()
        engines_down(state)
