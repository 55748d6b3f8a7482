"""The prompt-size estimate, calibrated per model from what the nodes report.

The gateway registers each request with an estimate of its prompt's tokens before any node has
seen it (characters / 4, :func:`.requests.estimate_prompt_tokens`); the planner's pay-back
counts admitted contexts with it until the response's ``usage`` replaces it. Characters per
token differ by tokenizer (the simnode's word pieces are ~5 characters, code is ~3), so a fixed
ratio over- or under-counts every running request. As ThunderAgent's router learns its
char-per-token ratio from ``prompt_tokens`` (``ThunderAgent/scheduler/router.py:393–405``),
this learns, per model, the ratio of the node's ``usage.prompt_tokens`` to the raw estimate
(an exponential average, clipped to [0.25, 4]), and scales later estimates by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

__all__ = ["PromptCalibration"]

LOW: Final = 0.25
HIGH: Final = 4.0


@dataclass(slots=True)
class PromptCalibration:
    """Tokens per raw estimated token, per model (``alpha``: weight of a new observation)."""

    alpha: float = 0.2
    _factor: dict[str, float] = field(default_factory=dict)

    def factor(self, model: str | None) -> float:
        """The learned ratio for ``model`` (1.0 before any observation)."""
        return self._factor.get(model or "", 1.0)

    def scale(self, model: str | None, raw: int) -> int:
        """``raw`` (characters / 4) in the model's tokens, as learned so far."""
        return math.ceil(raw * self.factor(model)) if raw > 0 else 0

    def observe(self, model: str | None, raw: int, actual: int) -> None:
        """A node answered a request estimated at ``raw`` with ``actual`` prompt tokens."""
        if raw <= 0 or actual <= 0:
            return
        ratio = min(max(actual / raw, LOW), HIGH)
        key = model or ""
        old = self._factor.get(key)
        self._factor[key] = ratio if old is None else old + self.alpha * (ratio - old)
