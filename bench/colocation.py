"""The co-location tax: the cloud's verify, slowed while the edge runs a proactive step beside it.

The bench runs the edge and the cloud on two cores of one host. They share its memory bandwidth
(and, under a hypervisor, maybe its physical cores), so a draft step on the edge's core slows a
verify on the cloud's: a T=4 verify of the default target took 143-150 ms alone and 156 ms while
the PyTorch draft stepped on the other core (Zen 4, 2026-12-05). Only a proactive policy steps
during the verify; ``fixed`` waits idle. A deployment's cloud is another machine and pays none of
it, so this table separates that cost from the policies' own:

    tax(policy, schedule, set) = median over the policy's rounds with proactive steps of
                                 verify_s / median(fixed's verify_s of the same set, schedule and
                                 tree size)

(round 0 left out: it may include the session's first forward).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from rapid.bench.md_table import md_table


@dataclass(slots=True, frozen=True)
class VerifyTax:
    policy: str
    schedule: str
    set: str
    ratio: float  # median verify_s with a branch step beside it / fixed's at the same tree size
    rounds: int  # the policy's rounds compared


def verify_tax(rounds: list[dict], policy: str, base: str = "fixed") -> list[VerifyTax]:
    """Per (schedule, set) the module docstring's ratio; cells without a comparable round are left out."""
    ref: dict[tuple, list[float]] = defaultdict(list)
    mine: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
    for r in rounds:
        if r.get("round", 0) == 0 or not r.get("tree_nodes") or not r.get("verify_s"):
            continue
        cell = (str(r.get("schedule", "none")), str(r["set"]))
        if r["policy"] == base:
            ref[(*cell, r["tree_nodes"])].append(r["verify_s"])
        elif r["policy"] == policy and r.get("proactive_steps"):
            mine[cell].append((r["tree_nodes"], r["verify_s"]))
    ref_median = {key: statistics.median(vs) for key, vs in ref.items()}  # once per (cell, size), not per round
    out = []
    for (schedule, pset), rows in sorted(mine.items()):
        ratios = [v / ref_median[(schedule, pset, n)] for n, v in rows if (schedule, pset, n) in ref_median]
        if ratios:
            out.append(VerifyTax(policy, schedule, pset, statistics.median(ratios), len(ratios)))
    return out


def verify_tax_lines(rounds: list[dict], policies: list[str]) -> list[str]:
    rows = [t for p in policies for t in verify_tax(rounds, p)]
    if not rows:
        return []
    L = ["", "## The co-location tax: the verify while the edge steps beside it (`rapid.bench.colocation`)", "",
         "Edge and cloud share this host's memory bandwidth: a proactive policy's verify, with a branch step "
         "running on the edge's core, over `fixed`'s verify of the same set and tree size (`fixed` waits idle). "
         "A cloud on its own machine pays none of it.", ""]
    return L + md_table(["policy", "schedule", "set", "verify / fixed's", "rounds"],
                        ([t.policy, t.schedule, t.set, f"{t.ratio:.3f}", t.rounds] for t in rows))
