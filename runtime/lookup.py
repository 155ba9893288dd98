"""Prompt-lookup candidates: what followed earlier occurrences of the context's last tokens.

Prompt-lookup decoding (Saxena 2023; HF ``generate(prompt_lookup_num_tokens=…)``) drafts for
free where the output copies its input (summaries, code edits, retrieval answers, repeated
identifiers). For ``n`` from ``max_ngram`` down to ``min_ngram``, every earlier end position
``j < L`` with

    context[j - n : j] == context[L - n : L]        (L = len(context))

proposes ``context[j : j + length]``; the most recent match first, longer n-grams before shorter.
Continuations that repeat one already proposed (or are a prefix of one) are skipped; at most
``branches`` are returned. Pure: plain token lists in, plain token lists out.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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
