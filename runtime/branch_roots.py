"""The proactive branch's roots as they hang in the active tree: which verdict outcomes the
branch bets on, where each root sits, and which branch step feeds it.

Pure bookkeeping over a ``TokenTree`` (no engine, no clock): the drafter (``runtime.drafter``)
chooses the roots (``runtime.ipdg.choose_proactive_roots``) and feeds them; this records them
best first, so that root 0 is the branch's best guess, and answers the verdict's questions:

    landing(path, bonus)   index of the root the verdict lands on (its node ends the path, its
                           token is the bonus), or None
    outcome(...)           where it landed, in the traces' words (``runtime.ipdg.branch_outcome``)
    levels(tree, k)        steps of D_{i+1} done below root k (feeding the root counts as one)

Root ``k`` is ``roots[k]``, hung as tree node ``nodes[k]``, fed by branch step ``fed_by[k]``
(0: the first step, whose outcomes are known before it runs; 1: a later one, chosen once the
first step has fed D_i's leaves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rapid.core.geometry import ROOT
from rapid.runtime.ipdg import ProactiveRoot, branch_outcome, landing_root
from rapid.runtime.tree import TokenTree


@dataclass(slots=True)
class BranchRoots:
    roots: list[ProactiveRoot] = field(default_factory=list)  # best first
    nodes: list[int] = field(default_factory=list)  # their tree nodes, in the same order
    fed_by: list[int] = field(default_factory=list)  # the branch step that feeds each (0 or 1)

    def __len__(self) -> int:
        return len(self.roots)

    @property
    def best(self) -> ProactiveRoot | None:
        """The branch's best root (None when no root was chosen this round)."""
        return self.roots[0] if self.roots else None

    def clear(self) -> None:
        self.roots, self.nodes, self.fed_by = [], [], []

    def hang(self, tree: TokenTree, roots: list[ProactiveRoot], fed_by: int) -> list[int]:
        """Hang ``roots`` (unfed) below their nodes in ``tree`` and list them with the others, best
        first; return their new nodes."""
        new = []
        for root in roots:
            base_depth = 0 if root.node == ROOT else tree.depth[root.node]
            new.append(tree.add_node(root.token, root.node, base_depth + 1, root.score))
        rows = sorted(zip(self.roots + roots, self.nodes + new, self.fed_by + [fed_by] * len(roots), strict=True),
                      key=lambda row: -row[0].score)
        self.roots = [r for r, _, _ in rows]  # no rows (no roots at all) leaves three empty lists
        self.nodes = [n for _, n, _ in rows]
        self.fed_by = [w for _, _, w in rows]
        return new

    def mass(self, wave: int = 0) -> float:
        """The draft's probability that the verdict lands on a root of wave ``wave`` or an earlier
        one: sum of exp(score) over them (the outcomes are disjoint; ``runtime.ipdg``)."""
        return sum(math.exp(r.score) for r, w in zip(self.roots, self.fed_by, strict=True) if w <= wave)

    def below(self, tree: TokenTree) -> list[int]:
        """The branch's nodes under its roots (strict descendants of any root)."""
        hung = set(self.nodes)
        return [i for i in range(len(tree)) if hung.intersection(tree.path(i)[:-1])]

    def renumber(self, kept: list[int]) -> None:
        """After a prune that kept the old nodes ``kept`` (in their new order)."""
        self.nodes = [kept.index(b) for b in self.nodes]

    def landing(self, path: list[int], bonus: int) -> int | None:
        return landing_root(self.roots, path, bonus)

    def outcome(self, tree: TokenTree, path: list[int], bonus: int) -> str:
        return branch_outcome(tree, self.roots, self.nodes, path, bonus)

    def levels(self, tree: TokenTree, k: int = 0) -> int:
        """Steps of D_{i+1} already done below root ``k`` (feeding the root counts as step 0)."""
        if k >= len(self.nodes) or tree.slot[self.nodes[k]] < 0:
            return 0
        b = self.nodes[k]
        d0 = tree.depth[b]
        fed = [tree.depth[i] - d0 for i in range(len(tree)) if tree.slot[i] >= 0 and b in tree.path(i)]
        return 1 + max(fed, default=0)
