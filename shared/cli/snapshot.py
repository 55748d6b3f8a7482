"""Read a ``tao plan`` snapshot (JSON) into a :class:`~shared.core.problem.Problem`, strictly.

The format (every number an integer; ``credit``, ``eligible``, ``load`` and ``phase`` optional)::

    {"quantum": 512,
     "nodes": [{"id": "n1", "free": 100000, "load": 0}],
     "candidates": [{"id": "s1", "weight": 12000, "credit": {"n1": 8192}, "ready": 1,
                     "tokens": 11488, "eligible": ["n1"], "phase": "acting"}]}

Every problem raises :class:`~shared.core.problem.ProblemError` naming the field by its path
(``candidates[3].weight``) and the reason. Rules: integers are JSON integers (not ``true``, not
``3.0``), from 0 to 2**40; ``quantum`` is at least 1; ``ready`` is 0 or 1; ids are non-empty
strings, unique among nodes and among candidates; ``credit`` and ``eligible`` name only known
nodes, each at most once. Unknown keys at the top level are ignored (room for metadata);
unknown keys inside a node or a candidate are errors, so a misspelt optional field (``eligable``)
cannot silently change the plan. Duplicate keys in one JSON object are errors too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast, get_args

from shared.core.problem import MAX_VALUE, Candidate, Node, Phase, Problem, ProblemError

MAX_INT = MAX_VALUE
"""Largest integer accepted (the largest every JSON implementation reads exactly)."""

PHASES: tuple[str, ...] = get_args(Phase)

_NODE_KEYS = frozenset({"id", "free", "load"})
_CANDIDATE_KEYS = frozenset({"id", "weight", "tokens", "ready", "credit", "eligible", "phase"})
_MAX_DIGITS = 64  # longer integer literals are "too large" without converting them


class _TooLarge:
    """An integer literal too long to convert (kept apart so the validator can name its field)."""


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(key)


def _parse_int(text: str) -> int | _TooLarge:
    if len(text.lstrip("-")) <= _MAX_DIGITS:
        return int(text)
    return -1 if text.startswith("-") else _TooLarge()  # any negative is refused as negative


def _reject_constant(text: str) -> None:
    raise ValueError(f"{text} is not a JSON number")


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def load_json(data: bytes | str) -> object:
    """Decode JSON text, raising ``ProblemError("input", ...)`` with the line and column."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data.removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ProblemError("input", f"not valid UTF-8 (byte {exc.start})") from None
    try:
        doc: object = json.loads(
            text,
            parse_int=_parse_int,
            parse_constant=_reject_constant,
            object_pairs_hook=_pairs,
        )
    except json.JSONDecodeError as exc:
        raise ProblemError(
            "input", f"not valid JSON (line {exc.lineno} col {exc.colno}): {exc.msg}"
        ) from None
    except _DuplicateKey as exc:
        raise ProblemError("input", f"duplicate key {exc.key!r} in one object") from None
    except (ValueError, RecursionError) as exc:
        raise ProblemError("input", f"not valid JSON: {exc}") from None
    return doc


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, _TooLarge)):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _int(value: object, path: str, *, minimum: int = 0) -> int:
    if isinstance(value, _TooLarge):
        raise ProblemError(path, f"too large (at most 2**40 = {MAX_INT})")
    if isinstance(value, bool) or not isinstance(value, int):
        shown = f" ({value!r})" if isinstance(value, float) else ""
        raise ProblemError(path, f"must be an integer, got {_type_name(value)}{shown}")
    if value < minimum:
        raise ProblemError(path, f"must be >= {minimum}, got {value}")
    if value > MAX_INT:
        raise ProblemError(path, f"too large (at most 2**40 = {MAX_INT}), got {value}")
    return value


def _id(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise ProblemError(path, f"must be a string, got {_type_name(value)}")
    if not value:
        raise ProblemError(path, "must be a non-empty string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProblemError(path, "must be valid Unicode (lone surrogate escape)") from None
    return value


def _object(value: object, path: str, allowed: frozenset[str] | None) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise ProblemError(path, f"must be an object, got {_type_name(value)}")
    obj = cast(dict[str, object], value)
    if allowed is not None:
        for key in obj:
            if key not in allowed:
                raise ProblemError(f"{path}.{key}" if path else key, "unknown field")
    return obj


def _list(value: object, path: str) -> list[object]:
    if not isinstance(value, list):
        raise ProblemError(path, f"must be an array, got {_type_name(value)}")
    return cast(list[object], value)


def _required(obj: Mapping[str, object], key: str, path: str) -> object:
    if key not in obj:
        raise ProblemError(path, "missing")
    return obj[key]


def _node(value: object, path: str) -> Node:
    obj = _object(value, path, _NODE_KEYS)
    return Node(
        id=_id(_required(obj, "id", f"{path}.id"), f"{path}.id"),
        free=_int(_required(obj, "free", f"{path}.free"), f"{path}.free"),
        load=_int(obj.get("load", 0), f"{path}.load"),
    )


def _credit(value: object, path: str, known: frozenset[str]) -> dict[str, int]:
    obj = _object(value, path, None)
    out: dict[str, int] = {}
    for node_id, amount in obj.items():
        where = f"{path}[{json.dumps(node_id)}]"
        if node_id not in known:
            raise ProblemError(where, f"unknown node {node_id!r}")
        out[node_id] = _int(amount, where)
    return out


def _eligible(value: object, path: str, known: frozenset[str]) -> frozenset[str]:
    seen: set[str] = set()
    for j, item in enumerate(_list(value, path)):
        where = f"{path}[{j}]"
        node_id = _id(item, where)
        if node_id not in known:
            raise ProblemError(where, f"unknown node {node_id!r}")
        if node_id in seen:
            raise ProblemError(where, f"duplicate node {node_id!r}")
        seen.add(node_id)
    return frozenset(seen)


def _phase(value: object, path: str) -> Phase:
    if value not in PHASES:
        raise ProblemError(path, f"must be one of {', '.join(PHASES)}, got {value!r}")
    return cast(Phase, value)


def _candidate(value: object, path: str, known: frozenset[str]) -> Candidate:
    obj = _object(value, path, _CANDIDATE_KEYS)

    def req(key: str) -> object:
        return _required(obj, key, f"{path}.{key}")

    cid = _id(req("id"), f"{path}.id")
    weight = _int(req("weight"), f"{path}.weight")
    tokens = _int(req("tokens"), f"{path}.tokens")
    raw_ready = req("ready")
    if type(raw_ready) is int and raw_ready not in (0, 1):
        raise ProblemError(f"{path}.ready", f"must be 0 or 1, got {raw_ready}")
    ready = _int(raw_ready, f"{path}.ready")
    credit = _credit(obj["credit"], f"{path}.credit", known) if "credit" in obj else {}
    eligible = _eligible(obj["eligible"], f"{path}.eligible", known) if "eligible" in obj else None
    phase = _phase(obj["phase"], f"{path}.phase") if "phase" in obj else None
    return Candidate(
        id=cid,
        weight=weight,
        tokens=tokens,
        ready=ready,
        credit=credit,
        eligible=eligible,
        phase=phase,
    )


def to_problem(doc: object) -> Problem:
    """Validate a decoded JSON document and build the problem (see the module docstring)."""
    top = _object(doc, "input", None)
    quantum = _int(_required(top, "quantum", "quantum"), "quantum", minimum=1)

    nodes: list[Node] = []
    node_ids: set[str] = set()
    for b, item in enumerate(_list(_required(top, "nodes", "nodes"), "nodes")):
        node = _node(item, f"nodes[{b}]")
        if node.id in node_ids:
            raise ProblemError(f"nodes[{b}].id", f"duplicate node id {node.id!r}")
        node_ids.add(node.id)
        nodes.append(node)

    known = frozenset(node_ids)
    candidates: list[Candidate] = []
    cand_ids: set[str] = set()
    raw_cands = _list(_required(top, "candidates", "candidates"), "candidates")
    for i, item in enumerate(raw_cands):
        cand = _candidate(item, f"candidates[{i}]", known)
        if cand.id in cand_ids:
            raise ProblemError(f"candidates[{i}].id", f"duplicate candidate id {cand.id!r}")
        cand_ids.add(cand.id)
        candidates.append(cand)

    return Problem(quantum=quantum, nodes=tuple(nodes), candidates=tuple(candidates))


def parse_snapshot(data: bytes | str) -> Problem:
    """JSON text → validated :class:`Problem`; raises :class:`ProblemError` on any bad input."""
    return to_problem(load_json(data))


def dump_snapshot(problem: Problem) -> dict[str, object]:
    """The JSON-ready form of a problem (the inverse of :func:`to_problem`)."""
    nodes = [{"id": n.id, "free": n.free, "load": n.load} for n in problem.nodes]
    cands: list[dict[str, object]] = []
    for c in problem.candidates:
        item: dict[str, object] = {"id": c.id, "weight": c.weight}
        if c.credit:
            item["credit"] = dict(c.credit)
        item["ready"] = c.ready
        item["tokens"] = c.tokens
        if c.eligible is not None:
            item["eligible"] = sorted(c.eligible)
        if c.phase is not None:
            item["phase"] = c.phase
        cands.append(item)
    return {"quantum": problem.quantum, "nodes": nodes, "candidates": cands}
