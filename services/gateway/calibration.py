"""The prompt-size estimate, calibrated per tenant and model from what the nodes report.

The gateway registers each request with an estimate of its prompt's tokens before any node has
seen it (characters / 4, :func:`.requests.estimate_prompt_tokens`); the planner's pay-back
counts admitted contexts with it until the response's ``usage`` replaces it. Characters per
token differ by tokenizer (the simnode's word pieces are ~5 characters, code is ~3), so a fixed
ratio over- or under-counts every running request. As ThunderAgent's router learns its
char-per-token ratio from ``prompt_tokens`` (``ThunderAgent/scheduler/router.py:393–405``),
this learns the ratio of the node's ``usage.prompt_tokens`` to the raw estimate (an
exponential average, clipped to [0.25, 4]), and scales later estimates by it.

**Per tenant and model.** Characters per token differ by the text as much as by the
tokenizer (English prose about 4, code about 3, Chinese about 1), and each tenant sends its
own kind. With one factor per model, one tenant sending text that tokenizes densely (say
CJK, clipped at 4×) would quadruple every other tenant's estimates, and the planner would
reserve room their requests never use: a tenant could poison the others' admissions. So each
tenant learns its own factor (authentication off or the gateway key: one tenant). A tenant's
first request of a model starts from 1.0, the raw estimate.

Bounded (:class:`.bounded.TenantLRU`): at most :data:`MODELS_PER_TENANT` models per tenant and
:data:`MAX_FACTORS` in all, least recently used first; a model name longer than
:data:`MAX_MODEL_CHARS` is not learnt (it is the client's text, and no served model has one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from services.gateway.bounded import TenantLRU

__all__ = ["HIGH", "LOW", "MAX_FACTORS", "MODELS_PER_TENANT", "PromptCalibration"]

LOW: Final = 0.25
HIGH: Final = 4.0
MODELS_PER_TENANT: Final = 64
MAX_FACTORS: Final = 16_384
MAX_MODEL_CHARS: Final = 256


def _factors() -> TenantLRU[str | None, str, float]:
    return TenantLRU(MODELS_PER_TENANT, MAX_FACTORS)


@dataclass(slots=True)
class PromptCalibration:
    """Tokens per raw estimated token, per tenant and model (``alpha``: weight of a new
    observation)."""

    alpha: float = 0.2
    _factor: TenantLRU[str | None, str, float] = field(default_factory=_factors)

    def __len__(self) -> int:
        return len(self._factor)

    def factor(self, model: str | None, tenant: str | None = None) -> float:
        """The learned ratio for ``tenant``'s ``model`` (1.0 before any observation)."""
        found = self._factor.get(tenant, model or "", touch=False)
        return 1.0 if found is None else found

    def scale(self, model: str | None, raw: int, tenant: str | None = None) -> int:
        """``raw`` (characters / 4) in the model's tokens, as learned so far for ``tenant``."""
        return math.ceil(raw * self.factor(model, tenant)) if raw > 0 else 0

    def observe(self, model: str | None, raw: int, actual: int, tenant: str | None = None) -> None:
        """A node answered ``tenant``'s request estimated at ``raw`` with ``actual`` prompt
        tokens."""
        key = model or ""
        if raw <= 0 or actual <= 0 or len(key) > MAX_MODEL_CHARS:
            return
        ratio = min(max(actual / raw, LOW), HIGH)
        old = self._factor.get(tenant, key)
        self._factor.put(tenant, key, ratio if old is None else old + self.alpha * (ratio - old))
