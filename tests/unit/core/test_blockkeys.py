"""TAO's own block-key chain (shared/core/blockkeys.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.blockkeys import ROOT, block_key, chain_keys, root_for
from shared.core.kvseq import SeqTracker

tokens_st = st.lists(st.integers(0, 2**32 - 1), max_size=200)


@given(tokens_st, st.integers(1, 32))
def test_chain_is_block_key_folded_over_full_blocks(tokens: list[int], bs: int) -> None:
    keys = chain_keys(tokens, bs)
    assert len(keys) == len(tokens) // bs
    parent = ROOT
    for j, key in enumerate(keys):
        assert key == block_key(parent, tokens[j * bs : (j + 1) * bs])
        parent = key


@given(tokens_st, tokens_st, st.integers(1, 16))
def test_shared_prefix_gives_shared_leading_keys(a: list[int], b: list[int], bs: int) -> None:
    ka, kb = chain_keys(a, bs), chain_keys(a + b, bs)
    assert kb[: len(ka)] == ka


def test_keys_depend_on_parent_and_root() -> None:
    block = [1, 2, 3, 4]
    assert chain_keys(block * 2, 4)[1] != chain_keys(block, 4)[0]
    assert chain_keys(block, 4, root_for("adapter")) != chain_keys(block, 4)
    assert root_for(None) == ROOT and root_for(3) != root_for("3x")


def test_bad_inputs_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="block_size"):
        chain_keys([1, 2], 0)
    with pytest.raises(ValueError, match="token id -1"):
        chain_keys([1, -1], 2)


def test_seq_tracker_rules() -> None:
    t = SeqTracker()
    assert t.classify(7) == "next"
    t.accept(7)
    assert t.classify(8) == "next"
    assert t.classify(10) == "gap"
    assert t.classify(7) == "restart" and t.classify(0) == "restart"
    assert t.restart() == 1 and t.last is None and t.classify(0) == "next"
