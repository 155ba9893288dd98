"""Prompt-lookup candidates: what followed earlier occurrences of the context's last tokens.

Prompt-lookup decoding (Saxena 2023; HF ``generate(prompt_lookup_num_tokens=…)``) drafts for
free where the output copies its input (summaries, code edits, retrieval answers, repeated
identifiers). For ``n`` from ``max_ngram`` down to ``min_ngram``, every earlier end position
``j < L`` with

    context[j - n : j] == context[L - n : L]        (L = len(context))

proposes ``context[j : j + length]``; the most recent match first, longer n-grams before shorter.
Continuations that repeat one already proposed (or are a prefix of one) are skipped; at most
``branches`` are returned. Pure: plain token lists in, plain token lists out.

How far to trust them is learnt per request (``LookupStats``): after each verdict, every
proposed continuation ``c`` is compared with the emitted tokens ``e`` (accepted path + bonus):

    hits  += ℓ = len(common prefix of c and e)
    tries += ℓ + [ℓ < min(len(c), len(e))]             (the first mismatch is a try too)
    p      = (hits + w·p0) / (tries + w)                 (p0 the prior, w = PRIOR_WEIGHT)

each count decaying by ``DECAY`` per verdict, p clipped to [P_MIN, P_MAX]: a lookup token then
scores log p, so repeating text earns long chains and text that never repeats earns none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PRIOR_WEIGHT = 2.0  # pseudo-tries of the prior
DECAY = 0.9  # per verdict: recent verdicts weigh most
P_MIN, P_MAX = 0.02, 0.95


def lookup_continuations(context: Sequence[int], length: int, branches: int = 2, max_ngram: int = 3,
                         min_ngram: int = 2) -> list[list[int]]:
    """Up to ``branches`` distinct continuations (each 1..``length`` tokens) of the context's last
    n-gram, from its earlier matches; ``[]`` when nothing matches (see the module docstring)."""
    if length < 1 or branches < 1:
        return []
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
    ctx = np.asarray(context, dtype=np.int64)
    out: list[list[int]] = []
    for n in range(min(max_ngram, len(ctx) - 1), min_ngram - 1, -1):
        for j in _match_ends(ctx, n):
            cont = ctx[j: j + length].tolist()
            if not any(prev[: len(cont)] == cont for prev in out):
                out.append(cont)
                if len(out) == branches:
                    return out
    return out


def _match_ends(ctx: np.ndarray, n: int) -> list[int]:
    """End positions ``j < len(ctx)`` of earlier windows equal to the last ``n`` tokens, latest first."""
    windows = np.lib.stride_tricks.sliding_window_view(ctx[:-1], n)  # window s covers ctx[s : s + n]
    hits = np.flatnonzero((windows == ctx[-n:]).all(axis=1))
    return [int(s) + n for s in hits[::-1]]


@dataclass(slots=True)
class LookupStats:
    """Running P(a lookup token is right | the ones before it were); see the module docstring."""

    prior: float = 0.5
    hits: float = 0.0
    tries: float = 0.0

    @property
    def p(self) -> float:
        p = (self.hits + PRIOR_WEIGHT * self.prior) / (self.tries + PRIOR_WEIGHT)
        return min(P_MAX, max(P_MIN, p))

    def observe(self, proposed: Sequence[Sequence[int]], emitted: Sequence[int]) -> None:
        """Count one verdict's outcome for the continuations proposed to its tree."""
        self.hits *= DECAY
        self.tries *= DECAY
        for cont in proposed:
            n = min(len(cont), len(emitted))
            ell = next((i for i in range(n) if cont[i] != emitted[i]), n)
            self.hits += ell
            self.tries += ell + (1 if ell < n else 0)
