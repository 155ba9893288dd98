"""Verifies the host stalled: rounds whose verify took far longer than the run's verifies of the
same tree size, which no policy causes and no simulator models.

A fresh slow-edge run on the AMX class (`amx-sustained-n5-end`, 2026-12-07) held six verifies of
2-6 s against ~0.35 s, all in two prompts of one cell, the edge's steps slowed in the same rounds
(both cores: the host). They were 18.5 s of that cell's 83.0 s, and moved its ratio by a third.
The report lists them so a ratio or a simulator validation is not read off a stalled cell::

    stalled(r)  <=>  verify_s(r) > FACTOR * typical(tree_nodes(r))
    typical(n)   =  median{ verify_s(q) : q in the run, tree_nodes(q) = n }     (>= MIN_SAMPLES of them)
                 =  median{ verify_s(q) : tree_nodes(q) <= n }                   (else, >= MIN_SAMPLES)

(a verify grows with its tree, so the smaller trees' median is a lower bound: steep fp32 curves
reach 2.4x a one-token step at 32 nodes, well inside FACTOR). Sizes with fewer verifies at or
below them are not judged. Pure: rounds in, stalls out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

FACTOR = 4.0  # a verify this many times its size's median is a stall, not a busier round
MIN_SAMPLES = 5  # verifies of a size needed to judge it


@dataclass(slots=True, frozen=True)
class Stall:
    set: str
    policy: str
    prompt_id: str
    round: int
    verify_s: float
    typical_s: float  # the median verify of its tree size in the run

    @property
    def excess_s(self) -> float:
        return self.verify_s - self.typical_s


def stalled_verifies(rounds: list[dict], factor: float = FACTOR) -> list[Stall]:
    """The rounds whose verify exceeds ``factor`` times the run's median at the same tree size."""
    by_size: dict[int, list[float]] = defaultdict(list)
    for r in rounds:
        if r.get("verify_s", 0) > 0:
            by_size[int(r.get("tree_nodes", 0))].append(float(r["verify_s"]))
    typical: dict[int, float] = {}
    for n, v in by_size.items():
        pool = v if len(v) >= MIN_SAMPLES else [x for m, w in by_size.items() if m <= n for x in w]
        if len(pool) >= MIN_SAMPLES:
            typical[n] = statistics.median(pool)
    return [Stall(str(r.get("set")), str(r.get("policy")), str(r.get("prompt_id")), int(r.get("round", 0)),
                  float(r["verify_s"]), typical[n])
            for r in rounds if (n := int(r.get("tree_nodes", 0))) in typical
            and r.get("verify_s", 0) > factor * typical[n]]


def stall_lines(rounds: list[dict]) -> list[str]:
    """The report's line on them: none, or how many, their excess seconds, and the cells they hit."""
    stalls = stalled_verifies(rounds)
    if not stalls:
        return [f"- stalled verifies (> {FACTOR:g}x the run's median at the same tree size): none"]
    cells: dict[tuple[str, str], list[Stall]] = defaultdict(list)
    for s in stalls:
        cells[(s.set, s.policy)].append(s)
    where = "; ".join(f"{st} `{pol}` prompts {sorted({s.prompt_id for s in v})}, {sum(s.excess_s for s in v):.1f} s"
                      for (st, pol), v in sorted(cells.items()))
    return [f"- **stalled verifies** (> {FACTOR:g}x the run's median at the same tree size; the host, not a policy): "
            f"{len(stalls)} rounds, {sum(s.excess_s for s in stalls):.1f} s over their size's median ({where}); "
            "ratios of these cells and a `rapid sim` validation against them carry that time"]
