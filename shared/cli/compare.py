"""``tao compare``: every policy on one snapshot, side by side.

Each policy's objective is reported under the snapshot's full valuation (the policies do this
themselves), so the rows compare on one lexicographic scale. The ``vs tao`` column says how a
row's objective ``(credit, ready, tokens, admitted)`` compares with tao's: ``=`` equal, ``<``
worse, ``>`` better (possible only when tao itself fell back and is not exact).
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.cli.plan import TimedResult, plan_document, run_policy
from shared.core.policies import POLICY_NAMES
from shared.core.problem import Objective, Problem
from shared.tables import render

REFERENCE = "tao"

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "<"),
    ("credit", ">"),
    ("ready", ">"),
    ("tokens", ">"),
    ("admitted", ">"),
    ("exact", "<"),
    ("method", "<"),
    ("states", ">"),
    ("ms", ">"),
    ("vs tao", "<"),
    ("reason", "<"),
)


def versus(objective: Objective, reference: Objective | None) -> str:
    """``=``, ``<`` or ``>``: the lexicographic order of ``objective`` against ``reference``."""
    if reference is None:
        return "?"
    mine, theirs = tuple(objective), tuple(reference)
    if mine == theirs:
        return "="
    return "<" if mine < theirs else ">"


def run_all(
    problem: Problem, *, budget: int, names: Sequence[str] = POLICY_NAMES
) -> list[TimedResult]:
    """Every named policy on ``problem``, in order, each a fresh policy object."""
    return [run_policy(problem, name, budget=budget) for name in names]


def _reference(results: Sequence[TimedResult]) -> Objective | None:
    for timed in results:
        if timed.policy == REFERENCE:
            return timed.result.objective
    return None


def compare_documents(results: Sequence[TimedResult]) -> list[dict[str, object]]:
    """The ``--json`` form: one ``tao plan`` object per policy plus ``vs_tao``."""
    ref = _reference(results)
    out: list[dict[str, object]] = []
    for timed in results:
        doc = plan_document(timed)
        doc["vs_tao"] = versus(timed.result.objective, ref)
        out.append(doc)
    return out


def compare_table(results: Sequence[TimedResult]) -> str:
    """A plain-text table, one row per policy, columns aligned."""
    ref = _reference(results)
    rows: list[list[str]] = []
    for timed in results:
        res = timed.result
        obj = res.objective
        rows.append(
            [
                timed.policy,
                str(obj.credit),
                str(obj.ready),
                str(obj.tokens),
                str(obj.admitted),
                "yes" if res.exact else "no",
                res.method,
                str(res.states),
                f"{timed.elapsed_ms:.1f}",
                versus(obj, ref),
                res.reason or "",
            ]
        )
    header = [name for name, _ in _COLUMNS]
    return render(header, rows, align=[a for _, a in _COLUMNS])
