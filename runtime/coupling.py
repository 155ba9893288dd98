"""Coupled drafting: under seeded sampling, propose the tokens the target will draw.

The target's token at absolute position p is ``argmax_v z_v`` with ``z = noisy_scores(logits, p)``
= filtered logits / T + g(seed, p) (``rapid.core.sampling``). The edge knows the seed and p, so it
ranks its own candidates with the same functions on the draft's logits ``ℓ``:

    z_v = noisy_scores(ℓ, p)_v        = ℓ_v / T + g_v  inside the draft's top-k / top-p set K, else -inf
    u_v = tempered(ℓ)_v + g_v         = ℓ_v / T + g_v  for every token (the noisy score before the filter)
    children, best first = K by z descending, then the other tokens by u descending (ties by id)
    score_v = log softmax_v(u / τ)    over the whole vocabulary                  (τ = COUPLED_TAU)

so the first child is exactly the draft's own Gumbel-max draw with the target's noise, and the
alternatives follow by noisy score. Every node at the same depth sits at the same position and
therefore sees the same noise. The cloud's rule is untouched: coupling changes only which
tokens are proposed, never which are accepted.

Why the tokens outside K, and why this score (``scripts/coupling_calibration.py``: the default
pair, bf16 Qwen2.5-Coder-1.5B target, int4 ONNX 0.5B draft; temperature 0.7, top-p 0.8, seed 0;
2 prompts each of c4, oasst, mtbench, wikitext, 32 sampled tokens each, 256 positions):

- the target drew a token outside the draft's own top-p set at 19.1 % of positions (the draft's
  nucleus is narrower: median 2 tokens), so candidates stop at K would never propose them. With
  the ranking above the draw is the rank-1 / ≤2 / ≤3 / ≤4 candidate at 68.8 / 79.7 / 84.4 /
  87.1 % of positions; K only: 68.8 / 77.3 / 79.7 / 79.7 %; the uncoupled drafter's log-softmax
  ranking: 62.1 / 76.6 / 79.3 / 83.2 %;
- the score is the probability that the target draws v under the model "the target's noisy
  scores are the draft's unfiltered ones plus i.i.d. Gumbel noise of scale τ" (for which the
  Gumbel-max trick gives this softmax exactly). τ = 1 is the best calibrated: log-loss of the
  target's draw 1.45 nats per position (τ = 0.5: 2.20, 1.5: 1.50, 2: 1.98), mean predicted
  probability of the rank-1..4 candidates 0.673 / 0.114 / 0.046 / 0.037 against measured hit
  rates 0.688 / 0.109 / 0.047 / 0.027. The same softmax over z only (zero outside K) costs 5.6
  nats, because it gives the 19 % of draws outside K no chance at all.

The score is ≤ 0 and adds up along a path (a log-probability of "the target draws this path"),
so the budgeted pruning of ``rapid.runtime.tree`` stays ancestor-closed and compares depths. Inside
K it orders siblings as the ranking does; a token outside K can score above one inside (a large
g), and pruning then follows the score. The draft's plain sampling probability would not do: it
ignores the noise, so a low-probability token that wins the draw would be pruned in favour of
likely tokens that lost it.
"""

from __future__ import annotations

import numpy as np

from rapid.core.sampling import SamplingParams, gumbel_noise, noisy_scores, tempered, top_k_ids

COUPLED_TAU = 1.0  # the best calibrated scale (module docstring)


def coupled_top(logits: np.ndarray, position: int, params: SamplingParams, k: int,
                tau: float = COUPLED_TAU) -> list[tuple[int, float]]:
    """The ``k`` best (token, score) candidates for the token at absolute ``position`` given the
    draft's ``logits`` row [V]: the draft's top-k / top-p set by noisy score z, then the other
    tokens by unfiltered noisy score u; score = log softmax(u / τ) (module docstring)."""
    if params.greedy:
        raise ValueError("coupled drafting needs sampling (temperature > 0)")
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    z = noisy_scores(logits, position, params)
    u = tempered(logits, params) + gumbel_noise(params, position, logits.shape[-1])
    inside = np.isfinite(z)
    k = min(k, z.shape[0])
    kept = np.flatnonzero(inside)  # ascending: ties still go to the lower id
    idx = kept[top_k_ids(z[kept], min(k, kept.shape[0]))]  # (a partition over ~V tied -inf is slow)
    if idx.shape[0] < k:
        idx = np.concatenate([idx, top_k_ids(np.where(inside, -np.inf, u), k - idx.shape[0])])
    s = u / tau
    m = s.max()
    lse = m + np.log(np.exp(s - m).sum())
    return [(int(t), float(s[t] - lse)) for t in idx]
