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
from collections.abc import Callable
from dataclasses import dataclass

from rapid.bench.md_table import md_table
from rapid.bench.step_fit import fully_loaded


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


# ---------------------------------------------------------------------------------------------
# the tax as ``rapid sim`` models it (one edge beside its cloud on the bench's host)
@dataclass(slots=True, frozen=True)
class ColocationFit:
    """The verify's co-location tax, fitted from the traced rounds (``fit_colocation``)."""
    # per loaded schedule: (in its load, out of it) verify / the verify alone (the idle edge's)
    verify_by_schedule: dict[str, tuple[float, float]]
    load_tax: float  # λ: in any load, a verify takes (1 + λ) × its time alone (pooled)
    step_tax: float  # κ: verify seconds added per second of edge draft step beside an unloaded verify
    step_rounds: int  # rounds κ was fitted from (unloaded, a branch or catch-up step beside the verify)


MIN_ROUNDS = 5  # rounds a schedule's phase needs for its own verify factor


def _nothing_beside(r: dict) -> bool:
    """A round whose edge drafted nothing while its verify ran: no proactive or catch-up step."""
    return not r.get("proactive_steps") and not r.get("catch_up_s")


def verify_alone(r: dict) -> bool:
    """A round whose verify ran with the edge's core idle: nothing drafted beside it and no
    contention load (round 0 left out: it may include the session's first forward)."""
    return r.get("round", 0) > 0 and r.get("verify_s", 0) > 0 and _nothing_beside(r) and not r.get("load")


def steps_beside(r: dict) -> float:
    """Seconds of edge drafting beside a round's verify: the branch's steps, from the send, at the
    round's own step time (the controller's where the round drafted nothing), and the catch-up
    step, clipped to the verify's window (from half the transport time after the send)."""
    steps = r.get("proactive_steps") or 0
    tau = r["draft_s"] / r["draft_steps"] if r.get("draft_steps") and r.get("draft_s") else r.get("tau_cur") or 0.0
    busy = steps * tau + (r.get("catch_up_s") or 0.0)
    up = max(0.0, (r.get("cloud_s", 0.0) - r["verify_s"]) / 2)
    return max(0.0, min(busy, up + r["verify_s"]) - up)


def _ratio(rows: list[dict], alone: Callable[[float], float]) -> float:
    return sum(r["verify_s"] for r in rows) / sum(alone(r["tree_nodes"]) for r in rows)


def fit_colocation(rounds: list[dict], alone: Callable[[float], float], scheds: dict) -> ColocationFit:
    """The tax against ``alone(nodes)``, the verify with the edge idle (ratios of sums, over
    rounds with nothing drafted beside the verify unless said):

        verify_by_schedule[s] = (Σ verify_s / Σ alone over rounds of s wholly in its load,
                                 the same over rounds of s wholly out of it, else 1)
        λ = (the same over every fully loaded round) − 1
        κ = Σ (verify_s − alone · out-of-load factor) / Σ steps_beside   over unloaded rounds with a step beside

    (a step in the load taxes the verify little more than the load itself: κ fitted on loaded
    rounds was 0.01-0.13 against 0.20-0.26 unloaded; Zen 3, 2026-12-07). 1 / 0 where nothing fits;
    κ kept in [0, 0.9] (the simulator's growing window needs κ < 1)."""
    timed = [r for r in rounds if r.get("round", 0) > 0 and r.get("verify_s", 0) > 0 and r.get("tree_nodes")]
    quiet = [r for r in timed if _nothing_beside(r)]
    on: dict[str, list[dict]] = defaultdict(list)
    off: dict[str, list[dict]] = defaultdict(list)
    for r in quiet:
        name = str(r.get("schedule", "none"))
        if fully_loaded(r, scheds):
            on[name].append(r)
        elif not r.get("load") and name != "none":
            off[name].append(r)
    by_schedule = {k: (_ratio(v, alone), _ratio(off[k], alone) if len(off[k]) >= MIN_ROUNDS else 1.0)
                   for k, v in on.items() if len(v) >= MIN_ROUNDS}
    loaded = [r for v in on.values() for r in v]
    lam = _ratio(loaded, alone) - 1.0 if loaded else 0.0
    beside = [(r, steps_beside(r)) for r in timed if not r.get("load")]
    beside = [(r, b) for r, b in beside if b > 0]
    excess = sum(r["verify_s"] - alone(r["tree_nodes"]) * by_schedule.get(str(r.get("schedule")), (1.0, 1.0))[1]
                 for r, _ in beside)
    den = sum(b for _, b in beside)
    kappa = excess / den if den > 0 else 0.0
    return ColocationFit(by_schedule, max(0.0, lam), min(0.9, max(0.0, kappa)), len(beside))


def overlap_as_it_grows(a: float, b: float, v0: float, v1: float, kappa: float) -> float:
    """Overlap of a step [a, b] with a verify [v0, v1] that grows by ``kappa`` seconds per second
    of step beside it: with x = max(a, v0), o = min(b − x, (v1 − x) / (1 − κ)), at least 0 (the
    window's end moves by κ·o, so a step that outlasts it meets (v1 − x)·κ/(1 − κ) more of it)."""
    x = max(a, v0)
    return max(0.0, min(b - x, (v1 - x) / (1.0 - kappa)))
