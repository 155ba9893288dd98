"""Where the verdicts landed for the proactive branch: why a branch was kept or discarded.

Every round with a branch records ``branch_outcome`` (``rapid.runtime.ipdg.branch_outcome``):
``hit`` (kept), ``late`` (on a root not fed yet), ``unfed`` (on a node whose next tokens the
draft never computed), ``rank<r>`` (on a fed node, the bonus the draft's r-th best token there
that no root took) or ``unranked``. Per schedule and set, one policy's rounds:

    rounds       rounds with a branch
    share        of those rounds per outcome (rank 2 and beyond together)
    whole tree   share of those rounds whose verdict accepted the tree to its deepest level,
                 and how many of them were kept
    draft's P    mean over those rounds of the draft's own probability that the verdict lands on
                 a first-wave root (``first_wave_p``: the sum of those roots' path probabilities;
                 "-" for traces without it): against hit + late, how far to trust it

so a miss reads as "the branch never fed the node the verdict stopped at" (feed more of the
tree in its first step), "the draft ranked the bonus second there" (more roots) or "the draft
did not see it coming" (its quality).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from rapid.bench.md_table import md_table

COLUMNS = ("hit", "late", "unfed", "rank0", "rank1", "rank2+", "unranked")


def outcome_column(outcome: str) -> str:
    """The table column of one recorded outcome (``rank2``, ``rank3``, ... share ``rank2+``)."""
    if outcome.startswith("rank") and outcome not in ("rank0", "rank1"):
        return "rank2+"
    return outcome


@dataclass(slots=True, frozen=True)
class BranchOutcomes:
    schedule: str
    set: str
    rounds: int  # rounds with a branch (and a recorded outcome)
    share: dict[str, float]  # COLUMNS -> share of rounds
    whole: float  # share of rounds that accepted the sent tree to its deepest level
    whole_kept: float  # of those, the share kept
    first_wave_p: float | None  # mean draft P(the verdict lands on a first-wave root); None: not traced


def branch_outcomes(rounds: list[dict], policy: str) -> list[BranchOutcomes]:
    """Per (schedule, set), the module docstring's columns from ``policy``'s rounds."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rounds:
        if r["policy"] == policy and r.get("branch_outcome"):
            groups[(r.get("schedule", "none"), r["set"])].append(r)
    out = []
    for (schedule, pset), rs in sorted(groups.items()):
        counts = Counter(outcome_column(r["branch_outcome"]) for r in rs)
        whole = [r for r in rs if r["tree_depth"] and r["accepted"] >= r["tree_depth"]]
        masses = [r["first_wave_p"] for r in rs if r.get("first_wave_p") is not None]
        out.append(BranchOutcomes(
            schedule, pset, len(rs), {c: counts.get(c, 0) / len(rs) for c in COLUMNS}, len(whole) / len(rs),
            sum(r["branch_outcome"] == "hit" for r in whole) / len(whole) if whole else 0.0,
            sum(masses) / len(masses) if masses else None))
    return out


def branch_outcome_lines(rounds: list[dict], policy: str) -> list[str]:
    rows = branch_outcomes(rounds, policy)
    if not rows:
        return []
    L = ["", f"## Where the verdicts landed for the proactive branch ({policy}; `rapid.bench.branch_outcomes`)", "",
         "hit: kept; late: on a root not fed yet; unfed: on a node the draft never fed (no root could be "
         "there); rank r: on a fed node, the bonus the draft's r-th best token there, not taken as a root; "
         "unranked: outside the draft's recorded top list. draft's P: the draft's own probability that the "
         "verdict lands on a first-wave root, to compare with hit + late.", ""]
    return L + md_table(["schedule", "set", "rounds", *COLUMNS, "whole tree accepted", "of which kept",
                         "draft's P (first wave)"],
                        ([r.schedule, r.set, r.rounds, *(f"{r.share[c]:.2f}" for c in COLUMNS), f"{r.whole:.2f}",
                          f"{r.whole_kept:.2f}", "-" if r.first_wave_p is None else f"{r.first_wave_p:.2f}"]
                         for r in rows))
