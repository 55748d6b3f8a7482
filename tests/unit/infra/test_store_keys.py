"""Redis key names (shared.infra.keys) and the store's record encodings (store_codec)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.predictor import ToolStats, fold
from shared.core.session import Session, ToolCall
from shared.infra.keys import GLOBAL_TOOL_FIELD, KeyNameError, Keys, tool_field
from shared.infra.store_codec import (
    decode_node,
    decode_residency,
    decode_session,
    decode_toolstats,
    encode_node_fields,
    encode_residency,
    encode_session,
    encode_toolstats,
)
from shared.infra.store_types import NodeRecord, NodeUpdate, StoreError, merge_node


def _slot_tag(key: str) -> str:
    """The Redis Cluster hash tag of ``key``: between the first '{' and the next '}'."""
    start = key.index("{")
    return key[start + 1 : key.index("}", start + 1)]


class TestKeys:
    def test_layout(self) -> None:
        """Keys follow the documented tao:{domain}:... layout."""
        k = Keys("default")
        assert k.session("abc") == "tao:{default}:s:abc"
        assert k.node("n1") == "tao:{default}:n:n1"
        assert k.residency("abc") == "tao:{default}:res:abc"
        assert k.pool == "tao:{default}:pool"
        assert k.admitted_tool == "tao:{default}:admitted_tool"
        assert k.node_prefix + "n1" == k.node("n1")

    @given(st.text(min_size=1, max_size=60))
    def test_any_session_id_keeps_the_hash_tag(self, sid: str) -> None:
        """Whatever the session id, its keys stay in the domain's hash slot and are distinct."""
        k = Keys("d1")
        try:
            key = k.session(sid)
        except KeyNameError:
            return  # unencodable (lone surrogates) or too long: refused, never mangled
        assert _slot_tag(key) == "d1"
        rest = key[len("tao:{d1}:s:") :]
        assert all(c.isascii() and (c.isalnum() or c in "_-~") for c in rest)

    def test_escaping_is_injective_on_tricky_ids(self) -> None:
        """Ids differing only in escaped characters get different keys."""
        k = Keys("d")
        ids = ["a:b", "a~3Ab", "a}b", "a{b", "a b", "ü", "~C3~BC"]
        assert len({k.session(i) for i in ids}) == len(ids)

    @pytest.mark.parametrize("bad", ["", "a}", "a{b", "a:b", "x" * 129])
    def test_bad_domain(self, bad: str) -> None:
        """Domains must be plain names, so the hash tag is unambiguous."""
        with pytest.raises(KeyNameError, match="domain"):
            Keys(bad)

    @pytest.mark.parametrize("bad", ["", "n 1", "n:1", "n{1}"])
    def test_bad_node_and_session(self, bad: str) -> None:
        """Malformed node ids and empty session ids are refused, naming what was wrong."""
        with pytest.raises(KeyNameError, match="node id"):
            Keys().node(bad)
        with pytest.raises(KeyNameError, match="session id"):
            Keys().session("")

    def test_tool_field_never_collides_with_global(self) -> None:
        """A tool named 'global' does not overwrite the aggregate field."""
        assert tool_field("global") != GLOBAL_TOOL_FIELD


_floats = st.floats(-1e12, 1e12, allow_nan=False)
_opt = st.none() | _floats


class TestCodec:
    @given(
        at=_floats,
        mark=_opt,
        tokens=st.integers(0, 10**9),
        deadline=_opt,
        node=st.none() | st.sampled_from(["n1", "n2"]),
        tool=st.booleans(),
    )
    def test_session_round_trip(
        self,
        at: float,
        mark: float | None,
        tokens: int,
        deadline: float | None,
        node: str | None,
        tool: bool,
    ) -> None:
        """A session hash decodes to the identical record, floats bit for bit."""
        call = ToolCall("c", "bash", at / 3, source="hook", deadline=deadline) if tool else None
        s = Session(id="x:{y}", version=7, activity="tool", node=node, weight=5 if node else 0,
                    tokens=tokens, tool=call, probe_mark=mark, created_at=at / 7,
                    updated_at=at)  # fmt: skip
        assert decode_session(encode_session(s)) == s
        raw = {k.encode(): v.encode() for k, v in encode_session(s).items()}
        assert decode_session(raw) == s

    def test_separate_fields_win_over_data(self) -> None:
        """The Lua-written fields override the JSON copy (the apply script writes only them)."""
        fields = encode_session(Session(id="a", version=1, activity="waiting"))
        fields.update(v="2", node="n1", weight="700", activity="running", updated_at="3.5")
        s = decode_session(fields)
        assert s == Session(id="a", version=2, activity="running", node="n1", weight=700,
                            updated_at=3.5)  # fmt: skip

    def test_corrupt_session(self) -> None:
        """A record missing fields is a StoreError, not a KeyError."""
        with pytest.raises(StoreError, match="corrupt"):
            decode_session({"v": "1"})

    def test_non_finite_refused(self) -> None:
        """Infinite times are refused on write (JSON would turn them into null)."""
        with pytest.raises(StoreError, match="probe_mark"):
            encode_session(Session(id="a", probe_mark=math.inf))

    def test_node_round_trip(self) -> None:
        """A node hash plus its reserved field decodes to the same record."""
        rec = NodeRecord(id="n1", url="http://h:1", capacity_tokens=1000, target_utilisation=0.7,
                         reserved=42, healthy=True, models=frozenset({"m"}), usage=1 / 3,
                         prefix_cache_queries=5, updated_at=0.1 + 0.2)  # fmt: skip
        fields = encode_node_fields(rec)
        assert "reserved" not in fields and fields["usable"] == "700"
        assert decode_node("n1", {**fields, "reserved": "42"}) == rec
        assert decode_node("n1", {"reserved": "5"}) == NodeRecord(id="n1", reserved=5)
        assert decode_node("n1", {}) is None

    def test_merge_node_validates(self) -> None:
        """merge_node keeps unspecified fields and names a bad one."""
        old = NodeRecord(id="n", capacity_tokens=10, healthy=True)
        assert merge_node(old, NodeUpdate(usage=1)) == NodeRecord(
            id="n", capacity_tokens=10, healthy=True, usage=1.0
        )
        with pytest.raises(StoreError, match="healthy"):
            merge_node(old, NodeUpdate(healthy="yes"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="reserved"):  # only apply moves it
            NodeUpdate(reserved=5)  # type: ignore[call-arg]

    @given(st.lists(st.floats(0, 1e6, allow_nan=False), max_size=5), st.booleans())
    def test_toolstats_round_trip(self, durations: list[float], cut: bool) -> None:
        """Tool statistics, infinities of the empty case included, round-trip exactly."""
        stats = fold(durations)
        if cut:
            stats = replace(stats, censored=2, censored_max_s=9.5)
        assert decode_toolstats(encode_toolstats(stats)) == stats
        assert decode_toolstats(None) == ToolStats()

    def test_residency_round_trip(self) -> None:
        """Residency values keep k0 and t_obs exactly."""
        raw = {b"n1": encode_residency(512, 1 / 3).encode()}
        assert decode_residency(raw) == {"n1": (512, 1 / 3)}
