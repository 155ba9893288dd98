"""The ``oracle``'s depth plan in ``rapid sim``: a dynamic programme over the known future.

The oracle knows, from its position on, the accepted run at every position, whether a proactive
branch started at each position will be kept, and the current step time. A round at relative
position j with u levels kept from the last branch that drafts a chain of depth d ≤ r_j (r_j:
the run that will be accepted there) takes

    T(j, u, d) = max(0, d − u)·s + wait(d)             without a kept branch after it,
    T(j, u, d, b) = max(0, d − u)·s + max(wait(d), b·s) with one of b steps (kept as u' = b),
    b ∈ {⌊wait(d)/s⌋, ⌈wait(d)/s⌉} (capped at D): the longest branch done by the verdict, or one
    step more (any other b is no faster: more levels are never worse, and a step past the verdict
    costs what it would cost in the next round), wait(d) = verify(d) + link

and advances d + 1 positions. The plan minimises the time to cover the horizon:

    V(j, u) = min_{0 ≤ d ≤ r_j} T(j, u, d) + V(j + d + 1, u'),   V(j ≥ H, ·) = −(j − H)·c,

c = min_d wait(d) / (D + 1), the least time a position can take (one round covers at most D + 1):
positions past the horizon are credited at that rate, so a plan that ends on the horizon does not
tie with one that goes further (with V(j ≥ H) = 0 the ties went to the shortest round, and the
receding plan kept drafting 2 of 8 accepted tokens at 150 ms RTT). The oracle executes the first
decision, then plans again next round (receding horizon).
A myopic rule (best tokens per second for this round alone) is not a bound where a draft step
costs about verify + RTT (a Jetson against an H100): it drafts long chains where short rounds
whose next chain is drafted during the wait are faster — in ``orin-nano-h100`` at 5 ms RTT the
myopic oracle reached 0.95× of ``oracle-load``.
"""

from __future__ import annotations

import math


def plan_depth(runs: list[int], kept_after: list[bool], kept_empty: list[bool], reused: int, step_s: float,
               wait_s: list[float], max_depth: int) -> tuple[int, int]:
    """The first (depth, branch steps) of the fastest plan over ``len(runs)`` positions (formula:
    module docstring); the branch is drafted only where it will be kept.

    ``runs[j]``: the run accepted at relative position j (already capped by the depth limit and
    the end); ``kept_after[j]``: a branch after a round that drafted and ends at j is kept;
    ``kept_empty[j]``: ... after a round at j that drafted nothing; ``wait_s[d]``: verify(d) +
    link seconds for d = 0..max_depth; ``step_s``: seconds per chain step (> 0).
    """
    if step_s <= 0:
        raise ValueError(f"step_s must be > 0, got {step_s}")
    h = len(runs)
    if h == 0:
        return 0, 0
    if len(kept_after) < h + max_depth or len(kept_empty) < h or len(wait_s) <= max_depth:
        raise ValueError("kept_after needs len(runs) + max_depth entries, kept_empty len(runs), wait_s max_depth + 1")
    # per depth: the branch choices (steps, round end after the send)
    choices = [sorted({(b, max(w, b * step_s)) for b in (min(max_depth, math.floor(w / step_s)),
                                                           min(max_depth, math.ceil(w / step_s)))})
               for w in wait_s]
    credit = min(wait_s) / (max_depth + 1)
    value = [[0.0] * (max_depth + 1) for _ in range(h + 1)]
    first = (0, 0)
    for j in range(h - 1, -1, -1):
        for u in range(max_depth, -1, -1):
            best, arg = math.inf, (0, 0)
            for d in range(min(runs[j], max_depth) + 1):
                nxt = j + d + 1
                kept = kept_after[j + d] if d else kept_empty[j]
                opts = choices[d] if kept else [(0, wait_s[d])]
                for b, end in opts:
                    t = max(0, d - u) * step_s + end
                    t += value[nxt][b] if nxt < h else -(nxt - h) * credit
                    if t < best:
                        best, arg = t, (d, b)
            value[j][u] = best
            if j == 0 and u == min(reused, max_depth):
                first = arg
    return first
