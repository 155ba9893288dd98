"""rapid.core.acceptance: sample-then-match acceptance, tree validation, finish."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core.acceptance import Verdict, accept, finish, validate_tree
from rapid.core.geometry import ROOT


def random_tree(rng: np.random.Generator, n: int, vocab: int):
    parents = [int(rng.integers(-1, j)) if j else -1 for j in range(n)]
    tokens = rng.integers(0, vocab, size=n).tolist()
    return tokens, parents


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 25), vocab=st.integers(1, 4))
def test_accept_properties(seed, n, vocab):
    rng = np.random.default_rng(seed)
    tokens, parents = random_tree(rng, n, vocab)
    picks = rng.integers(0, vocab, size=n + 1).tolist()
    v = accept(tokens, parents, picks)
    assert isinstance(v, Verdict) and v.emitted == len(v.path) + 1

    def pick_after(node):
        return picks[0] if node == ROOT else picks[node + 1]

    # a chain from the root whose tokens equal the target's picks along it
    prev = ROOT
    for j in v.path:
        assert parents[j] == prev
        assert tokens[j] == pick_after(prev)
        # the first sibling carrying the pick wins
        assert j == min(k for k in range(n) if parents[k] == prev and tokens[k] == tokens[j])
        prev = j
    # maximal: no child of the end carries the pick; the bonus is that pick
    assert not any(parents[k] == prev and tokens[k] == pick_after(prev) for k in range(n))
    assert v.bonus == pick_after(prev) and isinstance(v.bonus, int)


def test_accept_hand_example():
    #        ROOT
    #       /    \
    #   0:(5)   1:(6)
    #     |       |
    #   2:(7)   3:(8)
    #     |
    #   4:(9)
    tokens, parents = [5, 6, 7, 8, 9], [-1, -1, 0, 1, 2]
    # picks row: [root, after 0, after 1, after 2, after 3, after 4]
    assert accept(tokens, parents, [6, 0, 8, 0, 0, 0]) == Verdict((1, 3), 0)
    assert accept(tokens, parents, [5, 7, 0, 9, 0, 4]) == Verdict((0, 2, 4), 4)
    assert accept(tokens, parents, [5, 3, 0, 9, 0, 4]) == Verdict((0,), 3)
    assert accept(tokens, parents, [1, 7, 8, 9, 0, 4]) == Verdict((), 1)
    assert accept([], [], [42]) == Verdict((), 42)
    # duplicate sibling tokens: the first one is the accepted one
    assert accept([3, 3, 4], [-1, -1, 1], [3, 9, 4, 0]) == Verdict((0,), 9)


@pytest.mark.parametrize("tokens,parents,picks", [
    ([1, 2], [-1], [0, 0, 0]),
    ([1], [-1], [0]),
    ([1], [-1], [0, 0, 0]),
])
def test_accept_length_mismatch(tokens, parents, picks):
    with pytest.raises(ValueError):
        accept(tokens, parents, picks)


def test_validate_tree_accepts_good_trees():
    assert validate_tree([], [], 10, 4) is None
    assert validate_tree([0, 9, 3, 3], [-1, 0, -1, 2], 10, 4) is None


@pytest.mark.parametrize("tokens,parents,needle", [
    ([1, 2], [-1], "2 tokens but 1 parents"),
    ([1, 2, 3, 4, 5], [-1, 0, 1, 2, 3], "more than the session limit 4"),
    ([1, 10], [-1, 0], "token 10 outside the vocabulary"),
    ([1, -1], [-1, 0], "token -1 outside the vocabulary"),
    ([1, 2], [-1, 1], "parent 1 must be"),  # self reference
    ([1, 2, 3], [-1, 2, 0], "node 1: parent 2"),  # forward reference (would allow a cycle)
    ([1, 2], [-1, 7], "parent 7"),  # out of range
    ([1, 2], [-2, 0], "node 0: parent -2"),
    ([1], [0], "node 0: parent 0"),
])
def test_validate_tree_messages(tokens, parents, needle):
    why = validate_tree(tokens, parents, 10, 4)
    assert why is not None and needle in why


@settings(max_examples=100, deadline=None)
@given(parents=st.lists(st.integers(-3, 12), max_size=10), vocab=st.integers(1, 5))
def test_validate_tree_matches_definition(parents, vocab):
    tokens = [j % vocab for j in range(len(parents))]
    ok = all(-1 <= p < j for j, p in enumerate(parents))
    assert (validate_tree(tokens, parents, vocab, 10) is None) == ok


def test_finish():
    assert finish([1, 2, 3], 5, ()) == ([1, 2, 3], False)
    assert finish([1, 2, 3, 4, 5], 5, ()) == ([1, 2, 3, 4, 5], True)
    assert finish([1, 2, 3, 4, 5, 6, 7], 5, ()) == ([1, 2, 3, 4, 5], True)
    assert finish([1, 9, 3, 9], 5, (9,)) == ([1, 9], True)  # the stop token is kept
    assert finish([9], 5, (7, 9)) == ([9], True)
    assert finish([1, 2, 3, 4, 5, 9], 5, (9,)) == ([1, 2, 3, 4, 5], True)  # stop beyond max_new
    assert finish([], 3, (9,)) == ([], False)
    assert finish([4], 0, ()) == ([], True)
