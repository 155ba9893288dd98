"""rapid.runtime.tree: budgeted expansion, pruning, sub-trees; the drafter's attention rows (rapid.core.geometry)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core.geometry import ROOT, ancestor_mask, node_positions
from rapid.runtime.tree import TokenTree, TreeParams, best_tokens

FAST = settings(max_examples=60, deadline=None)


def logprob_row(rng: np.random.Generator, vocab: int) -> np.ndarray:
    z = rng.normal(0.0, 2.0, size=vocab)
    return z - np.log(np.exp(z - z.max()).sum()) - z.max()


def grow(rng: np.random.Generator, params: TreeParams, vocab: int, prefix_len: int = 0,
         stop_ids: tuple[int, ...] = ()) -> TokenTree:
    """Budgeted best-first expansion with random draft rows; feeding = assigning the next slot."""
    tree = TokenTree()
    next_slot = prefix_len
    tree.set_best(ROOT, best_tokens(logprob_row(rng, vocab), params.topk))
    tree.add_children(ROOT, params.topk, stop_ids)
    tree.prune(params.budget)
    check_invariants(tree)
    for _ in range(1, params.depth):
        front = tree.frontier(params.width, stop_ids=stop_ids)
        assert front == sorted(front) and all(tree.expandable(i) for i in front)
        for i in front:
            tree.slot[i] = next_slot
            next_slot += 1
            tree.set_best(i, best_tokens(logprob_row(rng, vocab), params.topk))
        for i in front:
            tree.add_children(i, params.topk, stop_ids)
        before = tree.copy()
        kept = tree.prune(params.budget)
        check_prune(before, tree, kept, params.budget)
        check_invariants(tree)
    return tree


def check_invariants(tree: TokenTree) -> None:
    n = len(tree)
    assert all(len(getattr(tree, f)) == n for f in ("tokens", "parents", "depth", "score", "slot", "top"))
    for i in range(n):
        p = tree.parents[i]
        assert -1 <= p < i
        assert tree.depth[i] == (1 if p == ROOT else tree.depth[p] + 1)
        if p != ROOT:
            assert tree.score[i] <= tree.score[p]
        if tree.slot[i] >= 0 and p != ROOT:
            assert tree.slot[p] >= 0  # fed nodes have fed ancestors


def check_prune(before: TokenTree, after: TokenTree, kept: list[int], budget: int) -> None:
    assert kept == sorted(set(kept))
    assert len(after) == len(kept) <= budget
    if len(before) <= budget:
        assert kept == list(range(len(before)))
        return
    # ancestor-closed
    ks = set(kept)
    for i in kept:
        assert all(a in ks for a in before.path(i))
    # the highest scores: nothing dropped beats anything kept
    dropped = [i for i in range(len(before)) if i not in ks]
    assert min(before.score[i] for i in kept) >= max(before.score[i] for i in dropped)
    assert len(kept) == budget  # log-probs <= 0, so the best `budget` are already closed
    # payload follows the nodes
    for new, old in enumerate(kept):
        assert after.tokens[new] == before.tokens[old]
        assert after.score[new] == before.score[old]
        assert after.slot[new] == before.slot[old]
        assert after.depth[new] == before.depth[old]
        po = before.parents[old]
        assert after.parents[new] == (ROOT if po == ROOT else kept.index(po))


@FAST
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 5), budget=st.integers(1, 24),
       topk=st.integers(1, 5), width=st.integers(1, 5), vocab=st.integers(2, 30))
def test_expansion_keeps_best_ancestor_closed_budget(seed, depth, budget, topk, width, vocab):
    params = TreeParams(depth=depth, budget=budget, topk=topk, width=width)
    tree = grow(np.random.default_rng(seed), params, vocab)
    assert 1 <= len(tree) <= budget
    assert tree.max_depth <= depth
    for i in range(len(tree)):
        kids = [tree.tokens[j] for j in tree.children(i)]
        assert len(kids) == len(set(kids)) <= topk  # siblings carry distinct tokens
        assert all(0 <= t < vocab for t in kids)


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(2, 30), budget=st.integers(1, 30))
def test_prune_on_random_trees(seed, n, budget):
    rng = np.random.default_rng(seed)
    tree = TokenTree()
    for i in range(n):
        p = int(rng.integers(-1, i))
        tree.parents.append(p)
        tree.tokens.append(int(rng.integers(0, 50)))
        tree.depth.append(1 if p == ROOT else tree.depth[p] + 1)
        # scores fall along a path; coarse values make ties common
        drop = float(rng.choice([0.0, -0.5, -1.0, -2.0]))
        tree.score.append((0.0 if p == ROOT else tree.score[p]) + drop)
        tree.slot.append(-1)
        tree.top.append(None)
    before = tree.copy()
    kept = tree.prune(budget)
    check_prune(before, tree, kept, budget)
    check_invariants(tree)


def test_best_tokens_sort_descending_ties_by_id():
    tree = TokenTree()
    lp = np.log(np.array([0.1, 0.3, 0.05, 0.3, 0.25]))
    tree.set_best(ROOT, best_tokens(lp, 3))
    assert [t for t, _ in tree.root_top] == [1, 3, 4]
    assert tree.root_top[0][1] == pytest.approx(np.log(0.3))
    tree.set_best(ROOT, best_tokens(lp, 10))  # more than the vocabulary
    assert [t for t, _ in tree.root_top] == [1, 3, 4, 0, 2]


def test_add_children_scores_depths_and_stop_tokens():
    tree = TokenTree()
    tree.set_best(ROOT, best_tokens(np.log(np.array([0.5, 0.3, 0.2])), 3))
    tree.add_children(ROOT, 2)
    assert tree.tokens == [0, 1] and tree.parents == [ROOT, ROOT] and tree.depth == [1, 1]
    assert tree.slot == [-1, -1] and tree.top == [None, None]
    with pytest.raises(ValueError):
        tree.add_children(0, 2)  # not fed yet
    tree.slot[0] = 0
    tree.set_best(0, best_tokens(np.log(np.array([0.1, 0.1, 0.8])), 2))
    tree.add_children(0, 2)
    assert tree.tokens[2:] == [2, 0] and tree.parents[2:] == [0, 0] and tree.depth[2:] == [2, 2]
    assert tree.score[2] == pytest.approx(np.log(0.5) + np.log(0.8))
    # a stop token gets no children
    tree.slot[2] = 1
    tree.set_best(2, best_tokens(np.log(np.array([0.4, 0.4, 0.2])), 2))
    tree.add_children(2, 2, stop_ids=(2,))
    assert len(tree) == 4


def test_frontier_picks_best_expandable_at_any_depth_in_index_order():
    tree = TokenTree(tokens=[1, 2, 3, 4, 5, 6], parents=[ROOT, ROOT, ROOT, 0, 0, 3],
                     depth=[1, 1, 1, 2, 2, 3], score=[-0.2, -0.5, -0.9, -2.0, -0.4, -2.5],
                     slot=[-1, -1, -1, -1, -1, -1], top=[None] * 6)
    assert tree.frontier(2) == [0, 1]
    assert tree.frontier(4) == [0, 1, 2]  # nodes 3-5 have an unfed parent
    tree.slot[0] = 7
    assert tree.frontier(2) == [1, 4]  # depth 2 beats depth 1 on score
    assert tree.frontier(2, among=[3, 4, 5]) == [3, 4]
    assert tree.frontier(9, stop_ids=(5,)) == [1, 2, 3]
    tree.slot[3] = 8
    assert tree.frontier(1) == [4] and tree.frontier(9, among=[5]) == [5]


def test_merge_child_keeps_one_child_per_token_with_the_higher_score():
    tree = TokenTree()
    a = tree.merge_child(7, ROOT, 1, -1.0)
    assert tree.merge_child(7, ROOT, 1, -0.5) == a and tree.score[a] == -0.5
    assert tree.merge_child(7, ROOT, 1, -3.0) == a and tree.score[a] == -0.5
    b = tree.merge_child(8, ROOT, 1, -2.0)
    assert b != a and len(tree) == 2


def test_add_chain_merges_into_the_tree_and_stops_after_a_stop_token():
    tree = TokenTree()
    tree.set_best(ROOT, [(5, -0.1), (6, -2.0)])
    tree.add_children(ROOT, 2)
    lp = float(np.log(0.5))
    tree.add_chain([6, 9, 2, 4], lp, stop_ids=(2,))
    assert tree.tokens == [5, 6, 9, 2] and tree.parents == [ROOT, ROOT, 1, 2]
    assert tree.depth == [1, 1, 2, 3]
    assert tree.score[1] == pytest.approx(lp)  # the lookup prior beat the draft's -2.0
    assert tree.score[3] == pytest.approx(3 * lp)
    check_invariants(tree)
    tree.add_chain([5, 9], lp)  # the draft's node keeps its better score; 9 goes below it
    assert tree.score[0] == -0.1 and tree.parents[4] == 0 and tree.score[4] == pytest.approx(-0.1 + lp)


def random_fed_tree(rng, n, prefix_len):
    tree = TokenTree()
    slot = prefix_len
    for i in range(n):
        p = int(rng.integers(-1, i))
        tree.parents.append(p)
        tree.tokens.append(int(rng.integers(0, 100)))
        tree.depth.append(1 if p == ROOT else tree.depth[p] + 1)
        tree.score.append((0.0 if p == ROOT else tree.score[p]) - float(rng.random()))
        tree.top.append(None)
        tree.slot.append(-1)
    # feed a random ancestor-closed subset, parents first, with slots in feeding order
    for i in range(n):
        p = tree.parents[i]
        if (p == ROOT or tree.slot[p] >= 0) and rng.random() < 0.6:
            tree.slot[i] = slot
            slot += 1
    return tree, slot


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 20), prefix_len=st.integers(0, 6))
def test_drafter_attention_rows(seed, n, prefix_len):
    rng = np.random.default_rng(seed)
    tree, kv_len = random_fed_tree(rng, n, prefix_len)
    # feed the unfed nodes whose ancestors are all fed
    nodes = [i for i in range(n) if tree.slot[i] < 0
             and all(tree.slot[a] >= 0 for a in tree.path(i)[:-1])]
    allowed = ancestor_mask(tree.parents, nodes, tree.slot, kv_len, see=prefix_len)
    assert allowed.shape == (len(nodes), kv_len + len(nodes)) and allowed.dtype == bool
    for r, i in enumerate(nodes):
        expect = set(range(prefix_len)) | {tree.slot[a] for a in tree.path(i)[:-1]} | {kv_len + r}
        assert set(np.flatnonzero(allowed[r]).tolist()) == expect


def test_drafter_attention_rejects_unfed_ancestor():
    tree = TokenTree(tokens=[1, 2], parents=[ROOT, 0], depth=[1, 2], score=[-1.0, -2.0],
                     slot=[-1, -1], top=[None, None])
    with pytest.raises(ValueError):
        ancestor_mask(tree.parents, [1], tree.slot, 3)
    assert ancestor_mask(tree.parents, [0], tree.slot, 3).tolist() == [[True, True, True, True]]


def test_drafter_attention_sees_ancestors_fed_earlier_in_the_same_step():
    """A path of unfed nodes (a prompt-lookup chain) goes in one forward: each row sees its fed
    ancestors' slots and the rows of its ancestors fed before it in the step."""
    tree = TokenTree(tokens=[1, 2, 3, 4], parents=[ROOT, 0, 1, 0], depth=[1, 2, 3, 2], score=[0.0] * 4,
                     slot=[3, -1, -1, -1], top=[None] * 4)
    allowed = ancestor_mask(tree.parents, [1, 2, 3], tree.slot, 4, see=3)
    assert [np.flatnonzero(r).tolist() for r in allowed] == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 6]]
    with pytest.raises(ValueError, match="earlier row"):  # the parent comes after its child in the step
        ancestor_mask(tree.parents, [2, 1], tree.slot, 4)


def test_with_chains_follows_a_single_child_unfed_path_below_each_node():
    # 0 fed; 1 (unfed) -> 2 -> 3 a chain; 4 unfed leaf; 5 -> 6, 7 branches below 5
    tree = TokenTree(tokens=[1, 2, 3, 4, 5, 6, 7, 8], parents=[ROOT, 0, 1, 2, 0, ROOT, 5, 5],
                     depth=[1, 2, 3, 4, 2, 1, 2, 2], score=[0.0] * 8, slot=[0, -1, -1, -1, -1, -1, -1, -1],
                     top=[None] * 8)
    assert tree.with_chains([1, 4, 5]) == [1, 2, 3, 4, 5]
    assert tree.with_chains([1], stop_ids=(3,)) == [1, 2]  # node 2 carries a stop token: nothing below it
    assert tree.with_chains([1], stop_ids=(2,)) == [1]
    tree.slot[2] = 1  # a fed node ends it
    assert tree.with_chains([1]) == [1]


def test_positions():
    tree = TokenTree(tokens=[1, 2, 3], parents=[ROOT, 0, 1], depth=[1, 2, 3], score=[0, 0, 0],
                     slot=[-1] * 3, top=[None] * 3)
    assert node_positions([tree.depth[i] for i in [2, 0, 1]], 10) == [13, 11, 12]


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 20))
def test_subtree_reroots(seed, n):
    rng = np.random.default_rng(seed)
    tree, _ = random_fed_tree(rng, n, 4)
    for i in range(n):
        tree.top[i] = [(int(rng.integers(0, 100)), -float(rng.random()))]
    r = int(rng.integers(0, n))
    sub = tree.subtree(r)
    desc = [j for j in range(n) if r in tree.path(j) and j != r]
    assert len(sub) == len(desc)
    assert sub.root_top == tree.top[r]
    for k, j in enumerate(desc):
        assert sub.tokens[k] == tree.tokens[j]
        assert sub.slot[k] == tree.slot[j]
        assert sub.top[k] == tree.top[j]
        assert sub.depth[k] == tree.depth[j] - tree.depth[r]
        assert sub.score[k] == pytest.approx(tree.score[j] - tree.score[r])
        pj = tree.parents[j]
        assert sub.parents[k] == (ROOT if pj == r else desc.index(pj))
        # the path inside the sub-tree maps to the part of the old path below r
        old = tree.path(j)
        assert [desc[m] for m in sub.path(k)] == old[old.index(r) + 1:]
    check_invariants(sub)


def test_copy_is_deep():
    tree = TokenTree(tokens=[1], parents=[ROOT], depth=[1], score=[-0.5], slot=[3],
                     top=[[(4, -0.1)]], root_top=[(1, -0.5)])
    c = tree.copy()
    assert c == tree
    c.tokens.append(9)
    c.parents[0] = 5
    c.slot[0] = -1
    c.top[0].append((5, -0.2))
    c.root_top.append((2, -1.0))
    c.score[0] = 0.0
    c.depth[0] = 2
    assert tree == TokenTree(tokens=[1], parents=[ROOT], depth=[1], score=[-0.5], slot=[3],
                             top=[[(4, -0.1)]], root_top=[(1, -0.5)])


def test_path_children_and_max_depth():
    tree = TokenTree(tokens=[1, 2, 3, 4], parents=[ROOT, 0, ROOT, 1], depth=[1, 2, 1, 3],
                     score=[0.0] * 4, slot=[-1] * 4, top=[None] * 4)
    assert tree.path(3) == [0, 1, 3] and tree.path(ROOT) == []
    assert tree.children(ROOT) == [0, 2] and tree.children(0) == [1] and tree.children(3) == []
    assert tree.max_depth == 3 and TokenTree().max_depth == 0


@pytest.mark.parametrize("field", ["depth", "budget", "topk", "width", "lookup_branches"])
def test_tree_params_validation(field):
    """Each count must be >= 1 (``lookup`` >= 0, ``lookup_p`` in (0, 1])."""
    with pytest.raises(ValueError):
        TreeParams(**{field: 0})
    TreeParams(**{field: 1})


def test_best_tokens_selection_breaks_boundary_ties_by_id():
    lp = np.array([-2.0, -1.0, -3.0, -1.0, -2.0, -3.0, -2.0, -3.0, -1.0, -2.0, -3.0, -3.0, -3.0,
                   -1.0, -3.0, -3.0, -2.0, -1.0, -2.0, -2.0])
    tree = TokenTree()
    tree.set_best(ROOT, best_tokens(lp, 3))
    assert [t for t, _ in tree.root_top] == [1, 3, 8]  # the four -1.0 tokens are 1, 3, 8, 13, 17


@pytest.mark.parametrize("bad", [dict(lookup=-1), dict(lookup_p=0.0), dict(lookup_p=1.5), dict(branch_decay=0.0),
                                 dict(branch_decay=1.5), dict(branch_decay=float("nan"))])
def test_tree_params_lookup_validation(bad):
    with pytest.raises(ValueError):
        TreeParams(**bad)


def test_prune_floor_drops_unlikely_nodes_but_keeps_the_best():
    tree = TokenTree(tokens=[1, 2, 3, 4], parents=[ROOT, ROOT, 0, 2], depth=[1, 1, 2, 3],
                     score=[np.log(0.6), np.log(0.01), np.log(0.3), np.log(0.04)], slot=[-1] * 4, top=[None] * 4)
    kept = tree.copy().prune(8, floor=np.log(0.05))
    assert kept == [0, 2]
    low = TokenTree(tokens=[1, 2], parents=[ROOT, ROOT], depth=[1, 1], score=[np.log(0.02), np.log(0.01)],
                    slot=[-1] * 2, top=[None] * 2)
    assert low.prune(8, floor=np.log(0.05)) == [0]  # never an empty tree
    assert TreeParams(min_p=0.05).floor == pytest.approx(np.log(0.05)) and TreeParams().floor == -np.inf
    with pytest.raises(ValueError):
        TreeParams(min_p=1.0)


@FAST
@given(seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 5), levels=st.integers(0, 6))
def test_cap_depth_keeps_every_node_up_to_the_level_and_nothing_below(seed, depth, levels):
    tree = grow(np.random.default_rng(seed), TreeParams(depth, 24, 3, 3), 30)
    tree.add_chain([7, 8, 9, 10, 11, 12], -0.5)  # a lookup chain reaching past the drafted levels
    before = tree.copy()
    tree.cap_depth(levels)
    check_invariants(tree)
    assert tree.max_depth == min(levels, before.max_depth)
    kept = [i for i in range(len(before)) if before.depth[i] <= levels]
    assert [tree.tokens, tree.slot, tree.score] == [[getattr(before, f)[i] for i in kept]
                                                    for f in ("tokens", "slot", "score")]
