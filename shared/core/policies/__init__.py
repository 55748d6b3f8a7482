"""Placement policies behind one interface, selectable by name."""

from __future__ import annotations

from collections.abc import Callable

from shared.core.policies.base import DEFAULT_BUDGET, PlanOptions, Policy
from shared.core.policies.baselines import BASELINES
from shared.core.policies.tao import ShortFirstPolicy, TaoBfdPolicy, TaoPolicy

_FACTORIES: dict[str, Callable[[], Policy]] = {
    "tao": TaoPolicy,
    "tao-no-cache": lambda: TaoPolicy(name="tao-no-cache", use_cache=False),
    "tao-no-ready": lambda: TaoPolicy(name="tao-no-ready", use_ready=False),
    "tao-no-cache-no-ready": lambda: TaoPolicy(
        name="tao-no-cache-no-ready", use_cache=False, use_ready=False
    ),
    "tao-bfd": TaoBfdPolicy,
    "short-first": ShortFirstPolicy,
    **BASELINES,
}

POLICY_NAMES: tuple[str, ...] = tuple(_FACTORIES)
"""Every policy name, ``tao`` first."""


class UnknownPolicyError(KeyError):
    """A policy name that is not registered."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}")

    def __str__(self) -> str:
        return str(self.args[0])


def get_policy(name: str) -> Policy:
    """A fresh policy object (stateful ones, like ``rr``, keep state per object)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise UnknownPolicyError(name) from None
    return factory()


__all__ = [
    "DEFAULT_BUDGET",
    "POLICY_NAMES",
    "PlanOptions",
    "Policy",
    "UnknownPolicyError",
    "get_policy",
]
