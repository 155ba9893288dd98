"""Sample-then-match acceptance over a verified tree (pure, given the target's picks).

The target forward covers ``[root] + nodes`` (T = 1 + N rows). Row 0 predicts the token after
the root (the last committed token); row 1 + j predicts the token after node j. With ``pick``
the target's choice for each row (argmax, or the seeded draw of ``rapid.core.sampling``):

    node j is accepted  ⇔  its parent is accepted (the root always is)  ∧  tokens[j] = pick[row(parent)]
    path  = the deepest accepted chain (it is unique: siblings with equal tokens → first wins)
    bonus = pick[row(path end)]

The emitted tokens ``path tokens + [bonus]`` are exactly what the target alone would emit,
because every emitted token is the target's own pick given the same prefix. ``finish`` cuts
what both sides emit at the same stop token or length, so the edge and the target-only
reference end identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rapid.core.geometry import ROOT, child_with


@dataclass(slots=True, frozen=True)
class Verdict:
    path: tuple[int, ...]  # accepted node indices, root's child first
    bonus: int  # the target's token after the path

    @property
    def emitted(self) -> int:
        return len(self.path) + 1


def accept(tokens: Sequence[int], parents: Sequence[int], picks: Sequence[int]) -> Verdict:
    """tokens/parents ``[N]`` (parents[j] < j, -1 = root), picks ``[1 + N]``."""
    n = len(tokens)
    if len(parents) != n or len(picks) != n + 1:
        raise ValueError(f"accept: {n} tokens, {len(parents)} parents, {len(picks)} picks (need N+1)")
    path: list[int] = []
    node = ROOT
    while True:
        want = picks[0] if node == ROOT else picks[node + 1]
        child = child_with(tokens, parents, node, want)
        if child is None:
            return Verdict(tuple(path), int(want))
        path.append(child)
        node = child


def validate_tree(tokens: Sequence[int], parents: Sequence[int], vocab_size: int, max_nodes: int) -> str | None:
    """Why a tree is malformed, or None. Parents must point backwards, so cycles are impossible."""
    if len(tokens) != len(parents):
        return f"tree has {len(tokens)} tokens but {len(parents)} parents"
    if len(tokens) > max_nodes:
        return f"tree has {len(tokens)} nodes, more than the session limit {max_nodes}"
    for j, (t, p) in enumerate(zip(tokens, parents, strict=True)):
        if not 0 <= t < vocab_size:
            return f"node {j}: token {t} outside the vocabulary [0, {vocab_size})"
        if not -1 <= p < j:
            return f"node {j}: parent {p} must be -1 (root) or an earlier node (< {j}); no cycles"
    return None


def finish(tokens: list[int], max_new: int, stop_ids: Sequence[int]) -> tuple[list[int], bool]:
    """Cut generated ``tokens`` at the first stop token (kept) or ``max_new``; say if it stopped."""
    for i, t in enumerate(tokens[:max_new]):
        if t in stop_ids:
            return tokens[: i + 1], True
    return tokens[:max_new], len(tokens) >= max_new
