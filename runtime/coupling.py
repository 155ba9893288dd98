"""Coupled drafting: under seeded sampling, propose the tokens the target will draw.

The target's token at absolute position p is ``argmax_v z_v`` with ``z = noisy_scores(logits, p)``
= filtered logits / T + g(seed, p) (``rapid.sampling``). The edge knows the seed and p, so it
scores its own candidates with the same function on the draft's logits ``ℓ``:

    z_v  = noisy_scores(ℓ, p, params)_v        (-inf outside the draft's top-k / top-p)
    children, best first = the k largest finite z_v (ties by token id)
    score_v = log softmax_v(z / τ)  over the finite z          (τ = COUPLED_TAU)

so the first child is exactly the draft's own Gumbel-max draw with the target's noise, and the
alternatives follow by noisy score. Every node at the same depth sits at the same position and
therefore sees the same noise. The cloud's rule is untouched: coupling changes only which
tokens are proposed, never which are accepted.

The score is the probability that the target draws v under the model "the target's noisy scores
are the draft's plus i.i.d. Gumbel noise of scale τ" (for that model the Gumbel-max trick gives
this softmax exactly). It is ≤ 0 and falls along a path, as the budgeted pruning of
``rapid.runtime.tree`` requires, it orders siblings as the ranking does, and it is comparable
across depths (a log-probability of "the target draws this path"). The draft's plain sampling
probability would not do: it ignores the noise, so a low-probability token that wins the draw
would be pruned in favour of likely tokens that lost it.

COUPLED_TAU = 1.0: measured on the default pair (Qwen2.5-Coder 1.5B bf16 target, 0.5B int4 ONNX
draft), temperature 0.7, top-p 0.8, see docs/bench.md "Coupled drafting": MEASUREMENT_PLACEHOLDER
"""

from __future__ import annotations

import numpy as np

from rapid.sampling import SamplingParams, noisy_scores, top_k_ids

COUPLED_TAU = 1.0  # see the module docstring's measurement


def coupled_top(logits: np.ndarray, position: int, params: SamplingParams, k: int,
                tau: float = COUPLED_TAU) -> list[tuple[int, float]]:
    """The ``k`` best (token, score) candidates for the token at absolute ``position`` given the
    draft's ``logits`` row [V]: by noisy score z, then score = log softmax(z / τ) (module docstring).
    Fewer than ``k`` when the draft's top-k / top-p keeps fewer tokens."""
    if params.greedy:
        raise ValueError("coupled drafting needs sampling (temperature > 0)")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    z = noisy_scores(logits, position, params)
    finite = np.isfinite(z)
    k = min(k, int(finite.sum()))
    idx = top_k_ids(z, k)
    zf = z[finite] / tau
    m = zf.max()
    lse = m + np.log(np.exp(zf - m).sum())
    return [(int(t), float(z[t] / tau - lse)) for t in idx]
