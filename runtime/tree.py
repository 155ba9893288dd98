"""Token tree in flat arrays, grown by budgeted level-wise expansion (SpecExec style).

The root is implicit: it is the last committed token. Node ``i`` has

    tokens[i]   its token id
    parents[i]  parent node index, -1 for a child of the root        (parents[i] < i always)
    depth[i]    1 for a child of the root; position = prefix_len + depth - 1 … see ``positions``
    score[i]    cumulative draft log-probability  Σ log q(token | path); under coupled sampling
                Σ log of the coupled score (``rapid.runtime.coupling``)
    slot[i]     draft KV slot once the node has been fed to the draft, else -1
    top[i]      the draft's best next tokens after node i, (token, log q) pairs, once fed (coupled:
                ranked by the target's noise, with the coupled score)

One expansion step at level ℓ feeds the best ``width`` unexpanded nodes of depth ℓ (or the
root for ℓ = 0), adds each one's ``topk`` most likely children, then keeps the ``budget``
nodes of highest score. Scores only fall along a path, so the kept set is closed under
ancestors (ties go to the earlier, i.e. shallower, node). A tree of depth L takes L steps.

Pure data: nothing here touches a model, a clock or a socket. The attention mask and the
positions of fed nodes come from ``rapid.geometry`` (the same builder the target uses).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from rapid.geometry import ROOT
from rapid.sampling import top_k_ids

AUTO_BUDGET_CAP = 64  # ``--budget auto``: never more nodes than this,
AUTO_BUDGET_MIN = 6  # never fewer (a depth-4 chain plus first-level alternatives: with 4 nodes the
# code demo prompts lost 15-20 % tok/s to budget 6/8 on the bf16 CPU target, whose flat size is 4-7),
AUTO_BUDGET_FALLBACK = 8  # and this many when the cloud reports no verify curve


@dataclass(slots=True, frozen=True)
class TreeParams:
    depth: int = 4  # expansion steps = maximum node depth
    budget: int = 16  # maximum nodes kept (with auto_budget: the cap)
    topk: int = 4  # children added per expanded node
    width: int = 4  # maximum nodes expanded (fed to the draft) per step
    auto_budget: bool = False  # budget = the cloud's flat verify size (Ready.flat_nodes), capped by budget
    coupled: bool = True  # under sampling, rank children by the target's noise (rapid.runtime.coupling)

    def for_cloud(self, max_nodes: int, flat_nodes: int) -> TreeParams:
        """The params for one session: with ``auto_budget`` the budget becomes
        ``min(budget, max_nodes, max(AUTO_BUDGET_MIN, flat_nodes or AUTO_BUDGET_FALLBACK))``."""
        if not self.auto_budget:
            return self
        want = max(AUTO_BUDGET_MIN, flat_nodes or AUTO_BUDGET_FALLBACK)
        return replace(self, budget=max(1, min(self.budget, max_nodes, want)))

    def __post_init__(self) -> None:
        for name in ("depth", "budget", "topk", "width"):
            if getattr(self, name) < 1:
                raise ValueError(f"TreeParams.{name} must be >= 1, got {getattr(self, name)}")


def best_tokens(logprobs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The ``k`` best (token, log-probability) pairs of one row ``logprobs`` [V], descending,
    ties by token id."""
    return [(int(t), float(logprobs[t])) for t in top_k_ids(logprobs, k)]


@dataclass(slots=True)
class TokenTree:
    tokens: list[int] = field(default_factory=list)  # [N]
    parents: list[int] = field(default_factory=list)  # [N]
    depth: list[int] = field(default_factory=list)  # [N]
    score: list[float] = field(default_factory=list)  # [N]
    slot: list[int] = field(default_factory=list)  # [N], -1 = not fed
    top: list[list[tuple[int, float]] | None] = field(default_factory=list)  # [N]
    root_top: list[tuple[int, float]] | None = None  # draft's best tokens after the root

    def __len__(self) -> int:
        return len(self.tokens)

    def copy(self) -> TokenTree:
        return TokenTree(list(self.tokens), list(self.parents), list(self.depth), list(self.score),
                         list(self.slot), [None if t is None else list(t) for t in self.top],
                         None if self.root_top is None else list(self.root_top))

    @property
    def max_depth(self) -> int:
        return max(self.depth, default=0)

    def children(self, i: int) -> list[int]:
        return [j for j, p in enumerate(self.parents) if p == i]

    def path(self, i: int) -> list[int]:
        """Node indices from the root's child down to ``i`` (empty for ROOT)."""
        out = []
        while i != ROOT:
            out.append(i)
            i = self.parents[i]
        return out[::-1]

    def set_top(self, i: int, logprobs: np.ndarray, k: int) -> None:
        """Record the draft's ``k`` best next tokens after node ``i`` (``logprobs`` [V])."""
        self.set_best(i, best_tokens(logprobs, k))

    def set_best(self, i: int, best: list[tuple[int, float]]) -> None:
        """Record node ``i``'s ranked next-token candidates, (token, score) best first."""
        if i == ROOT:
            self.root_top = best
        else:
            self.top[i] = best

    def add_children(self, i: int, topk: int, stop_ids: tuple[int, ...] = ()) -> None:
        """Add the ``topk`` best recorded next tokens of node ``i`` as children (none after a stop token)."""
        best = self.root_top if i == ROOT else self.top[i]
        if best is None:
            raise ValueError(f"node {i} has not been fed to the draft")
        if i != ROOT and self.tokens[i] in stop_ids:
            return
        base_score = 0.0 if i == ROOT else self.score[i]
        base_depth = 0 if i == ROOT else self.depth[i]
        for tok, lp in best[:topk]:
            self.add_node(tok, i, base_depth + 1, base_score + lp)

    def add_node(self, token: int, parent: int, depth: int, score: float) -> int:
        """Append one unfed node; return its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.depth.append(depth)
        self.score.append(score)
        self.slot.append(-1)
        self.top.append(None)
        return len(self.tokens) - 1

    def frontier(self, level: int, width: int) -> list[int]:
        """The best ``width`` unfed nodes at depth ``level``, in index order."""
        cand = [i for i in range(len(self)) if self.depth[i] == level and self.slot[i] < 0]
        cand.sort(key=lambda i: (-self.score[i], i))
        return sorted(cand[:width])

    def prune(self, budget: int, among: list[int] | None = None) -> list[int]:
        """Keep the ``budget`` best nodes (ancestor-closed); return the kept old indices.

        With ``among``, only those nodes compete for the budget and every other node is kept
        (a proactive branch is pruned without touching the tree already sent to the cloud).
        """
        cand = list(range(len(self))) if among is None else among
        if len(cand) <= budget:
            return list(range(len(self)))
        order = sorted(cand, key=lambda i: (-self.score[i], self.depth[i], i))
        drop = set(order[budget:])
        # Ties could in principle drop a parent while keeping a child: close under ancestors.
        kept = [i for i in range(len(self)) if i not in drop and not drop.intersection(self.path(i))]
        self.select(kept)
        return kept

    def select(self, kept: list[int]) -> None:
        """Keep only nodes ``kept`` (ascending, ancestor-closed), reindexing parents."""
        remap = {old: new for new, old in enumerate(kept)}
        remap[ROOT] = ROOT
        self.parents = [remap[self.parents[i]] for i in kept]
        for name in ("tokens", "depth", "score", "slot", "top"):
            vals = getattr(self, name)
            setattr(self, name, [vals[i] for i in kept])

    def subtree(self, new_root: int) -> TokenTree:
        """The descendants of node ``new_root`` as a tree whose implicit root is ``new_root``."""
        desc = [i for i in range(len(self)) if new_root in self.path(i)[:-1]]
        remap = {old: new for new, old in enumerate(desc)}
        remap[new_root] = ROOT
        d0, s0 = self.depth[new_root], self.score[new_root]
        return TokenTree(
            tokens=[self.tokens[i] for i in desc],
            parents=[remap[self.parents[i]] for i in desc],
            depth=[self.depth[i] - d0 for i in desc],
            score=[self.score[i] - s0 for i in desc],
            slot=[self.slot[i] for i in desc],
            top=[self.top[i] for i in desc],
            root_top=self.top[new_root],
        )

