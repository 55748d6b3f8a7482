"""Every decoder, fuzzed with hypothesis: arbitrary bytes, arbitrary JSON / msgpack trees and
mutations of valid inputs are either decoded or refused with the decoder's own error (which a
service dead-letters and a CLI prints as one line) — never another exception, never a hang.

Decoders: every NATS message type (``decode``, the tool / session unions, ``decode_message``),
KV-event batches in the three msgpack encodings and their ZMQ frames, hook payloads and each
harness's mapper, gateway request bodies (chat, completions, Messages; identity and upstream
body), nodes files, tenants files, workload files and session-trace lines. Huge and deeply
nested JSON is covered by the strategies' depth and by explicit cases.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.gateway.apis import CHAT, COMPLETIONS, MESSAGES
from services.gateway.requests import (
    FIELD_TYPES,
    MAX_BODY_DEPTH,
    BadRequest,
    json_path,
    parse_body,
    read_body,
)
from services.tools.hooks import decode_hook
from shared.contracts import SessionRequest, codec
from shared.contracts.errors import ContractError
from shared.contracts.frames import parse_kv_frames
from shared.contracts.kv import KV_ENCODINGS, decode_kv_batch, encode_kv_batch
from shared.harness.registry import HARNESSES, mapper_for
from shared.infra.nodesfile import NodesFileError, load_nodes_file, parse_nodes
from shared.infra.tenants import TenantsFileError, load_tenants_file, parse_tenants
from shared.sim.dists import WorkloadError
from shared.sim.trace import parse_trace_line
from shared.sim.workloads import parse_workload
from tests.unit.contracts.test_contract_messages import SAMPLES

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
)
_keys = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["type", "session_id", "call_id", "tool", "ended_at", "started_at", "messages", "model",
         "role", "content", "stream", "max_tokens", "metadata", "user_id", "hook_event_name",
         "tool_name", "tool_input", "tool_use_id", "session", "event", "node", "url", "id",
         "turns", "workload", "family", "events", "ts"]
    ),
)  # fmt: skip
json_trees = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=6), st.dictionaries(_keys, inner, max_size=6)),
    max_leaves=40,
)


def only(allowed: tuple[type[BaseException], ...], fn: Callable[[], Any]) -> None:
    """``fn()`` returns, or raises one of ``allowed``; anything else fails the test."""
    with contextlib.suppress(*allowed):
        fn()


def _json_bytes(tree: object) -> bytes:
    try:
        return orjson.dumps(tree, option=orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # ints beyond 64 bits, NaN keys: as text
        return json.dumps(tree, default=str).encode()


MESSAGE_TYPES = sorted({type(m) for m in SAMPLES}, key=lambda t: t.__name__)
DECODERS: list[Callable[[bytes], object]] = [
    codec.decode_message,
    codec.decode_tool_event,
    codec.decode_session_event,
    *(lambda b, t=t: codec.decode(b, t) for t in MESSAGE_TYPES),
]


class TestNatsMessages:
    @FUZZ
    @given(data=st.binary(max_size=300))
    def test_bytes(self, data: bytes) -> None:
        for dec in DECODERS:
            only((ContractError,), lambda dec=dec: dec(data))

    @FUZZ
    @given(tree=json_trees)
    def test_json_trees(self, tree: object) -> None:
        data = _json_bytes(tree)
        for dec in DECODERS:
            only((ContractError,), lambda dec=dec: dec(data))

    @FUZZ
    @given(sample=st.sampled_from(SAMPLES), key=_keys, value=json_trees)
    def test_valid_messages_with_one_field_replaced(
        self, sample: Any, key: str, value: object
    ) -> None:
        doc = orjson.loads(codec.encode(sample))
        doc[key] = value
        data = _json_bytes(doc)
        only((ContractError,), lambda: codec.decode_message(data))
        only((ContractError,), lambda: codec.decode(data, type(sample)))


def _kv_tree() -> st.SearchStrategy[object]:
    leaf = st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
        st.text(max_size=10), st.binary(max_size=16),
    )  # fmt: skip
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
        ),
        max_leaves=30,
    )


class TestKvEvents:
    @FUZZ
    @given(data=st.binary(max_size=400))
    def test_bytes(self, data: bytes) -> None:
        only((ContractError,), lambda: decode_kv_batch(data))

    @FUZZ
    @given(tree=_kv_tree())
    def test_msgpack_trees(self, tree: object) -> None:
        data = msgspec.msgpack.encode(tree)
        only((ContractError,), lambda: decode_kv_batch(data))

    @FUZZ
    @given(
        encoding=st.sampled_from(KV_ENCODINGS),
        cut=st.integers(min_value=0, max_value=200),
        flip=st.integers(min_value=0, max_value=255),
    )
    def test_valid_batches_truncated_or_flipped(self, encoding: Any, cut: int, flip: int) -> None:
        good = encode_kv_batch(decode_kv_batch(_VALID_KV), encoding)
        short = good[: min(cut, len(good))]
        only((ContractError,), lambda: decode_kv_batch(short))
        at = cut % len(good)
        flipped = good[:at] + bytes([good[at] ^ flip]) + good[at + 1 :]
        only((ContractError,), lambda: decode_kv_batch(flipped))

    @FUZZ
    @given(frames=st.lists(st.binary(max_size=40), max_size=5))
    def test_frames(self, frames: list[bytes]) -> None:
        only((ContractError,), lambda: parse_kv_frames(frames))


_VALID_KV = msgspec.msgpack.encode(
    [1.5, [["BlockStored", [1, 2], None, [1, 2, 3, 4], 4, None]], None]
)


class TestHooks:
    @FUZZ
    @given(data=st.binary(max_size=300))
    def test_payload_bytes(self, data: bytes) -> None:
        only((ContractError,), lambda: decode_hook(data))

    @FUZZ
    @given(harness=st.sampled_from([h.name for h in HARNESSES]), tree=json_trees)
    def test_each_harness_mapper(self, harness: str, tree: object) -> None:
        """A decoded hook object of any shape maps or is refused with a ContractError (what
        the tools service dead-letters); a non-object never reaches the mapper."""
        data = _json_bytes(tree)
        try:
            payload = decode_hook(data)
        except ContractError:
            return
        mapper = mapper_for(harness)
        only((ContractError,), lambda: mapper.map(payload.body, 1_000.0))

    @FUZZ
    @given(
        harness=st.sampled_from([h.name for h in HARNESSES]),
        event=st.sampled_from(
            ["PreToolUse", "PostToolUse", "PostToolUseFailure", "SessionEnd", "SessionStart",
             "Stop", "SubagentStop", "tool.execute.before", "tool.execute.after",
             "session.idle", "session.deleted"]
        ),
        fields=st.dictionaries(_keys, json_trees, max_size=6),
    )  # fmt: skip
    def test_known_events_with_odd_fields(
        self, harness: str, event: str, fields: dict[str, object]
    ) -> None:
        body = {"hook_event_name": event, "event": event, "session_id": "s", **fields}
        mapper = mapper_for(harness)
        only((ContractError,), lambda: mapper.map(body, 1_000.0))


def _serve(data: bytes) -> None:
    """What the gateway does with a body before forwarding it, on every model endpoint: read,
    describe, find the session, register (the message must encode), build the node's body."""
    body = read_body(data)
    for api in (CHAT, COMPLETIONS, MESSAGES):
        try:
            info = api.describe(body)
        except BadRequest:
            continue
        api.identity({}, body, lambda: "gen")
        codec.encode(
            SessionRequest(
                session_id="s", request_id="r", model=info.model, arrived_at=0.0,
                gateway_id="g", prompt_tokens_estimate=info.prompt_tokens_estimate,
                messages_count=info.messages_count, stream=info.stream,
                max_tokens=info.max_tokens,
            )
        )  # fmt: skip
        orjson.dumps(api.upstream(body, info, token_ids=True))


_finite_trees = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=20),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=4)),
    max_leaves=20,
)
_MARK = "\u2603 the bad value \u2603"
_BAD_VALUES = [
    b'"\\ud800"',
    b'"ok \\udfff ok"',
    b'"\\ud83d\\u0041"',
    b'"\xff"',
    b'"ok \xed\xa0\x80"',
    b'"\xc3"',
    b"NaN",
    b"-Infinity",
    b"1e400",
    b"-2e308",
    b"[" * MAX_BODY_DEPTH + b"]" * MAX_BODY_DEPTH,
    b'{"a":' * 2_000 + b"1" + b"}" * 2_000,
]
"""Raw JSON that no body may hold: lone surrogate escapes, bytes that are not UTF-8 (a lone
continuation byte, an encoded surrogate, a truncated sequence), non-finite numbers, nesting
past the limit (the body adds at least one level) and past the parser's own."""


def _put(tree: dict[str, object], steps: list[int], value: object) -> list[str | int]:
    """Put ``value`` in place of a value of ``tree``, the one ``steps`` lead to (each the
    index of a child, modulo their count; a scalar or an empty container ends the walk);
    its path."""
    node: Any = tree
    path: list[str | int] = []
    for i, step in enumerate([*steps, 0]):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = keys[step % len(keys)]
        path.append(key)
        child = node[key]
        if i == len(steps) or not isinstance(child, dict | list) or not child:
            node[key] = value
            break
        node = child
    return path


class TestGatewayBodies:
    @FUZZ
    @given(tree=json_trees)
    def test_bodies(self, tree: object) -> None:
        """parse_body, describe, identity and the upstream body: BadRequest or an answer."""
        for api in (CHAT, COMPLETIONS, MESSAGES):

            def run(api: Any = api) -> None:
                body = parse_body(tree)
                info = api.describe(body)
                api.identity({}, body, lambda: "gen")
                api.upstream(body, info, token_ids=True)

            only((BadRequest,), run)

    @FUZZ
    @given(
        messages=json_trees,
        extra=st.dictionaries(
            st.sampled_from(["stream", "stream_options", "max_tokens", "max_completion_tokens",
                             "tools", "system", "metadata", "user", "program_id", "n",
                             "return_token_ids", "tao_script"]),
            json_trees, max_size=5,
        ),
    )  # fmt: skip
    def test_bodies_with_messages(self, messages: object, extra: dict[str, object]) -> None:
        tree = {"model": "m", "messages": messages, **extra}
        for api in (CHAT, MESSAGES):

            def run(api: Any = api) -> None:
                body = parse_body(tree)
                info = api.describe(body)
                api.upstream(body, info, token_ids=True)

            only((BadRequest,), run)

    @FUZZ
    @given(data=st.binary(max_size=300))
    def test_body_bytes(self, data: bytes) -> None:
        """Whatever the bytes, the body is refused (BadRequest) or served through."""
        only((BadRequest,), lambda: _serve(data))

    @FUZZ
    @given(tree=json_trees)
    def test_body_text(self, tree: object) -> None:
        only((BadRequest,), lambda: _serve(_json_bytes(tree)))

    @FUZZ
    @given(
        tree=st.dictionaries(_keys, _finite_trees, min_size=1, max_size=6),
        steps=st.lists(st.integers(min_value=0, max_value=50), max_size=6),
        bad=st.sampled_from(_BAD_VALUES),
    )  # fmt: skip
    def test_a_bad_value_anywhere_is_named(
        self, tree: dict[str, object], steps: list[int], bad: bytes
    ) -> None:
        """A lone surrogate, bytes that are not UTF-8, a number that is not finite or nesting
        past MAX_BODY_DEPTH, put at any place of a body: a 400 naming that place."""
        path = _put(tree, steps, _MARK)
        data = orjson.dumps(tree).replace(orjson.dumps(_MARK), bad)
        with pytest.raises(BadRequest) as err:
            read_body(data)
        assert f"at '{json_path(path[:8])}" in err.value.message, (path, err.value.message)

    @FUZZ
    @given(field=st.sampled_from([f for f, _, _ in FIELD_TYPES]), value=json_trees)
    def test_a_field_of_the_wrong_type_is_named(self, field: str, value: object) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], field: value}
        check = next(c for f, _, c in FIELD_TYPES if f == field)
        inner = value.get("user_id") if field == "metadata" and isinstance(value, dict) else None
        if inner is not None and type(inner) is not str:  # the field inside it the gateway reads
            with pytest.raises(BadRequest, match=r"'metadata\.user_id' must be"):
                parse_body(body)
        elif value is None or check(value):
            parse_body(body)
        else:
            with pytest.raises(BadRequest, match=f"'{field}' must be"):
                parse_body(body)

    def test_deep_and_huge_json(self) -> None:
        """10,000 levels of nesting and a 5 MB message: refused or described, no crash."""
        deep: object = "x"
        for _ in range(10_000):
            deep = [deep]
        for tree in (
            {"model": "m", "messages": deep},
            {"model": "m", "messages": [{"role": "user", "content": "y" * 5_000_000}]},
        ):
            for api in (CHAT, MESSAGES):
                only((BadRequest,), lambda api=api, tree=tree: api.describe(parse_body(tree)))
        nested = b"[" * 100_000 + b"]" * 100_000
        for body in (nested, b'{"messages":' + nested + b"}", b'{"a":' * 50_000 + b"1"):
            with pytest.raises(BadRequest):
                read_body(body)
        for dec in DECODERS:
            only((ContractError,), lambda dec=dec: dec(nested))
        only((ContractError,), lambda: decode_hook(nested))


_tenant_keys = st.one_of(_keys, st.sampled_from(["name", "api_keys", "hook_tokens", "max_held"]))


class TestFiles:
    @FUZZ
    @given(tree=json_trees)
    def test_nodes_documents(self, tree: object) -> None:
        """parse_nodes' contract is ValueError naming the node and key (load_nodes_file
        turns it into one NodesFileError line)."""
        doc = tree if isinstance(tree, dict) else {"node": tree}
        only((ValueError,), lambda: parse_nodes(doc))

    @FUZZ
    @given(nodes=st.lists(st.dictionaries(_keys, json_trees, max_size=6), max_size=3))
    def test_node_tables(self, nodes: list[dict[str, object]]) -> None:
        only((ValueError,), lambda: parse_nodes({"node": nodes}))

    @FUZZ
    @given(data=st.one_of(st.text(max_size=300).map(str.encode), st.binary(max_size=100)))
    def test_nodes_files(self, data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
        """Any bytes, UTF-8 or not (atheris found b"\xcc\xa5\xc5\xe5" escaping as
        UnicodeDecodeError), are read or refused with one NodesFileError."""
        path = tmp_path_factory.mktemp("nodes") / "nodes.toml"
        path.write_bytes(data)
        only((NodesFileError,), lambda: load_nodes_file(path))

    def test_non_utf8_nodes_file(self, tmp_path: Path) -> None:
        path = tmp_path / "nodes.toml"
        path.write_bytes(b"\xcc\xa5\xc5\xe5")
        with pytest.raises(NodesFileError, match="not UTF-8"):
            load_nodes_file(path)

    @FUZZ
    @given(tree=json_trees)
    def test_tenants_documents(self, tree: object) -> None:
        """parse_tenants' contract is ValueError naming the tenant and key."""
        doc = tree if isinstance(tree, dict) else {"tenant": tree}
        only((ValueError,), lambda: parse_tenants(doc))

    @FUZZ
    @given(tenants=st.lists(st.dictionaries(_tenant_keys, json_trees, max_size=5), max_size=3))
    def test_tenant_tables(self, tenants: list[dict[str, object]]) -> None:
        only((ValueError,), lambda: parse_tenants({"tenant": tenants}))

    @FUZZ
    @given(data=st.one_of(st.text(max_size=300).map(str.encode), st.binary(max_size=100)))
    def test_tenants_files(self, data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
        path = tmp_path_factory.mktemp("tenants") / "tenants.toml"
        path.write_bytes(data)
        only((TenantsFileError,), lambda: load_tenants_file(path))

    @FUZZ
    @given(tree=json_trees)
    def test_workload_documents(self, tree: object) -> None:
        doc = tree if isinstance(tree, dict) else {"family": tree}
        only((WorkloadError,), lambda: parse_workload(doc, "fuzz"))

    @FUZZ
    @given(tree=json_trees)
    def test_trace_lines(self, tree: object) -> None:
        only((WorkloadError,), lambda: parse_trace_line(tree, "fuzz:1"))

    @FUZZ
    @given(turns=st.lists(st.dictionaries(_keys, json_trees, max_size=6), min_size=1, max_size=3))
    def test_trace_lines_with_turns(self, turns: list[dict[str, object]]) -> None:
        doc = {"session_id": "s", "family": "f", "shared_prefix": 10, "turns": turns}
        only((WorkloadError,), lambda: parse_trace_line(doc, "fuzz:1"))


@pytest.mark.parametrize("encoding", KV_ENCODINGS)
def test_the_valid_kv_sample_decodes(encoding: Any) -> None:
    """The seed the flip/truncate cases start from is itself valid in every encoding."""
    batch = decode_kv_batch(encode_kv_batch(decode_kv_batch(_VALID_KV), encoding))
    assert len(batch.events) == 1
