"""Trees verified as root-to-leaf chains (rapid.server.chains): layout, commit, and the tree
shape whose ancestor-mask forward broke bitwise equality on the real bf16 target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rapid.core.acceptance import Verdict
from rapid.core.sampling import SamplingParams
from rapid.kvcache import StaticKV
from rapid.server.chains import commit, leaf_chains
from rapid.server.invariance import compare_tree
from rapid.server.target import TargetSession

HOLES = [-1, 0, 0, 1, 2, 3]  # node 5 sees nodes 0, 1, 3 but not 2 and 4 between them


@pytest.mark.parametrize("parents, chains", [
    ([], [[0]]),
    ([-1], [[0, 1]]),
    ([-1, 0, 1], [[0, 1, 2, 3]]),
    ([-1, -1, 0, 0], [[0, 2], [0, 1, 3], [0, 1, 4]]),
    (HOLES, [[0, 1, 3, 5], [0, 1, 2, 4, 6]]),
])
def test_leaf_chains(parents, chains):
    assert leaf_chains(parents) == chains


def test_every_node_is_on_a_chain_and_chains_start_at_the_root():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 20))
        parents = [int(rng.integers(-1, j)) for j in range(n)]
        chains = leaf_chains(parents)
        assert {r for c in chains for r in c} == set(range(n + 1))
        for c in chains:
            assert c[0] == 0 and all(parents[b - 1] == (a - 1 if a else -1) for a, b in zip(c, c[1:], strict=False))


def test_commit_appends_root_and_path_and_a_failed_lookup_changes_nothing(tiny_pair):
    target, _ = tiny_pair
    s = TargetSession(target, [1, 2, 3, 4], SamplingParams())
    before = (s.kv.length, s.kv.k.clone())
    result = s.forward_tree([9, 8, 7], [-1, -1, 1])
    assert s.kv.length == before[0] and torch.equal(s.kv.k, before[1])  # the forward wrote nothing
    s.commit(result, Verdict((1, 2), 5), [9, 8, 7])
    assert s.tokens == [1, 2, 3, 4, 8, 7, 5] and s.kv.length == before[0] + 3
    step = TargetSession(target, s.tokens, SamplingParams())  # the same sequence, prefilled
    assert torch.allclose(s.kv.k[:, :, : s.kv.length], step.kv.k[:, :, : s.kv.length], atol=1e-12)
    with pytest.raises(ValueError, match="not a root path"):  # a path that is on no chain
        commit(result, StaticKV.for_config(target.config, 32, target.dtype), [0, 1, 3])


def test_the_holes_tree_is_bitwise_in_bf16(real_shapes_bf16):
    rng = np.random.default_rng(1)
    for _ in range(3):
        prompt = [int(x) for x in rng.integers(0, 150000, 80)]
        tokens = [int(x) for x in rng.integers(0, 150000, len(HOLES))]
        check = compare_tree(real_shapes_bf16, prompt, tokens, HOLES)
        assert check.invariant, check
