"""rapid.runtime.branch_roots: the proactive branch's roots as they hang in the tree."""

from __future__ import annotations

import math

from rapid.runtime.branch_roots import BranchRoots
from rapid.runtime.ipdg import ProactiveRoot
from rapid.runtime.tree import ROOT, TokenTree


def sent_tree() -> TokenTree:
    """D_i: root -> 10 (fed, slot 5) -> 11 (unfed leaf); the root's other child 20 (unfed)."""
    tree = TokenTree()
    a = tree.add_node(10, ROOT, 1, math.log(0.6))
    tree.add_node(11, a, 2, math.log(0.5))
    tree.add_node(20, ROOT, 1, math.log(0.3))
    tree.slot[a] = 5
    return tree


def test_roots_hang_below_their_nodes_best_first_across_waves() -> None:
    tree, roots = sent_tree(), BranchRoots()
    first = roots.hang(tree, [ProactiveRoot(ROOT, 30, math.log(0.05)), ProactiveRoot(0, 12, math.log(0.2))], 0)
    assert [tree.tokens[n] for n in first] == [30, 12]
    assert [tree.parents[n] for n in first] == [ROOT, 0] and [tree.depth[n] for n in first] == [1, 2]
    assert all(tree.slot[n] < 0 for n in first)  # hung unfed: the branch step feeds them
    late = roots.hang(tree, [ProactiveRoot(1, 13, math.log(0.1))], 1)
    assert [r.token for r in roots.roots] == [12, 13, 30]  # by score, whatever the wave
    assert roots.nodes == [first[1], late[0], first[0]] and roots.fed_by == [0, 1, 0]
    assert roots.best == roots.roots[0] and len(roots) == 3
    assert math.isclose(roots.mass(0), 0.25) and math.isclose(roots.mass(1), 0.35)  # disjoint outcomes add up


def test_below_levels_and_renumber_follow_the_fed_subtree() -> None:
    tree, roots = sent_tree(), BranchRoots()
    (r,) = roots.hang(tree, [ProactiveRoot(0, 12, math.log(0.2))], 0)
    assert roots.below(tree) == [] and roots.levels(tree) == 0  # unfed root: no step done below it
    tree.slot[r] = 6
    assert roots.levels(tree) == 1
    kid = tree.add_node(40, r, tree.depth[r] + 1, math.log(0.1))
    deep = tree.add_node(41, kid, tree.depth[r] + 2, math.log(0.01))
    assert roots.below(tree) == [kid, deep]
    tree.slot[kid] = 7
    assert roots.levels(tree) == 2 and roots.levels(tree, 1) == 0  # a root index past the list: 0
    kept = tree.prune(1, among=roots.below(tree))  # the branch's own nodes compete; D_i and the root stay
    roots.renumber(kept)
    assert tree.tokens[roots.nodes[0]] == 12 and len(tree) == 5


def test_landing_and_outcome_name_the_root_and_clear_forgets_them() -> None:
    tree, roots = sent_tree(), BranchRoots()
    roots.hang(tree, [ProactiveRoot(0, 12, math.log(0.2)), ProactiveRoot(ROOT, 30, math.log(0.05))], 0)
    assert roots.landing([0], 12) == 0 and roots.landing([], 30) == 1
    assert roots.landing([0], 13) is None and roots.landing([0, 1], 12) is None
    assert roots.outcome(tree, [0], 12) == "late"  # chosen, not fed by the verdict
    tree.slot[roots.nodes[0]] = 6
    assert roots.outcome(tree, [0], 12) == "hit"
    assert roots.outcome(tree, [0, 1], 99) == "unfed"  # node 1 was never fed: no root could be there
    roots.clear()
    assert len(roots) == 0 and roots.best is None and roots.fed_by == [] and roots.nodes == []
