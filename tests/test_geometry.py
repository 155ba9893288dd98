"""rapid.core.geometry: depths, positions, the one ancestor-mask builder and its causal (chain) case."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core.geometry import ROOT, ancestor_mask, causal_allowed, node_positions, tree_depths

FAST = settings(max_examples=80, deadline=None)


def ancestors(parents: list[int], i: int) -> list[int]:
    out = []
    while parents[i] != ROOT:
        i = parents[i]
        out.append(i)
    return out


def test_depths_and_positions():
    parents = [-1, 0, -1, 1, 0]
    assert tree_depths(parents) == [1, 2, 1, 3, 2]
    assert node_positions(tree_depths(parents), 10) == [11, 12, 11, 13, 12]
    assert tree_depths([]) == []


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 16), kv_len=st.integers(0, 6))
def test_contiguous_tree_rows(seed, n, kv_len):
    """A whole tree fed after ``kv_len`` slots (the export's parity step)."""
    rng = np.random.default_rng(seed)
    parents = [int(rng.integers(-1, j)) if j else -1 for j in range(n)]
    allowed = ancestor_mask(parents, range(n), [kv_len + j for j in range(n)], kv_len)
    assert allowed.shape == (n, kv_len + n) and allowed.dtype == bool
    for j in range(n):
        expect = set(range(kv_len)) | {kv_len + a for a in ancestors(parents, j)} | {kv_len + j}
        assert set(np.flatnonzero(allowed[j]).tolist()) == expect


@pytest.mark.parametrize("kv_len,t", [(0, 1), (0, 7), (5, 1), (3, 4)])
def test_causal_is_the_chain_case(kv_len, t):
    chain = [ROOT, *range(t - 1)]
    expect = ancestor_mask(chain, range(t), [kv_len + j for j in range(t)], kv_len)
    assert np.array_equal(causal_allowed(kv_len, t), expect)


def test_root_row_and_see():
    """ROOT as a row sees ``[0, see)`` and itself; nodes also see their fed ancestors."""
    allowed = ancestor_mask([ROOT, 0], [ROOT, 0, 1], [4, 5], 3, see=4)
    assert allowed.tolist() == [[True] * 4 + [False, False],
                                [True] * 5 + [False],
                                [True] * 6]


def test_rejects_unfed_ancestor_and_forward_parent():
    with pytest.raises(ValueError, match="not been fed"):
        ancestor_mask([ROOT, 0], [1], [-1, -1], 3)
    with pytest.raises(ValueError, match="must come before"):
        ancestor_mask([ROOT, 1], [1], [0, 1], 3)
