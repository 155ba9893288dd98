"""rapid.runtime.ipdg: proactive root choice (brute force) and verdict reconciliation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.runtime.ipdg import (
    ProactiveRoot,
    branch_outcome,
    choose_proactive_root,
    choose_proactive_roots,
    plan_verdict,
)
from rapid.runtime.tree import ROOT, TokenTree, best_tokens

FAST = settings(max_examples=80, deadline=None)


def node_tree(spec, root_top=None) -> TokenTree:
    """spec: list of (token, parent, slot[, score])."""
    tree = TokenTree(root_top=root_top)
    for entry in spec:
        tok, parent, slot = entry[:3]
        score = entry[3] if len(entry) > 3 else -1.0
        tree.tokens.append(tok)
        tree.parents.append(parent)
        tree.depth.append(1 if parent == ROOT else tree.depth[parent] + 1)
        tree.score.append(score)
        tree.slot.append(slot)
        tree.top.append(None)
    return tree


def random_tree(rng: np.random.Generator, n: int, vocab: int, prefix_len: int = 0) -> TokenTree:
    """Random tree; fed nodes (ancestor-closed) get slots in index order and a recorded top list."""
    tree = TokenTree()
    slot = prefix_len
    if rng.random() < 0.9:
        tree.set_best(ROOT, best_tokens(np.log(rng.dirichlet(np.ones(vocab))), int(rng.integers(1, vocab + 1))))
    for i in range(n):
        p = int(rng.integers(-1, i)) if i else ROOT
        tree.tokens.append(int(rng.integers(0, vocab)))
        tree.parents.append(p)
        tree.depth.append(1 if p == ROOT else tree.depth[p] + 1)
        tree.score.append((0.0 if p == ROOT else tree.score[p]) + float(np.log(rng.random())))
        fed = (p == ROOT or tree.slot[p] >= 0) and rng.random() < 0.7
        tree.slot.append(slot if fed else -1)
        tree.top.append(None)
        if fed:
            slot += 1
            tree.set_best(i, best_tokens(np.log(rng.dirichlet(np.ones(vocab))), int(rng.integers(1, vocab + 1))))
    return tree


# ---------------------------------------------------------------- proactive root


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 12), vocab=st.integers(2, 6),
       decay=st.floats(0.01, 1.0))
def test_choose_proactive_root_is_brute_force_argmax(seed, n, vocab, decay):
    tree = random_tree(np.random.default_rng(seed), n, vocab)
    # every (v, b) with q(.|v) known and b not already a child of v
    cands = []
    for v in [ROOT, *range(len(tree))]:
        top = tree.root_top if v == ROOT else tree.top[v]
        if top is None:
            continue
        kids = {tree.tokens[j] for j in tree.children(v)}
        s = 0.0 if v == ROOT else tree.score[v]
        for b, lp in top:
            if b not in kids:
                cands.append((s + (math.log(decay) if kids else 0.0) + lp, v, b))
    got = choose_proactive_root(tree, decay)
    if not cands:
        assert got is None
        return
    best = max(c[0] for c in cands)
    assert isinstance(got, ProactiveRoot)
    assert got.score == pytest.approx(best, abs=1e-9)
    assert (pytest.approx(got.score, abs=1e-9), got.node, got.token) in [(c[0], c[1], c[2]) for c in cands]
    assert got.token not in {tree.tokens[j] for j in tree.children(got.node)}


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 12), vocab=st.integers(2, 6),
       decay=st.floats(0.01, 1.0), k=st.integers(1, 6), floor=st.sampled_from([-math.inf, -2.0, -0.5]))
def test_choose_proactive_roots_are_the_k_best_outcomes(seed, n, vocab, decay, k, floor):
    tree = random_tree(np.random.default_rng(seed), n, vocab)
    cands = []
    for v in [ROOT, *range(len(tree))]:
        top = tree.root_top if v == ROOT else tree.top[v]
        kids = {tree.tokens[j] for j in tree.children(v)}
        s = 0.0 if v == ROOT else tree.score[v]
        cands += [(s + (math.log(decay) if kids else 0.0) + lp, v, b) for b, lp in (top or []) if b not in kids]
    got = choose_proactive_roots(tree, decay, k, floor)
    scores = sorted((c[0] for c in cands), reverse=True)
    want = [x for n_, x in enumerate(scores[:k]) if n_ == 0 or x >= floor]
    assert [r.score for r in got] == pytest.approx(want, abs=1e-9)
    assert len({(r.node, r.token) for r in got}) == len(got)  # distinct outcomes
    assert all((pytest.approx(r.score, abs=1e-9), r.node, r.token) in cands for r in got)
    assert got[:1] == ([choose_proactive_root(tree, decay)] if cands else [])


def test_choose_proactive_roots_takes_several_tokens_of_one_node():
    tree = node_tree([(5, ROOT, 0, -0.1)], root_top=[(5, -0.1), (6, -3.0)])
    tree.top[0] = [(7, -0.2), (8, -0.9), (9, -4.0)]
    got = choose_proactive_roots(tree, 0.1, 4)  # -0.3, -1.0, -4.1, then the root's 6 at log(0.1) - 3
    assert [(r.node, r.token) for r in got] == [(0, 7), (0, 8), (0, 9), (ROOT, 6)]
    assert [(r.node, r.token) for r in choose_proactive_roots(tree, 0.1, 3, floor=-2.0)] == [(0, 7), (0, 8)]
    with pytest.raises(ValueError):
        choose_proactive_roots(tree, 0.1, 0)


def test_choose_proactive_root_hand_example():
    # root: top (5, -0.1), (6, -1.0); child 5 exists -> root candidate 6 at log(decay) - 1.0
    # node 0 (token 5, score -0.1, leaf): top (7, -0.2) -> -0.3, no decay
    tree = node_tree([(5, ROOT, 0, -0.1)], root_top=[(5, -0.1), (6, -1.0)])
    tree.top[0] = [(7, -0.2), (8, -3.0)]
    assert choose_proactive_root(tree, 0.1) == ProactiveRoot(0, 7, pytest.approx(-0.3))
    # with no decay the root's alternative is still worse (-1.0 < -0.3)
    assert choose_proactive_root(tree, 1.0).node == 0
    # a very unlikely leaf loses to the root's alternative when decay = 1
    tree.top[0] = [(7, -5.0)]
    assert choose_proactive_root(tree, 1.0) == ProactiveRoot(ROOT, 6, pytest.approx(-1.0))
    # ... but wins when the internal root pays log(0.01)
    assert choose_proactive_root(tree, 0.01).node == 0


def test_choose_proactive_root_skips_existing_children():
    tree = node_tree([(1, ROOT, 0), (2, ROOT, -1)], root_top=[(1, -0.1), (2, -0.2)])
    assert choose_proactive_root(tree) is None  # node 0 unfed-top, root exhausted
    tree.top[0] = [(3, -0.5)]
    assert choose_proactive_root(tree) == ProactiveRoot(0, 3, pytest.approx(-1.5))
    assert choose_proactive_root(TokenTree()) is None


def test_branch_outcome_names_where_each_verdict_lands():
    #   ROOT ─ 0 (5, fed) ─ 1 (7, unfed leaf)       root_top 5, 6, 4; node 0's top 7, 8, 9, 3
    #      roots hung by the branch: (0, 8) as node 2, fed; (ROOT, 6) as node 3, not yet fed
    def sent_tree() -> TokenTree:
        t = node_tree([(5, ROOT, 0, -0.1), (7, 0, -1, -0.3)], root_top=[(5, -0.1), (6, -1.0), (4, -2.0)])
        t.top[0] = [(7, -0.2), (8, -0.9), (9, -2.0), (3, -3.0)]
        return t

    tree = sent_tree()
    roots = [ProactiveRoot(0, 8, -1.0), ProactiveRoot(ROOT, 6, -1.0)]
    nodes = [tree.add_node(8, 0, 2, -1.0), tree.add_node(6, ROOT, 1, -1.0)]
    tree.slot[nodes[0]] = 1
    assert branch_outcome(tree, roots, nodes, [0], 8) == "hit"
    assert branch_outcome(tree, roots, nodes, [], 6) == "late"
    assert branch_outcome(tree, roots, nodes, [0, 1], 2) == "unfed"  # the leaf's next tokens unknown
    # ranks skip the node's drafted child (7) but not a root's token (8): 9 is the second token offered
    assert branch_outcome(tree, roots, nodes, [0], 9) == "rank1"
    assert branch_outcome(tree, roots, nodes, [], 4) == "rank1"  # root_top: 5 is a child, 6 rank 0
    assert branch_outcome(tree, roots, nodes, [0], 42) == "unranked"
    assert branch_outcome(sent_tree(), [], [], [0], 8) == "rank0"  # no roots: where one would have been


@pytest.mark.parametrize("decay", [0.0, -0.5, 1.5, float("nan")])
def test_choose_proactive_root_decay_validation(decay):
    with pytest.raises(ValueError):
        choose_proactive_root(TokenTree(root_top=[(1, -0.1)]), decay)


# ---------------------------------------------------------------- verdict plans

P = 10  # committed prefix length in the draft KV


@pytest.fixture
def tree():
    #   ROOT ─ 0 (11, s10) ─ 1 (12, s11) ─┬ 2 (13, unfed)
    #      │                               └ 4 (20, s13) ─┬ 5 (21, s14) ─ 6 (22, unfed)
    #      └ 3 (14, s12)                                  └ 7 (23, s15)
    t = node_tree([(11, ROOT, 10, -0.1), (12, 0, 11, -0.3), (13, 1, -1, -0.9), (14, ROOT, 12, -2.0),
                   (20, 1, 13, -0.5), (21, 4, 14, -0.7), (22, 5, -1, -1.0), (23, 4, 15, -1.5)])
    for i in (0, 1, 3, 4, 5, 7):
        t.top[i] = [(100 + i, -0.1)]
    return t


def test_plan_miss_keeps_fed_path(tree):
    plan = plan_verdict(tree, [0, 1], 99, P)
    assert plan.emitted == [11, 12, 99]
    assert plan.keep_slots == [10, 11] and plan.prefix_grow == 2
    assert plan.pending == [99]
    assert len(plan.next_tree) == 0 and not plan.hit


def test_plan_miss_with_unfed_path_tail(tree):
    plan = plan_verdict(tree, [0, 1, 2], 7, P)
    assert plan.emitted == [11, 12, 13, 7]
    assert plan.keep_slots == [10, 11] and plan.prefix_grow == 2
    assert plan.pending == [13, 7]
    assert len(plan.next_tree) == 0 and not plan.hit


def test_plan_empty_path_miss(tree):
    plan = plan_verdict(tree, [], 50, P)
    assert plan.emitted == [50] and plan.keep_slots == [] and plan.prefix_grow == 0
    assert plan.pending == [50] and not plan.hit


def test_plan_hit_reroots_the_branch(tree):
    plan = plan_verdict(tree, [0, 1], 20, P)
    assert plan.hit
    assert plan.emitted == [11, 12, 20]
    assert plan.keep_slots == [10, 11, 13, 14, 15]  # chain, then fed descendants in order
    assert plan.prefix_grow == 3 and plan.pending == []
    nxt = plan.next_tree
    assert nxt.tokens == [21, 22, 23] and nxt.parents == [ROOT, 0, ROOT]
    assert nxt.depth == [1, 2, 1]
    assert nxt.score == pytest.approx([-0.2, -0.5, -1.0])
    assert nxt.slot == [P + 3 + 0, -1, P + 3 + 1]
    assert nxt.root_top == tree.top[4] and nxt.top[0] == tree.top[5]
    # the input tree is not modified
    assert tree.slot == [10, 11, -1, 12, 13, 14, -1, 15]


def test_plan_hit_from_empty_path(tree):
    plan = plan_verdict(tree, [], 14, P)
    assert plan.hit and plan.emitted == [14]
    assert plan.keep_slots == [12] and plan.prefix_grow == 1 and plan.pending == []
    assert len(plan.next_tree) == 0 and plan.next_tree.root_top == tree.top[3]


def test_plan_bonus_on_unfed_child(tree):
    plan = plan_verdict(tree, [0, 1], 13, P)
    assert plan.emitted == [11, 12, 13]
    assert plan.keep_slots == [10, 11] and plan.prefix_grow == 2
    assert plan.pending == [13]  # the bonus once, not twice
    assert len(plan.next_tree) == 0


@pytest.mark.parametrize("path", [[1], [0, 3], [0, 2], [3, 4], [0, 1, 5]])
def test_plan_rejects_paths_that_are_not_chains(tree, path):
    with pytest.raises(ValueError):
        plan_verdict(tree, path, 1, P)


def test_plan_rejects_fed_node_below_unfed_node(tree):
    tree.tokens.append(30)
    tree.parents.append(2)
    tree.depth.append(4)
    tree.score.append(-2.0)
    tree.slot.append(16)
    tree.top.append(None)
    with pytest.raises(ValueError):
        plan_verdict(tree, [0, 1, 2, 8], 1, P)


@pytest.mark.parametrize("path", [[-1], [8], [0, 1, 99]])
def test_plan_rejects_out_of_range_indices(path):
    t = node_tree([(11, ROOT, 10), (12, 0, 11), (14, ROOT, 12)])
    with pytest.raises(ValueError):
        plan_verdict(t, path, 1, P)


@FAST
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 15), vocab=st.integers(2, 6),
       prefix_len=st.integers(0, 8))
def test_plan_invariants_on_random_trees(seed, n, vocab, prefix_len):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, n, vocab, prefix_len)
    end = int(rng.integers(-1, n))
    path = tree.path(end)
    kids = [tree.tokens[j] for j in tree.children(end)]
    bonus = int(rng.choice(kids)) if kids and rng.random() < 0.6 else int(rng.integers(0, vocab + 2))
    fed_path = [j for j in path if tree.slot[j] >= 0]
    if fed_path != path[:len(fed_path)]:
        with pytest.raises(ValueError):
            plan_verdict(tree, path, bonus, prefix_len)
        return
    plan = plan_verdict(tree, path, bonus, prefix_len)
    assert plan.emitted == [tree.tokens[j] for j in path] + [bonus]
    # every emitted token either has its KV kept (a prefix) or is pending (the rest)
    assert plan.pending == plan.emitted[plan.prefix_grow:]
    chain = path + [j for j in tree.children(end) if tree.tokens[j] == bonus][:1]
    fed_chain = [tree.slot[j] for j in chain if tree.slot[j] >= 0]
    assert plan.prefix_grow == len(fed_chain)
    assert plan.keep_slots[:plan.prefix_grow] == fed_chain
    assert plan.hit == (bonus in kids)
    nxt = plan.next_tree
    fed_next = [k for k in range(len(nxt)) if nxt.slot[k] >= 0]
    start = prefix_len + plan.prefix_grow
    assert [nxt.slot[k] for k in fed_next] == list(range(start, start + len(fed_next)))
    assert len(plan.keep_slots) == plan.prefix_grow + len(fed_next)
    assert len(set(plan.keep_slots)) == len(plan.keep_slots)
    if len(nxt):
        bn = next(j for j in tree.children(end) if tree.tokens[j] == bonus)
        desc = [j for j in range(n) if bn in tree.path(j)[:-1]]
        assert nxt.tokens == [tree.tokens[j] for j in desc]
        assert plan.keep_slots[plan.prefix_grow:] == [tree.slot[j] for j in desc if tree.slot[j] >= 0]
        for k in range(len(nxt)):
            assert nxt.parents[k] < k


def test_only_the_sent_tree_ends_a_verdict():
    """Nodes past ``sent`` are the branch's own (the cloud never saw them): they give no outcome,
    and their being children does not make a sent leaf internal; their tokens are still not
    offered again under the same node."""
    tree = node_tree([(5, ROOT, 0, -0.1)], root_top=[(5, -0.1), (6, -1.0)])
    tree.top[0] = [(7, -0.2), (8, -0.9)]
    j = tree.add_node(7, 0, 2, -0.3)  # the branch hung root (0, 7) under the sent leaf
    tree.top[j] = [(9, -0.1)]
    got = choose_proactive_roots(tree, 0.1, 3, sent=1)
    assert [(r.node, r.token) for r in got] == [(0, 8), (ROOT, 6)]
    assert got[0].score == pytest.approx(-1.0)  # no decay: node 0 is a leaf of the sent tree
