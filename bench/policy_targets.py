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
from itertools import pairwise

from rapid.bench.contention import schedule_kind
from rapid.bench.md_table import md_table
from rapid.bench.paired_runs import (
    RepeatTable,
    ablation_by_repeat,
    increasing_repeats,
    paired_ratios,
    repeat_tok_s,
    spread_text,
    undecided,
)

ABLATION = ("fixed", "ipdg", "caac", "rapid", "rapid-cost")  # each step adds one mechanism
ABLATION_LABELS = {"fixed": "fixed", "ipdg": "+IPDG", "caac": "+CAAC (no IPDG)", "rapid": "RAPID (both)",
                   "rapid-cost": "rapid-cost"}
ADAPTIVE = ("caac", "rapid", "rapid-cost")  # policies that choose their own depth
ORDERED = ABLATION[:4]  # issue 22: fixed < +IPDG < +CAAC < RAPID, strictly


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
    """COUNT_TARGETS, plus, for ``default`` (the edge's default policy), issue 22's RAPID target
    where that is not ``rapid`` (≥ 1.3× fixed on every set under sustained load) and issue 21's
    floor (≥ 2.0× ar on every set without load)."""
    extra = (CountTarget("sustained", default, "fixed", 1.3, None), CountTarget("none", default, "ar", 2.0, None))
    return (*(t for t in extra if t not in COUNT_TARGETS), *COUNT_TARGETS)


def _tok_s_by_cell(rows: list[dict]) -> dict[tuple[str, str, str], dict[str, float]]:
    cells: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        cells[(r["profile"], schedule_kind(r["schedule"]), r["set"])][r["policy"]] = r["tok_s"]
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
                   slack: float = 0.03, by: RepeatTable | None = None) -> list[dict]:
    """Per profile, schedule kind in ``kinds`` and set: the fastest drafting policy measured and
    ``default``'s tok/s over it (cells without ``default`` are left out):

        fastest  ⇔  ratio = tok_s(default) / max_p tok_s(p) = 1        near  ⇔  ratio >= 1 − slack

    With ``by`` (per-repeat tok/s, ``repeat_tok_s``), the paired ratios of ``default`` to its
    rival (the fastest other policy: the runner-up where ``default`` is fastest) per repeat, and
    ``decided``: every repeat on one side of 1 (None without repeats), so a verdict is not the
    noise's (``rapid.bench.paired_runs``)."""
    out = []
    for (prof, kind, st), pols in sorted(_tok_s_by_cell(rows).items()):
        drafting = {p: v for p, v in pols.items() if p != "ar"}
        if kind not in kinds or default not in drafting:
            continue
        best = max(drafting, key=lambda p: (drafting[p], p == default))
        ratio = drafting[default] / drafting[best] if drafting[best] > 0 else 0.0
        others = [p for p in drafting if p != default]
        rival = max(others, key=lambda p: drafting[p]) if others else None
        paired = paired_ratios(by or {}, default, rival, kind).get((prof, st), {}) if rival else {}
        out.append({"profile": prof, "schedule": kind, "set": st, "fastest": best, "ratio": ratio,
                    "is_fastest": best == default, "near": ratio >= 1.0 - slack, "rival": rival,
                    "paired": paired, "decided": (not undecided(paired, 1.0)) if paired else None})
    return out


def _regime_lines(rows: list[dict], default: str, by: RepeatTable | None = None, slack: float = 0.03) -> list[str]:
    """Markdown: is ``default`` the fastest policy under load (empty when no cell has it); with
    ``by``, which cells the paired repeats decide."""
    fast = fastest_checks(rows, default, slack=slack, by=by)
    if not fast:
        return []
    n, best, near = len(fast), sum(c["is_fastest"] for c in fast), sum(c["near"] for c in fast)
    L = ["", f"## The default policy (`{default}`) against the fastest measured policy, under load", "",
         f"fastest in {best} of {n} cells, within {slack:.0%} in {near} of {n}"]
    head = ["profile", "schedule", "set", "fastest", "default / fastest"]
    table = [[c["profile"], c["schedule"], c["set"], c["fastest"], f"{c['ratio']:.2f}"] for c in fast]
    if any(c["decided"] is not None for c in fast):
        decided = [c for c in fast if c["decided"]]
        L[-1] += (f"; the paired repeats decide {len(decided)} of {n} cells (the default ahead of its rival "
                  f"in every repeat in {sum(c['is_fastest'] for c in decided)}, behind in every repeat in "
                  f"{sum(not c['is_fastest'] for c in decided)}); in the rest the repeats disagree")
        head += ["rival", "default / rival per repeat", "decided"]
        for row, c in zip(table, fast, strict=True):
            row += [c["rival"] or "-", spread_text(c["paired"]),
                    "-" if c["decided"] is None else "yes" if c["decided"] else "no (repeats disagree)"]
    return L + [""] + md_table(head, table)


def _count_lines(checks: list[dict], by: RepeatTable) -> list[str]:
    """Markdown: the count targets; with ``by`` (per-repeat tok/s), the sets whose repeats disagree
    on the line."""
    table = []
    for c in checks:
        t = c["target"]
        per = ", ".join(f"{s} {v:.2f}" for s, v in c["per_set"].items())
        want = "every set" if t.need is None else f"{t.need} sets"
        row = [c["profile"], t.schedule, f"{t.policy}/{t.base} ≥ {t.ratio:g}", per,
               f"{c['reached']}/{len(c['per_set'])}", want, "met" if c["met"] else "missed"]
        if by:
            paired = paired_ratios(by, t.policy, t.base, t.schedule)
            row.append(", ".join(s for s in c["per_set"] if undecided(paired.get((c["profile"], s), {}), t.ratio))
                       or "none")
        table.append(row)
    head = ["profile", "schedule", "ratio", "per set", "sets reaching it", "target", "verdict"]
    note = ["", "Undecided: sets whose paired per-repeat ratios fall on both sides of the line "
            "(`rapid.bench.paired_runs`); a verdict there is the noise's."] if by else []
    return ["", "## Targets over prompt sets", "",
            *md_table(head + (["undecided (repeats disagree)"] if by else []), table), *note]


def _ablation_lines(rows: list[dict], by: RepeatTable) -> list[str]:
    """Markdown: the ablation table; with ``by`` (per-repeat tok/s), each gain's per-repeat spread
    and in how many repeats fixed < +IPDG < +CAAC < RAPID holds."""
    abl = ablation(rows)
    if not abl:
        return []
    by_rep = ablation_by_repeat(by, ABLATION) if by else {}
    table = [[a["profile"], a["label"], a["sets"], f"{a['tok_s']:.2f}", f"{a['gain']:.2f}",
              *([spread_text(by_rep.get(a["profile"], {}).get(a["policy"], {}))] if by else [])] for a in abl]
    L = ["", "## Ablation under sustained contention (macro mean over sets)", "",
         *md_table(["profile", "policy", "sets", "tok/s", "vs fixed",
                    *(["per repeat (paired)"] if by else [])], table)]
    for prof in sorted({a["profile"] for a in abl}):
        gains = {a["policy"]: a["gain"] for a in abl if a["profile"] == prof}
        present = [p for p in ORDERED if p in gains]
        if len(present) < 2:
            continue
        medians = all(gains[a] < gains[b] for a, b in pairwise(present))
        text = f"- {prof}: {' < '.join(ABLATION_LABELS[p] for p in present)} strictly: " \
               f"{'yes' if medians else 'no'} by the medians"
        if by:
            ok, n = increasing_repeats(by_rep.get(prof, {}), ORDERED)
            text += f", in {ok} of {n} repeats"
        L += ["", text]
    return L


def target_lines(rows: list[dict], default: str, runs: list[dict] | None = None) -> list[str]:
    """Markdown: the count targets, the ablation table and ``default`` (the edge's default policy)
    against the fastest policy under load (empty when nothing applies); with the bench's ``runs``,
    the paired per-repeat spreads (``rapid.bench.paired_runs``)."""
    checks = count_checks(rows, count_targets(default))
    by = repeat_tok_s(runs or [])
    L = _count_lines(checks, by) if checks else []
    return L + _ablation_lines(rows, by) + _regime_lines(rows, default, by)
