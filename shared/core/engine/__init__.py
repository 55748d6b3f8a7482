"""Engine model: a vLLM-like node (continuous batching, prefix cache, timing) on a virtual clock."""

from __future__ import annotations

from shared.core.engine.cache import ROOT_HASH, BlockPool, HashChain, chain_hash
from shared.core.engine.engine import Engine
from shared.core.engine.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    Profile,
    decode_step_time,
    prefill_time,
    step_time,
)
from shared.core.engine.requests import (
    OUTPUT_VOCAB,
    Completion,
    EngineRequest,
    generated_token_ids,
)

__all__ = [
    "DEFAULT_PROFILE",
    "OUTPUT_VOCAB",
    "PROFILES",
    "ROOT_HASH",
    "BlockPool",
    "Completion",
    "Engine",
    "EngineRequest",
    "HashChain",
    "Profile",
    "chain_hash",
    "decode_step_time",
    "generated_token_ids",
    "prefill_time",
    "step_time",
]
