"""The comparative targets over prompt sets, and the ablation fixed → +IPDG → +CAAC → RAPID.

Input: the ``ratios`` rows of ``rapid.bench.report`` (one per profile × schedule × set × policy,
``vs_<base>`` = median tok/s of the policy over the base's in the same cell) and the
``aggregate`` rows (``tok_s`` medians). Pure: plain rows in, plain rows out.

Count targets (issue 15, item 5) hold for a schedule kind and a profile:

    met  ⇔  #{ sets s : tok_s(policy, s) / tok_s(base, s) >= ratio }  >=  need

and "every set" targets are the count with ``need`` = the number of sets measured. The ablation
is the macro mean over sets of each policy's tok/s relative to ``fixed`` in the same cell:

    gain(p) = (1 / |S|) Σ_s  tok_s(p, s) / tok_s(fixed, s)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from rapid.bench.md_table import md_table

ABLATION = ("fixed", "ipdg", "caac", "rapid", "rapid-cost")  # each step adds one mechanism
ABLATION_LABELS = {"fixed": "fixed", "ipdg": "+IPDG", "caac": "+CAAC (no IPDG)", "rapid": "RAPID (both)",
                   "rapid-cost": "rapid-cost"}
ADAPTIVE = ("caac", "rapid", "rapid-cost")  # policies that choose their own depth


@dataclass(slots=True, frozen=True)
class CountTarget:
    schedule: str  # schedule kind: none | sustained | burst
    policy: str
    base: str
    ratio: float  # the per-set ratio a set must reach
    need: int | None  # sets that must reach it; None = every set measured


COUNT_TARGETS = (
    CountTarget("sustained", "rapid", "fixed", 1.3, None),
    CountTarget("sustained", "rapid", "npdg", 1.1, None),
    CountTarget("sustained", "rapid", "edgellm", 1.0, 4),
    *(CountTarget(k, "rapid-cost", "rapid", 1.0, None) for k in ("none", "sustained", "burst")),
    CountTarget("sustained", "rapid-cost", "rapid", 1.15, 2),
    *(CountTarget("none", p, "ar", 1.0, None) for p in ADAPTIVE),
    *(CountTarget("none", p, "fixed", 1.0, None) for p in ADAPTIVE),  # without load, none below fixed
)


def count_targets(default: str) -> tuple[CountTarget, ...]:
    """COUNT_TARGETS, plus issue 22's RAPID target for ``default`` (the edge's default policy)
    where that is not ``rapid``: ≥ 1.3× fixed on every set under sustained load."""
    extra = CountTarget("sustained", default, "fixed", 1.3, None)
    return COUNT_TARGETS if extra in COUNT_TARGETS else (extra, *COUNT_TARGETS)


def _tok_s_by_cell(rows: list[dict]) -> dict[tuple[str, str, str], dict[str, float]]:
    cells: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        cells[(r["profile"], r["schedule"].split(":")[0], r["set"])][r["policy"]] = r["tok_s"]
    return cells


def count_checks(rows: list[dict], targets: tuple[CountTarget, ...] = COUNT_TARGETS) -> list[dict]:
    """Per (profile, target): the per-set ratios, how many sets reach the ratio, met or not."""
    cells = _tok_s_by_cell(rows)
    out = []
    for prof in sorted({k[0] for k in cells}):
        for t in targets:
            per_set = {s: pols[t.policy] / pols[t.base] for (p, kind, s), pols in sorted(cells.items())
                       if p == prof and kind == t.schedule and pols.get(t.base, 0) > 0 and t.policy in pols}
            if not per_set:
                continue
            reached = sum(v >= t.ratio for v in per_set.values())
            need = len(per_set) if t.need is None else t.need
            out.append({"profile": prof, "target": t, "per_set": per_set, "reached": reached, "need": need,
                        "met": reached >= need})
    return out


def ablation(rows: list[dict], schedule_kind: str = "sustained",
             policies: tuple[str, ...] = ABLATION) -> list[dict]:
    """Per profile and policy: the macro mean over sets of tok/s relative to ``fixed``, and the
    macro mean tok/s; sets where ``fixed`` or the policy is missing are left out."""
    cells = _tok_s_by_cell(rows)
    out = []
    for prof in sorted({k[0] for k in cells}):
        sub = {s: pols for (p, kind, s), pols in cells.items() if p == prof and kind == schedule_kind}
        for pol in policies:
            sets = [s for s, pols in sub.items() if pols.get("fixed", 0) > 0 and pol in pols]
            if sets:
                out.append({"profile": prof, "policy": pol, "label": ABLATION_LABELS.get(pol, pol),
                            "sets": len(sets),
                            "gain": statistics.fmean(sub[s][pol] / sub[s]["fixed"] for s in sets),
                            "tok_s": statistics.fmean(sub[s][pol] for s in sets)})
    return out


def fastest_checks(rows: list[dict], default: str, kinds: tuple[str, ...] = ("sustained", "burst"),
                   slack: float = 0.03) -> list[dict]:
    """Per profile, schedule kind in ``kinds`` and set: the fastest drafting policy measured and
    ``default``'s tok/s over it (cells without ``default`` are left out):

        fastest  ⇔  ratio = tok_s(default) / max_p tok_s(p) = 1        near  ⇔  ratio >= 1 − slack
    """
    out = []
    for (prof, kind, st), pols in sorted(_tok_s_by_cell(rows).items()):
        drafting = {p: v for p, v in pols.items() if p != "ar"}
        if kind not in kinds or default not in drafting:
            continue
        best = max(drafting, key=lambda p: (drafting[p], p == default))
        ratio = drafting[default] / drafting[best] if drafting[best] > 0 else 0.0
        out.append({"profile": prof, "schedule": kind, "set": st, "fastest": best, "ratio": ratio,
                    "is_fastest": best == default, "near": ratio >= 1.0 - slack})
    return out


def _regime_lines(rows: list[dict], default: str, slack: float = 0.03) -> list[str]:
    """Markdown: is ``default`` the fastest policy under load (empty when no cell has it)."""
    fast = fastest_checks(rows, default, slack=slack)
    if not fast:
        return []
    n, best, near = len(fast), sum(c["is_fastest"] for c in fast), sum(c["near"] for c in fast)
    L = ["", f"## The default policy (`{default}`) against the fastest measured policy, under load", "",
         f"fastest in {best} of {n} cells, within {slack:.0%} in {near} of {n}", ""]
    return L + md_table(["profile", "schedule", "set", "fastest", "default / fastest"],
                        ([c["profile"], c["schedule"], c["set"], c["fastest"], f"{c['ratio']:.2f}"] for c in fast))


def target_lines(rows: list[dict], default: str) -> list[str]:
    """Markdown: the count targets, the ablation table and ``default`` (the edge's default policy)
    against the fastest policy under load (empty when nothing applies)."""
    checks = count_checks(rows, count_targets(default))
    L: list[str] = []
    if checks:
        table = []
        for c in checks:
            t = c["target"]
            per = ", ".join(f"{s} {v:.2f}" for s, v in c["per_set"].items())
            want = "every set" if t.need is None else f"{t.need} sets"
            table.append([c["profile"], t.schedule, f"{t.policy}/{t.base} ≥ {t.ratio:g}", per,
                         f"{c['reached']}/{len(c['per_set'])}", want, "met" if c["met"] else "missed"])
        L += ["", "## Targets over prompt sets", "",
              *md_table(["profile", "schedule", "ratio", "per set", "sets reaching it", "target", "verdict"], table)]
    abl = ablation(rows)
    if abl:
        L += ["", "## Ablation under sustained contention (macro mean over sets)", "",
              *md_table(["profile", "policy", "sets", "tok/s", "vs fixed"],
                        ([a["profile"], a["label"], a["sets"], f"{a['tok_s']:.2f}", f"{a['gain']:.2f}"] for a in abl))]
    return L + _regime_lines(rows, default)
