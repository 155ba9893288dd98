"""The ``oracle``'s depth plan in ``rapid sim``: a dynamic programme over the known future.

The oracle knows, from its position on, the accepted run at every position, whether a proactive
branch started at each position will be kept, and the current step time. A round at relative
position j with u levels kept from the last branch that drafts a chain of depth d ≤ r_j (r_j:
the run that will be accepted there) takes

    T(j, u, d) = max(0, d − u)·s + wait(d)             without a kept branch after it,
    T(j, u, d) = max(0, d − u)·s + max(wait(d), k·s)    with one (k = min(D, ⌈wait(d)/s⌉) steps
                                                         drafted until the verdict, kept as u'),
    wait(d) = verify(d) + link

and advances d + 1 positions. The plan minimises the time to cover the horizon:

    V(j, u) = min_{0 ≤ d ≤ r_j} T(j, u, d) + V(j + d + 1, u'),   V(j ≥ H, ·) = 0,

and the oracle executes the first decision, then plans again next round (receding horizon).
A myopic rule (best tokens per second for this round alone) is not a bound where a draft step
costs about verify + RTT (a Jetson against an H100): it drafts long chains where short rounds
whose next chain is drafted during the wait are faster — in ``orin-nano-h100`` at 5 ms RTT the
myopic oracle reached 0.95× of ``oracle-load``.
"""

from __future__ import annotations

import math


def plan_depth(runs: list[int], kept_after: list[bool], kept_empty: list[bool], reused: int, step_s: float,
               wait_s: list[float], max_depth: int) -> int:
    """The first depth of the fastest plan over ``len(runs)`` positions (formula: module docstring).

    ``runs[j]``: the run accepted at relative position j (already capped by the depth limit and
    the end); ``kept_after[j]``: a branch after a round that drafted and ends at j is kept;
    ``kept_empty[j]``: ... after a round at j that drafted nothing; ``wait_s[d]``: verify(d) +
    link seconds for d = 0..max_depth; ``step_s``: seconds per chain step (> 0).
    """
    if step_s <= 0:
        raise ValueError(f"step_s must be > 0, got {step_s}")
    h = len(runs)
    if h == 0:
        return 0
    if len(kept_after) < h + max_depth or len(kept_empty) < h or len(wait_s) <= max_depth:
        raise ValueError("kept_after needs len(runs) + max_depth entries, kept_empty len(runs), wait_s max_depth + 1")
    ks = [min(max_depth, math.ceil(w / step_s)) for w in wait_s]
    ends = [max(w, k * step_s) for w, k in zip(wait_s, ks, strict=True)]
    value = [[0.0] * (max_depth + 1) for _ in range(h + max_depth + 2)]
    first = 0
    for j in range(h - 1, -1, -1):
        for u in range(max_depth, -1, -1):
            best, arg = math.inf, 0
            for d in range(min(runs[j], max_depth) + 1):
                kept = kept_after[j + d] if d else kept_empty[j]
                t = max(0, d - u) * step_s + (ends[d] if kept else wait_s[d])
                nxt = j + d + 1
                if nxt < h:
                    t += value[nxt][ks[d] if kept else 0]
                if t < best:
                    best, arg = t, d
            value[j][u] = best
            if j == 0 and u == min(reused, max_depth):
                first = arg
    return first
