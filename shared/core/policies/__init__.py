"""Placement policies behind one interface, selectable by name."""

from __future__ import annotations

from collections.abc import Callable

from shared.core.policies.base import DEFAULT_BUDGET, PlanOptions, Policy
from shared.core.policies.baselines import BASELINES
from shared.core.policies.tao import ShortFirstPolicy, TaoBfdPolicy, TaoPolicy
from shared.core.rules import RULE_SETS, RuleSet


def _rule_set(name: str, rules: RuleSet) -> Callable[[], Policy]:
    return lambda: TaoPolicy(name=name, rules=rules)


_FACTORIES: dict[str, Callable[[], Policy]] = {
    **{name: _rule_set(name, rules) for name, rules in RULE_SETS.items()},
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
