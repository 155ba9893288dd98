"""The target's log-probabilities of the tokens a verdict emits (``VerdictFrame.logprobs``).

Every emitted token is the target's pick from one logits row: a path token ``tokens[j]`` from
the row of its parent (row 0 for a child of the root, row 1 + parent otherwise), the bonus from
the row of the path's end. For each such row ``z`` (float32, the raw model logits: before
temperature, top-p and top-k, as vLLM's default ``raw_logprobs``)

    logprob(t)  = (z − max z − log Σ exp(z − max z))_t      (``rapid.core.sampling.log_softmax``, float32)
    top_k(z)    = the k largest log-probabilities, descending, ties by lower token id

Each row is scored on its own (a fresh contiguous copy), so the numbers depend only on the row's
bits: a tree verification and target-alone decoding, whose rows are bitwise equal
(``rapid.server.chains``, ``rapid.server.invariance``), give bitwise equal log-probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rapid.core.acceptance import Verdict
from rapid.core.sampling import log_softmax, top_k_ids


@dataclass(slots=True)
class Scores:
    """Per emitted token: its log-probability and (row-major, k per token) its top alternatives."""

    logprobs: list[float] = field(default_factory=list)
    top_ids: list[int] = field(default_factory=list)
    top_logprobs: list[float] = field(default_factory=list)

    def extend(self, other: Scores) -> None:
        self.logprobs += other.logprobs
        self.top_ids += other.top_ids
        self.top_logprobs += other.top_logprobs


def emitted_rows(verdict: Verdict, tokens: Sequence[int]) -> tuple[list[int], list[int]]:
    """(row, token) of every emitted token: rows [0, 1 + path...] and tokens [path..., bonus]."""
    rows = [0, *(1 + j for j in verdict.path)]
    return rows, [*(int(tokens[j]) for j in verdict.path), verdict.bonus]


def score_rows(logits: np.ndarray, rows: Sequence[int], ids: Sequence[int], k: int) -> Scores:
    """Log-probabilities of ``ids[i]`` under ``logits[rows[i]]`` and each row's top ``k``."""
    out = Scores()
    for r, t in zip(rows, ids, strict=True):
        lp = log_softmax(np.array(logits[r], dtype=np.float32)[None, :])[0]  # a fresh row: its bits only
        out.logprobs.append(float(lp[t]))
        if k:
            top = top_k_ids(lp, k)
            out.top_ids += top.tolist()
            out.top_logprobs += lp[top].tolist()
    return out


def score_verdict(logits: np.ndarray, verdict: Verdict, tokens: Sequence[int], k: int) -> Scores:
    """``score_rows`` over the rows that produced ``verdict``'s emitted tokens."""
    rows, ids = emitted_rows(verdict, tokens)
    return score_rows(logits, rows, ids, k)
