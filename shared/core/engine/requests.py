"""Request types of the engine model: what goes in, what comes out, and the scheduler state."""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np

__all__ = ["OUTPUT_VOCAB", "Completion", "EngineRequest", "ReqState", "generated_token_ids"]

OUTPUT_VOCAB: Final = 32_000
"""Generated (unscripted) output token ids lie in ``[0, OUTPUT_VOCAB)``."""


def generated_token_ids(request_id: str, n: int) -> tuple[int, ...]:
    """The ``n`` deterministic output token ids of an unscripted request."""
    seed = zlib.crc32(request_id.encode())
    return tuple(
        ((seed + 0x9E3779B1 * (i + 1)) * 2654435761 >> 11) % OUTPUT_VOCAB for i in range(n)
    )


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One model call: the full prompt of this turn and how many tokens to generate."""

    id: str
    session_id: str
    prompt: Sequence[int]
    max_tokens: int
    output: Sequence[int] | None = None
    """Exact output ids (scripted; length ``max_tokens``), else :func:`generated_token_ids`."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request with its timings and token counts."""

    request_id: str
    session_id: str
    arrived_at: float
    first_token_at: float
    finished_at: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    output: tuple[int, ...]


class ReqState:
    """Mutable scheduler state of one request (engine-internal).

    ``blocks[:nblocks]`` (int64) are the KV blocks it holds and ``hashes[:nhashes]`` (uint64)
    the chain hashes of its first full blocks, both arrays sized once for the most it can ever
    need (``prompt + max_tokens`` tokens), so the block pool's kernels work on them in place."""

    __slots__ = (
        "arrived_at",
        "blocks",
        "cached_tokens",
        "first_token_at",
        "generated",
        "hashes",
        "host_next",
        "id",
        "last_token_at",
        "max_tokens",
        "nblocks",
        "nhashes",
        "num_cached_blocks",
        "num_computed",
        "prompt_len",
        "session_id",
        "tokens",
    )

    def __init__(
        self, req: EngineRequest, output: Sequence[int], now: float, block_size: int = 16
    ) -> None:
        self.id = req.id
        self.session_id = req.session_id
        self.prompt_len = len(req.prompt)
        self.tokens: list[int] = [*req.prompt, *output]
        self.max_tokens = req.max_tokens
        self.arrived_at = now
        self.first_token_at: float | None = None
        self.last_token_at = -math.inf
        self.generated = 0
        self.num_computed = 0
        total = len(self.tokens)
        self.blocks = np.empty(-(-total // block_size), dtype=np.int64)
        self.nblocks = 0
        self.hashes = np.empty(total // block_size, dtype=np.uint64)
        self.nhashes = 0
        self.num_cached_blocks = 0
        self.cached_tokens = -1
        self.host_next = 0
        """Leading full prompt blocks already offered to the host tier (stored or held)."""

    @property
    def num_tokens(self) -> int:
        """Tokens known so far: the prompt and the sampled output."""
        return self.prompt_len + self.generated
