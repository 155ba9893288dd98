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

Growth is best-first (SpecExec / EAGLE-2 dynamic trees). Step 0 feeds the root; every later
step feeds the ``width`` best *expandable* nodes, at any depth: unfed nodes whose parent has been
fed (or is the root), highest score first. Each fed node adds its ``topk`` most likely children,
then the ``budget`` nodes of highest score are kept. Scores only fall along a path, so the kept
set is closed under ancestors (ties go to the earlier, i.e. shallower, node). A path gains at
most one level per step, so L steps give depth ≤ L; the tree's shape is the scores' choice.

Prompt-lookup chains (``rapid.runtime.lookup``) join the same tree at no draft step: token
``c_d`` of a continuation hangs below ``c_{d-1}`` with score ``S(parent) + log p`` (p learnt
per request from how often lookup tokens were right, prior ``lookup_p``). A
token that already is a child of that parent is merged into it (the higher score wins), so a
node never has two children with one token.

Pure data: nothing here touches a model, a clock or a socket. The attention mask and the
positions of fed nodes come from ``rapid.core.geometry`` (the same builder the target uses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from rapid.core.geometry import ROOT, child_with
from rapid.core.sampling import top_k_ids

AUTO_BUDGET_CAP = 64  # ``--budget auto``: never more nodes than this,
AUTO_BUDGET_MIN = 11  # never fewer: 12 rows are one tile of the row kernels (T=12 ~1.3x T=1 on Zen 5),
# and ``min_p`` keeps unlikely nodes out, so the tree only fills it when the draft or lookup is sure
# (vs-ar bench, Zen 5: budget 11 + min_p 0.03 median 1.83x, budget 6 1.69x; sent 4-9 nodes per set)


@dataclass(slots=True, frozen=True)
class TreeParams:
    depth: int = 4  # expansion steps = maximum node depth
    budget: int = 16  # maximum nodes kept (with auto_budget: the cap)
    topk: int = 4  # children added per expanded node
    width: int = 4  # maximum nodes expanded (fed to the draft) per step
    auto_budget: bool = False  # budget = the cloud's flat verify size (Ready.flat_nodes), capped by budget
    coupled: bool = True  # under sampling, rank children by the target's noise (rapid.runtime.coupling)
    lookup: int = 8  # prompt-lookup continuation tokens merged into each tree (0 = none; rapid.runtime.lookup)
    lookup_branches: int = 2  # distinct continuations per tree
    lookup_p: float = 0.5  # prior P(lookup token right), learnt per request (rapid.runtime.lookup.LookupStats)
    min_p: float = 0.0  # send no node whose path probability exp(score) is below this (the best one always;
    # the commands' default is rapid.runtime.edge_config.DEFAULT.min_p)
    branch_roots: int = 1  # proactive branch roots: the likeliest verdict outcomes (rapid.runtime.ipdg; the
    # commands' default is rapid.runtime.edge_config.DEFAULT.branch_roots)
    branch_decay: float = 0.1  # how much rarer a verdict stopping inside the tree is than the draft believes
    # (rapid.runtime.ipdg's decay, in (0, 1]; the commands' default is DEFAULT.branch_decay)
    cost_cut: bool = False  # send only the best nodes that pay for their verify time (rapid.runtime.tree_cut;
    # the commands' default is rapid.runtime.edge_config.DEFAULT.cost_cut)

    @property
    def floor(self) -> float:
        """log(min_p): the lowest score a kept node may have (-inf: no floor)."""
        return math.log(self.min_p) if self.min_p > 0 else -math.inf

    def for_cloud(self, max_nodes: int, flat_nodes: int) -> TreeParams:
        """The params for one session: with ``auto_budget`` the budget becomes
        ``min(budget, max_nodes, max(AUTO_BUDGET_MIN, flat_nodes))`` (0 flat nodes: no curve)."""
        if not self.auto_budget:
            return self
        want = max(AUTO_BUDGET_MIN, flat_nodes)
        return replace(self, budget=max(1, min(self.budget, max_nodes, want)))

    def __post_init__(self) -> None:
        for name in ("depth", "budget", "topk", "width", "lookup_branches", "branch_roots"):
            if getattr(self, name) < 1:
                raise ValueError(f"TreeParams.{name} must be >= 1, got {getattr(self, name)}")
        if self.lookup < 0:
            raise ValueError(f"TreeParams.lookup must be >= 0, got {self.lookup}")
        if not 0.0 <= self.min_p < 1.0:
            raise ValueError(f"TreeParams.min_p must be in [0, 1), got {self.min_p}")
        if not 0.0 < self.branch_decay <= 1.0:  # also false for NaN
            raise ValueError(f"TreeParams.branch_decay must be in (0, 1], got {self.branch_decay}")
        if not 0.0 < self.lookup_p <= 1.0:
            raise ValueError(f"TreeParams.lookup_p must be in (0, 1], got {self.lookup_p}")


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

    def cap_depth(self, levels: int) -> None:
        """Keep only the nodes at depth <= ``levels`` (ancestor-closed: depth grows along a path)."""
        if self.max_depth > levels:
            self.select([i for i in range(len(self)) if self.depth[i] <= levels])

    def level_mass(self) -> list[float]:
        """Per level k = 1..max_depth, the sum of exp(score) over its nodes: P(the accepted path
        reaches level k) where the scores are log-probabilities of disjoint paths."""
        mass = [0.0] * self.max_depth
        for depth, score in zip(self.depth, self.score, strict=True):
            mass[depth - 1] += math.exp(score)
        return mass

    def children(self, i: int) -> list[int]:
        return [j for j, p in enumerate(self.parents) if p == i]

    def path(self, i: int) -> list[int]:
        """Node indices from the root's child down to ``i`` (empty for ROOT)."""
        out = []
        while i != ROOT:
            out.append(i)
            i = self.parents[i]
        return out[::-1]

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
            self.merge_child(tok, i, base_depth + 1, base_score + lp)

    def regrow_children(self, topk: int, stop_ids: tuple[int, ...] = ()) -> None:
        """``add_children`` for the root and every fed node: the children a kept proactive branch's
        nodes lost. While D_{i+1} grows, its roots share one budget (``Drafter._grow_branch``), so
        the kept root's fed nodes may have had their children pruned for other roots' nodes, now
        dropped; with no unfed node left the tree cannot grow (int4 draft at 30 ms RTT, ipdg on
        wikitext: a chain of 1-2 nodes sent where a fresh tree sends 6-7). Their next tokens are
        known, so no draft step is needed; the caller prunes to the budget. Measured (``rapid bench
        --vs-ar``, Zen 4, 3 repeats): rounds after a kept branch sent 5.23 nodes against 4.57 and
        accepted 3.23 tokens against 2.93 (rapid-cost; ipdg 3.38 against 3.17) at the same round time."""
        for i in [ROOT] + [j for j in range(len(self)) if self.slot[j] >= 0]:
            self.add_children(i, topk, stop_ids)

    def child_with(self, parent: int, token: int) -> int | None:
        """The child of ``parent`` carrying ``token``, if any."""
        return child_with(self.tokens, self.parents, parent, token)

    def merge_child(self, token: int, parent: int, depth: int, score: float) -> int:
        """``add_node``, unless ``parent`` already has a ``token`` child: then that child keeps the
        higher score. Returns the child's index."""
        j = self.child_with(parent, token)
        if j is None:
            return self.add_node(token, parent, depth, score)
        self.score[j] = max(self.score[j], score)
        return j

    def add_chain(self, tokens: list[int], logp: float, stop_ids: tuple[int, ...] = ()) -> None:
        """Hang ``tokens`` below the root as a chain, each scoring its parent's score + ``logp``,
        merged into existing children; it ends after a stop token."""
        parent, depth, score = ROOT, 0, 0.0
        for tok in tokens:
            depth, score = depth + 1, score + logp
            parent = self.merge_child(tok, parent, depth, score)
            score = self.score[parent]
            if tok in stop_ids:
                return

    def add_node(self, token: int, parent: int, depth: int, score: float) -> int:
        """Append one unfed node; return its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.depth.append(depth)
        self.score.append(score)
        self.slot.append(-1)
        self.top.append(None)
        return len(self.tokens) - 1

    def expandable(self, i: int) -> bool:
        """Node ``i`` can be fed: it is unfed and its parent is the root or fed."""
        p = self.parents[i]
        return self.slot[i] < 0 and (p == ROOT or self.slot[p] >= 0)

    def frontier(self, width: int, among: list[int] | None = None, stop_ids: tuple[int, ...] = ()) -> list[int]:
        """The best ``width`` expandable nodes (of ``among``, default all), in index order; a stop
        token is never expanded."""
        cand = [i for i in (range(len(self)) if among is None else among)
                if self.expandable(i) and self.tokens[i] not in stop_ids]
        cand.sort(key=lambda i: (-self.score[i], i))
        return sorted(cand[:width])

    def with_chains(self, nodes: list[int], stop_ids: tuple[int, ...] = ()) -> list[int]:
        """``nodes`` (expandable) each followed by the unfed path below it, as long as each node on
        it is the only child of the one above and nothing goes below a stop token: a prompt-lookup
        chain hangs below its first node that way. Parents come before children, so
        ``ancestor_mask`` feeds it all in one step."""
        out: list[int] = []
        for i in nodes:
            out.append(i)
            while self.tokens[i] not in stop_ids:
                kids = self.children(i)
                if len(kids) != 1 or self.slot[kids[0]] >= 0:
                    break
                i = kids[0]
                out.append(i)
        return out

    def prune(self, budget: int, among: list[int] | None = None, floor: float = -math.inf) -> list[int]:
        """Keep the ``budget`` best nodes (ancestor-closed), none scoring below ``floor`` but the
        best one; return the kept old indices.

        With ``among``, only those nodes compete for the budget and every other node is kept
        (a proactive branch is pruned without touching the tree already sent to the cloud).
        """
        cand = list(range(len(self))) if among is None else among
        order = sorted(cand, key=lambda i: (-self.score[i], self.depth[i], i))
        keep = [i for n, i in enumerate(order[:budget]) if n == 0 or self.score[i] >= floor]
        if len(keep) == len(cand):
            return list(range(len(self)))
        drop = set(cand) - set(keep)
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

