"""Batch invariance of the target: is every row of a tree forward bitwise a one-token step?

Exactness of tree verification rests on this. For a tree ``[root] + nodes`` over a committed
prefix ``x``, row ``r`` of the tree forward must equal (``torch.equal`` on the logits) the row
of a target-alone step that feeds the same token after the same prefix:

    tree_logits[0]     ==  step(x)                       (the root's row)
    tree_logits[1 + j] ==  step(x + path(j))             (path(j): root's child … node j)

and, for a batch of sessions, each session's rows in the batched forward equal its rows alone.
``compare_tree`` checks one tree; ``probe`` checks a fixed set of trees and a batch of two on a
loaded model (a few target steps) so ``rapid serve`` can pick the verify mode and
``rapid doctor`` can report it. Random token ids are used: the arithmetic, not the text, matters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rapid.acceptance import Verdict
from rapid.modeling import Decoder
from rapid.sampling import SamplingParams
from rapid.server.chains import forward_chains, leaf_chains
from rapid.server.target import TargetSession


@dataclass(slots=True, frozen=True)
class RowCheck:
    rows: int  # rows compared
    differing: int  # rows not bitwise equal
    max_abs_diff: float  # largest |Δ logit| over all rows

    @property
    def invariant(self) -> bool:
        return self.differing == 0

    def merge(self, other: RowCheck) -> RowCheck:
        return RowCheck(self.rows + other.rows, self.differing + other.differing,
                        max(self.max_abs_diff, other.max_abs_diff))


def step_logits(model: Decoder, prompt: Sequence[int], forced: Sequence[int]) -> list[np.ndarray]:
    """Target-alone steps after ``prompt``: the logits row of each step, feeding ``forced`` in turn
    (row 0 feeds the prompt's last token, row k the k-th forced token)."""
    s = TargetSession(model, prompt, SamplingParams(), capacity=len(prompt) + len(forced) + 4)
    rows = []
    for k in range(len(forced) + 1):
        result = s.forward_tree([], [])
        rows.append(s.logits(result)[0])
        if k < len(forced):
            s.commit(result, Verdict((), int(forced[k])), [])  # commit the forced token
    return rows


def compare_rows(got: np.ndarray, want: Sequence[np.ndarray]) -> RowCheck:
    diff = [float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(got, want, strict=True)]
    bad = sum(not np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    return RowCheck(len(diff), bad, max(diff, default=0.0))


def expected_rows(model: Decoder, prompt: Sequence[int], tokens: Sequence[int],
                  parents: Sequence[int]) -> list[np.ndarray]:
    """The one-token-step logits every row of the tree must reproduce (one decode per leaf)."""
    want: list[np.ndarray | None] = [None] * (1 + len(tokens))
    for chain in leaf_chains(parents):  # tree rows: 0 = root, 1 + j = node j
        steps = step_logits(model, prompt, [tokens[r - 1] for r in chain[1:]])
        for r, logits in zip(chain, steps, strict=True):
            want[r] = logits
    return want  # type: ignore[return-value]


def compare_tree(model: Decoder, prompt: Sequence[int], tokens: Sequence[int],
                 parents: Sequence[int]) -> RowCheck:
    """Rows of one tree forward vs the target-alone steps of their prefixes (bitwise)."""
    s = TargetSession(model, prompt, SamplingParams(), capacity=len(prompt) + len(tokens) + 4,
                      max_nodes=max(1, len(tokens)))
    got = s.logits(s.forward_tree(tokens, parents))
    return compare_rows(got, expected_rows(model, prompt, tokens, parents))


def compare_batch(model: Decoder, trees: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int]]]) -> RowCheck:
    """Each (prompt, tokens, parents) tree in one batched forward vs its target-alone steps."""
    sessions = [TargetSession(model, p, SamplingParams(), capacity=len(p) + len(t) + 4, max_nodes=max(1, len(t)))
                for p, t, _ in trees]
    results = forward_chains(model, [s.chain_job(t, par) for s, (_, t, par) in zip(sessions, trees, strict=True)],
                             sessions[0].min_rows)
    check = RowCheck(0, 0, 0.0)
    for s, (p, t, par), result in zip(sessions, trees, results, strict=True):
        check = check.merge(compare_rows(s.logits(result), expected_rows(model, p, t, par)))
    return check


def probe(model: Decoder, seed: int = 0, prefix: int = 12) -> RowCheck:
    """A chain of 4, a branching tree of 5, and a batch of two uneven trees, on random tokens."""
    rng = np.random.default_rng(seed)
    vocab = model.config.vocab_size

    def ids(n: int) -> list[int]:
        return [int(x) for x in rng.integers(0, vocab, n)]

    chain = (ids(prefix), ids(4), [-1, 0, 1, 2])
    branchy = (ids(prefix + 3), ids(5), [-1, -1, 0, 0, 2])
    check = compare_tree(model, *chain).merge(compare_tree(model, *branchy))
    return check.merge(compare_batch(model, [chain, (ids(prefix - 5), ids(2), [-1, 0])]))
