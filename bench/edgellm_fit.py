"""The EdgeLLM-style policies' own behaviour, fitted from ``rapid bench`` traces for ``rapid sim``:
the confidence cut's continue odds, a chain branch's step cost and the steps a non-interruptible
branch runs (``rapid.bench.calibration`` stores them in a ``Calibration``)."""

from __future__ import annotations

import statistics

from rapid.bench.traces import group_runs, with_previous
from rapid.runtime.policies import POLICIES


def fit_confidence_cut(rounds: list[dict]) -> tuple[float, float] | None:
    """EdgeLLM's confidence cut as P(draft one more step | the last drafted token misses / matches).

    In a round that drafted ``d`` steps and had ``a`` accepted, step ``j`` (1..d) drafted a
    token that matches iff ``j <= a``; after step ``j < d`` the drafter continued, after step
    ``d`` below the planned depth it cut. None when no confidence-cut policy was traced.
    """
    cont = [[0, 0], [0, 0]]  # [miss, match] x [continued, decisions]
    for r, prev in with_previous(group_runs([r for r in rounds if r.get("policy") == "edgellm"])):
        kept = 0 if prev is None else prev.get("reused_depth", 0)
        d, a, planned = r.get("draft_steps", 0), r["accepted"], r["depth"]
        if d > 0 and kept == 0:  # rounds on a kept branch start mid-tree: skipped
            for j in range(1, d + 1):
                if j == d and d >= planned:
                    break  # stopped by the planned depth, not by the cut
                m = int(j <= a)
                cont[m][1] += 1
                cont[m][0] += j < d
    if cont[0][1] + cont[1][1] < 5:
        return None
    return tuple(c / n if n else 1.0 for c, n in cont)  # type: ignore[return-value]


def _uninterrupted_branch_rounds(rounds: list[dict]) -> list[dict]:
    """Rounds of a non-interruptible proactive policy (not ``interruptible``) that ran a branch."""
    uninterrupted = {p.name for p in POLICIES.values() if p.proactive and not p.interruptible}
    return [r for r in rounds if r.get("policy") in uninterrupted and r.get("proactive_steps")]


def fit_chain_step(rounds: list[dict]) -> float | None:
    """A chain branch's step time relative to a tree step (chain branches,
    ``Policy.chain_branch``): the median over rounds whose wait the branch set (wait > 1.1 x the
    cloud's time) of wait/branch steps over draft time/draft steps, both under the same load;
    None under 10 such rounds."""
    chains = {p.name for p in POLICIES.values() if p.proactive and p.chain_branch and not p.interruptible}
    ratio = [(r["wait_s"] / r["proactive_steps"]) / (r["draft_s"] / r["draft_steps"])
             for r in _uninterrupted_branch_rounds(rounds)
             if r["policy"] in chains and r.get("draft_steps", 0) > 0 and r.get("draft_s", 0) > 0
             and r.get("wait_s", 0) > 1.1 * r.get("cloud_s", 0)]
    return statistics.median(ratio) if len(ratio) >= 10 else None


def fit_branch_steps(rounds: list[dict]) -> dict[str, float]:
    """The mean branch steps a round ran, per non-interruptible policy, chain or tree (``npdg``'s
    tree branch runs ~4.4-7 steps for a depth of 4: its first steps feed the two waves of roots,
    then ``width`` nodes per step below them)."""
    mine = _uninterrupted_branch_rounds(rounds)
    return {p: statistics.fmean(r["proactive_steps"] for r in mine if r["policy"] == p)
            for p in sorted({r["policy"] for r in mine})}
