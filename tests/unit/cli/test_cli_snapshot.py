"""The ``tao plan`` snapshot reader: what it accepts, and the field it names for each bad input."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from shared.cli.snapshot import MAX_INT, dump_snapshot, parse_snapshot
from shared.core.generate import generate
from shared.core.problem import Candidate, Node, Problem, ProblemError
from shared.examples import path as example_path

Doc = dict[str, Any]


def valid() -> Doc:
    return {
        "quantum": 512,
        "nodes": [{"id": "n1", "free": 100000}, {"id": "n2", "free": 50000, "load": 7}],
        "candidates": [
            {
                "id": "s1",
                "weight": 12000,
                "credit": {"n1": 8192},
                "ready": 1,
                "tokens": 11488,
                "eligible": ["n1", "n2"],
            },
            {"id": "s2", "weight": 4000, "ready": 0, "tokens": 3500, "phase": "new"},
        ],
    }


def error_of(text: str | bytes) -> ProblemError:
    with pytest.raises(ProblemError) as info:
        parse_snapshot(text)
    return info.value


class TestAccepts:
    """Valid snapshots become the Problem they describe."""

    def test_full_document(self) -> None:
        """Every field, required and optional, lands in the Problem."""
        problem = parse_snapshot(json.dumps(valid()))
        assert problem == Problem(
            quantum=512,
            nodes=(Node("n1", 100000, 0), Node("n2", 50000, 7)),
            candidates=(
                Candidate(
                    "s1", 12000, 11488, ready=1, credit={"n1": 8192},
                    eligible=frozenset({"n1", "n2"}),
                ),
                Candidate("s2", 4000, 3500, ready=0, phase="new"),
            ),
        )  # fmt: skip

    def test_optional_fields_default(self) -> None:
        """No credit means none; no eligible list means every node; load defaults to 0."""
        cand = parse_snapshot(json.dumps(valid())).candidates[1]
        assert (cand.credit, cand.eligible, cand.phase) == ({}, None, "new")

    def test_empty_lists(self) -> None:
        """A snapshot without nodes or candidates is valid."""
        problem = parse_snapshot('{"quantum": 1, "nodes": [], "candidates": []}')
        assert (problem.nodes, problem.candidates) == ((), ())

    def test_unknown_top_level_keys_are_ignored(self) -> None:
        """Extra top-level keys (metadata) do not change the problem."""
        doc = valid() | {"note": "hello", "tick": 4}
        assert parse_snapshot(json.dumps(doc)) == parse_snapshot(json.dumps(valid()))

    def test_two_to_the_40_is_allowed(self) -> None:
        """Integers up to 2**40 inclusive are accepted."""
        doc = valid()
        doc["nodes"][0]["free"] = MAX_INT
        assert parse_snapshot(json.dumps(doc)).nodes[0].free == 2**40

    def test_bytes_with_bom(self) -> None:
        """UTF-8 bytes with a byte-order mark are read like text."""
        data = b"\xef\xbb\xbf" + json.dumps(valid()).encode()
        assert parse_snapshot(data) == parse_snapshot(json.dumps(valid()))

    def test_bundled_example(self) -> None:
        """The shipped example is valid: 3 nodes, 10 candidates, one restricted eligibility."""
        problem = parse_snapshot(example_path().read_bytes())
        assert len(problem.nodes) == 3
        assert len(problem.candidates) == 10
        assert any(c.eligible is not None for c in problem.candidates)

    @pytest.mark.parametrize("seed", range(5))
    def test_round_trip_of_generated_snapshots(self, seed: int) -> None:
        """dump_snapshot then parse_snapshot gives back a generated problem unchanged."""
        problem = generate(seed, nodes=3, candidates=20, load=1.5, credit="several",
                           interchangeable=bool(seed % 2))  # fmt: skip
        assert parse_snapshot(json.dumps(dump_snapshot(problem))) == problem


def _set(path: list[str | int], value: object) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def _delete(path: list[str | int]) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


def _append(path: list[str | int], value: object) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        target: Any = doc
        for key in path:
            target = target[key]
        target.append(copy.deepcopy(value))

    return mutate


BAD_DOCS: list[tuple[str, Callable[[Doc], None], str, str]] = [
    ("missing quantum", _delete(["quantum"]), "quantum", "missing"),
    ("missing nodes", _delete(["nodes"]), "nodes", "missing"),
    ("missing candidates", _delete(["candidates"]), "candidates", "missing"),
    ("missing node id", _delete(["nodes", 0, "id"]), "nodes[0].id", "missing"),
    ("missing free", _delete(["nodes", 1, "free"]), "nodes[1].free", "missing"),
    ("missing weight", _delete(["candidates", 1, "weight"]), "candidates[1].weight", "missing"),
    ("missing tokens", _delete(["candidates", 0, "tokens"]), "candidates[0].tokens", "missing"),
    ("missing ready", _delete(["candidates", 0, "ready"]), "candidates[0].ready", "missing"),
    ("quantum string", _set(["quantum"], "512"), "quantum", "must be an integer"),
    ("quantum zero", _set(["quantum"], 0), "quantum", "must be >= 1"),
    ("nodes not array", _set(["nodes"], {"n1": 1}), "nodes", "must be an array"),
    ("node not object", _set(["nodes", 0], "n1"), "nodes[0]", "must be an object"),
    ("candidates null", _set(["candidates"], None), "candidates", "must be an array"),
    ("bool is not int", _set(["nodes", 0, "free"], True), "nodes[0].free", "must be an integer"),
    ("bool ready", _set(["candidates", 0, "ready"], True), "candidates[0].ready", "integer"),
    ("float 3.0", _set(["candidates", 0, "weight"], 3.0), "candidates[0].weight", "integer"),
    ("float 0.5", _set(["quantum"], 0.5), "quantum", "must be an integer"),
    ("negative free", _set(["nodes", 0, "free"], -1), "nodes[0].free", "must be >= 0"),
    ("negative load", _set(["nodes", 1, "load"], -5), "nodes[1].load", "must be >= 0"),
    ("negative tokens", _set(["candidates", 0, "tokens"], -1), "candidates[0].tokens", ">= 0"),
    ("ready 2", _set(["candidates", 0, "ready"], 2), "candidates[0].ready", "must be 0 or 1"),
    ("ready -1", _set(["candidates", 0, "ready"], -1), "candidates[0].ready", "must be 0 or 1"),
    ("too large", _set(["nodes", 0, "free"], 2**40 + 1), "nodes[0].free", "too large"),
    ("huge literal", _set(["candidates", 1, "tokens"], 10**100), "candidates[1].tokens", "large"),
    ("huge negative literal", _set(["nodes", 0, "free"], -(10**100)), "nodes[0].free", ">= 0"),
    ("lone surrogate id", _set(["nodes", 0, "id"], "\ud800"), "nodes[0].id", "valid Unicode"),
    ("duplicate node id", _set(["nodes", 1, "id"], "n1"), "nodes[1].id", "duplicate node id"),
    ("duplicate candidate id", _set(["candidates", 1, "id"], "s1"), "candidates[1].id",
     "duplicate candidate id"),
    ("empty node id", _set(["nodes", 0, "id"], ""), "nodes[0].id", "non-empty"),
    ("int candidate id", _set(["candidates", 0, "id"], 7), "candidates[0].id", "must be a string"),
    ("credit unknown node", _set(["candidates", 0, "credit"], {"n9": 5}),
     'candidates[0].credit["n9"]', "unknown node 'n9'"),
    ("credit float", _set(["candidates", 0, "credit", "n1"], 1.5), 'candidates[0].credit["n1"]',
     "must be an integer"),
    ("credit negative", _set(["candidates", 0, "credit", "n1"], -1),
     'candidates[0].credit["n1"]', "must be >= 0"),
    ("credit not object", _set(["candidates", 0, "credit"], ["n1"]), "candidates[0].credit",
     "must be an object"),
    ("eligible unknown node", _set(["candidates", 0, "eligible"], ["n1", "n2", "n3"]),
     "candidates[0].eligible[2]", "unknown node 'n3'"),
    ("eligible duplicate", _set(["candidates", 0, "eligible"], ["n2", "n2"]),
     "candidates[0].eligible[1]", "duplicate node"),
    ("eligible not array", _set(["candidates", 0, "eligible"], "n1"), "candidates[0].eligible",
     "must be an array"),
    ("eligible empty id", _set(["candidates", 0, "eligible"], [""]),
     "candidates[0].eligible[0]", "non-empty"),
    ("bad phase", _set(["candidates", 1, "phase"], "thinking"), "candidates[1].phase",
     "must be one of reasoning, new, acting"),
    ("misspelt field", _set(["candidates", 0, "eligable"], ["n1"]), "candidates[0].eligable",
     "unknown field"),
    ("unknown node field", _set(["nodes", 0, "gpu"], 1), "nodes[0].gpu", "unknown field"),
    ("third candidate", _append(["candidates"], {"id": "s3", "weight": "1", "ready": 0,
                                                 "tokens": 1}),
     "candidates[2].weight", "must be an integer"),
]  # fmt: skip


class TestRejects:
    """Every bad input raises ProblemError naming the field by its path, with a reason."""

    @pytest.mark.parametrize(
        ("mutate", "field", "reason"),
        [pytest.param(m, f, r, id=name) for name, m, f, r in BAD_DOCS],
    )
    def test_bad_field(self, mutate: Callable[[Doc], None], field: str, reason: str) -> None:
        """The error's field path is exact and its reason says what is wrong."""
        doc = valid()
        mutate(doc)
        err = error_of(json.dumps(doc))
        assert err.field_path == field
        assert reason in err.reason

    @pytest.mark.parametrize(
        ("text", "reason"),
        [
            pytest.param("", "not valid JSON (line 1 col 1)", id="empty"),
            pytest.param('{"quantum": 512,\n  "nodes": [}', "not valid JSON (line 2 col", id="bad"),
            pytest.param("[1, 2]", "must be an object, got array", id="array"),
            pytest.param('"text"', "must be an object, got string", id="string"),
            pytest.param('{"quantum": NaN}', "NaN", id="nan"),
            pytest.param('{"quantum": 1, "quantum": 2}', "duplicate key 'quantum'", id="dupkey"),
        ],
    )
    def test_bad_document(self, text: str, reason: str) -> None:
        """Unreadable or non-object input is reported against the field ``input``."""
        err = error_of(text)
        assert err.field_path == "input"
        assert reason in err.reason

    def test_invalid_utf8(self) -> None:
        """Bytes that are not UTF-8 are an input error, not a crash."""
        assert error_of(b"\xff\xfe{}").field_path == "input"

    def test_brief_example_names_unknown_node(self) -> None:
        """The format's illustrative snippet lists ``n2`` as eligible without defining it."""
        text = (
            '{"quantum": 512, "nodes": [{"id": "n1", "free": 100000}], "candidates": [{"id": "s1",'
            ' "weight": 12000, "credit": {"n1": 8192}, "ready": 1, "tokens": 11488,'
            ' "eligible": ["n1", "n2"]}]}'
        )
        err = error_of(text)
        assert (err.field_path, err.reason) == ("candidates[0].eligible[1]", "unknown node 'n2'")
