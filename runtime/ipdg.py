"""IPDG decisions, pure: where the proactive branch starts, and what survives a verdict.

Proactive root. While the cloud verifies D_i (its first ``n_sent`` nodes), the edge guesses the
outcome. For every node v whose next-token distribution q(·|v) is known (the root and every fed
node) and the draft's best token b_v that is *not* already a child of v:

    score(v) = S(v) + [v has children]·log(decay) + log q(b_v | v)

with S(v) the cumulative draft log-probability (0 for the root). The branch is rooted at
b* = b_{v*}, v* = argmax score. ``decay`` < 1 says that a path stopping *inside* the tree (every
drafted child rejected) is rarer than the draft believes; leaves pay nothing. Measured on the
default pair (int4 draft, bf16 target, greedy, 960 positions of the five prompt sets), the
draft is about calibrated there: its first choice is the target's somewhat more often than its
probability says (0.60 at q ~ 0.45, 0.93 at q ~ 0.86), and where its two best tokens are both
wrong its third is the target's about twice as often as its share of the rest (0.32 at 0.14,
0.48 at 0.25) -- a stop inside scores about as the draft says, so the commands use decay 1
(``--branch-decay``; 0.1 was the first guess and kept nearly every root at a leaf). The branch is
valid iff the cloud's accepted path ends at v* AND its bonus token equals b*. With several roots
(``choose_proactive_roots``: the k best (v, b) pairs, one node may give several tokens) the
branch is valid iff the verdict lands on one of them; only that root's subtree is kept.

Reconciliation (``plan_verdict``). Given the tree (D_i plus any proactive nodes), the accepted
path and bonus:

    chain   = path + [bonus node]  if a child of the path end carries the bonus token (a hit)
    keep    = KV slots of the fed nodes of chain, then of the fed descendants of the bonus node
    pending = tokens of chain nodes never fed (+ the bonus itself when there is no bonus node)
    next    = the bonus node's subtree, re-rooted, its slots remapped behind the new prefix

A miss keeps only the accepted path (the boundary restore has already dropped the branch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rapid.core.geometry import ROOT
from rapid.runtime.tree import TokenTree


@dataclass(slots=True, frozen=True)
class ProactiveRoot:
    node: int  # v*, ROOT for the implicit root
    token: int  # b*
    score: float


def choose_proactive_roots(tree: TokenTree, decay: float = 0.1, k: int = 1,
                           floor: float = -math.inf, sent: int | None = None) -> list[ProactiveRoot]:
    """The ``k`` best outcomes (v, b), score descending (ties: earlier v, then the draft's rank
    of b), every one but the first scoring >= ``floor``; [] if nothing is known.

    Every token of q(·|v)'s recorded top list that is not already a child of v is a candidate,
    so one node may give several roots. The outcomes are disjoint events (one verdict lands on
    one (v, b)), so the chance that a branch of k roots is kept is the sum of their
    probabilities: each extra root adds its own, at the cost of one more token in the branch's
    first step.

    ``sent``: the tree's first ``sent`` nodes are D_i (the cloud's), the rest the branch's own;
    only D_i's nodes can end a verdict, and only their children say "v has children" (default:
    every node is D_i's)."""
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay must be in (0, 1], got {decay}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    sent = len(tree) if sent is None else sent
    child_tokens: dict[int, set[int]] = {}
    inner: set[int] = {tree.parents[j] for j in range(sent)}
    for j, p in enumerate(tree.parents):
        child_tokens.setdefault(p, set()).add(tree.tokens[j])
    cands: list[tuple[float, int, int, ProactiveRoot]] = []
    known = [(ROOT, 0.0, tree.root_top)] + [(i, tree.score[i], tree.top[i]) for i in range(sent)]
    for order, (v, s, top) in enumerate(known):
        if top is None:
            continue
        kids = child_tokens.get(v, set())
        base = s + (math.log(decay) if v in inner else 0.0)
        for rank, (t, lp) in enumerate(x for x in top if x[0] not in kids):
            cands.append((-(base + lp), order, rank, ProactiveRoot(v, t, base + lp)))
    cands.sort(key=lambda c: c[:3])
    return [c[3] for n, c in enumerate(cands[:k]) if n == 0 or c[3].score >= floor]


def choose_proactive_root(tree: TokenTree, decay: float = 0.1) -> ProactiveRoot | None:
    """argmax over known nodes of S(v) + [internal]·log(decay) + log q(b_v|v); None if nothing is known."""
    roots = choose_proactive_roots(tree, decay, 1)
    return roots[0] if roots else None


def landing_root(roots: list[ProactiveRoot], path: list[int], bonus: int) -> int | None:
    """Index of the root the verdict (path, bonus) lands on: its node ends the path, its token is the bonus."""
    end = path[-1] if path else ROOT
    return next((k for k, r in enumerate(roots) if r.node == end and r.token == bonus), None)


def branch_outcome(tree: TokenTree, roots: list[ProactiveRoot], root_nodes: list[int], path: list[int],
                   bonus: int) -> str:
    """Where the verdict (path, bonus) landed for the branch whose root k is ``roots[k]``, hung in
    ``tree`` as node ``root_nodes[k]`` (fed once its slot is set), in words the traces count:

        hit       on a fed root (the branch is kept)
        late      on a chosen root the branch had not fed by the verdict
        unfed     on a node whose next tokens the draft never computed (no root could be there)
        rank<r>   on a fed node; the bonus is the r-th best token the draft ranked there that is
                  not one of the node's drafted children (0 = the best), but no root took it
        unranked  on a fed node; the bonus is outside the draft's recorded top list
    """
    k = landing_root(roots, path, bonus)
    if k is not None:
        return "hit" if tree.slot[root_nodes[k]] >= 0 else "late"
    end = path[-1] if path else ROOT
    top = tree.root_top if end == ROOT else tree.top[end]
    if top is None:
        return "unfed"
    hung = set(root_nodes)
    kids = {tree.tokens[j] for j, p in enumerate(tree.parents) if p == end and j not in hung}
    ranked = [t for t, _ in top if t not in kids]
    return f"rank{ranked.index(bonus)}" if bonus in ranked else "unranked"


@dataclass(slots=True)
class VerdictPlan:
    emitted: list[int]  # tokens committed by this verdict (path + bonus)
    keep_slots: list[int]  # draft KV slots to move behind the prefix, in order
    prefix_grow: int  # how many of keep_slots extend the committed prefix
    pending: list[int]  # committed tokens whose KV the draft has not computed
    next_tree: TokenTree = field(default_factory=TokenTree)  # kept branch, slots remapped
    hit: bool = False  # a proactive branch node carried the bonus token


def plan_verdict(tree: TokenTree, path: list[int], bonus: int, prefix_len: int) -> VerdictPlan:
    """See the module docstring. ``prefix_len`` = draft KV entries of the committed prefix."""
    if any(not 0 <= j < len(tree) for j in path):
        raise ValueError(f"accepted path {path} has node indices outside [0, {len(tree)})")
    end = path[-1] if path else ROOT
    for a, b in zip([ROOT, *path][: len(path)], path, strict=True):
        if tree.parents[b] != a:
            raise ValueError(f"accepted path {path} is not a chain in the tree")
    bonus_node = tree.child_with(end, bonus)
    chain = path + ([bonus_node] if bonus_node is not None else [])
    fed = [j for j in chain if tree.slot[j] >= 0]
    if fed != chain[: len(fed)]:
        raise ValueError("fed nodes of the accepted chain must form its prefix")
    keep = [tree.slot[j] for j in fed]
    pending = [tree.tokens[j] for j in chain[len(fed):]]
    if bonus_node is None:
        pending.append(bonus)
    nxt = TokenTree()
    if bonus_node is not None and tree.slot[bonus_node] >= 0:
        nxt = tree.subtree(bonus_node)
        base = prefix_len + len(fed)
        fed_desc = [k for k in range(len(nxt)) if nxt.slot[k] >= 0]
        keep += [nxt.slot[k] for k in fed_desc]
        for n, k in enumerate(fed_desc):
            nxt.slot[k] = base + n
    emitted = [tree.tokens[j] for j in path] + [bonus]
    return VerdictPlan(emitted, keep, len(fed), pending, nxt, hit=bonus_node is not None)
