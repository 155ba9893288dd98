"""Paired per-repeat ratios: how much of a median ratio is run-to-run noise, pure.

A bench repeat runs every policy of a cell back to back (``rapid.bench.runner``: policies
interleaved, order reversed on odd repeats), so two policies' runs of one repeat share the
machine's state of that minute; their ratio is a paired sample. With ``k`` a repeat and ``s`` a
prompt set (tokens over wall seconds of the repeat's prompts)::

    r_k(p, s)  = tok_s(p, s, k) / tok_s(base, s, k)
    gain_k(p)  = (1 / |S|) Σ_s r_k(p, s)          the ablation's macro mean, in repeat k alone
    spread     = [min_k, max_k]

A comparison is *decided* where every repeat agrees: "p reaches x on s" when r_k(p, s) >= x for
every k (or for none), "the ablation is strictly increasing" when it is in every repeat. Medians
of three repeats whose paired ratios straddle the line say nothing of the mechanism: on the
single-VM bench the same rounds have measured 0.92 and 1.07 of ``fixed`` in two runs.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from itertools import pairwise

from rapid.bench.contention import schedule_kind

RepeatTable = dict[tuple[str, str, str, str], dict[int, float]]  # (profile, kind, set, policy) -> repeat -> tok/s


def pooled_by_repeat(runs: list[dict]) -> dict[int, float]:
    """{repeat: tokens / wall seconds over that repeat's runs} (one cell's runs: its prompts)."""
    tokens: dict[int, float] = defaultdict(float)
    wall: dict[int, float] = defaultdict(float)
    for r in runs:
        k = int(r.get("repeat", 0))
        tokens[k] += r["tokens"]
        wall[k] += r["wall_s"]
    return {k: tokens[k] / w for k, w in sorted(wall.items()) if w > 0}


def repeat_tok_s(runs: list[dict]) -> RepeatTable:
    """{(profile, schedule kind, set, policy): {repeat: tokens / wall seconds over its prompts}}."""
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        cells[(r["profile"], schedule_kind(r["schedule"]), r["set"], r["policy"])].append(r)
    return {key: reps for key, rs in cells.items() if (reps := pooled_by_repeat(rs))}


def paired_ratios(by: RepeatTable, policy: str, base: str, kind: str) -> dict[tuple[str, str], dict[int, float]]:
    """{(profile, set): {repeat: r_k(policy, set)}} over the repeats both policies ran (``by``:
    ``repeat_tok_s`` of the runs)."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    for (prof, knd, st, pol), reps in by.items():
        if knd != kind or pol != policy:
            continue
        ref = by.get((prof, knd, st, base), {})
        paired = {k: v / ref[k] for k, v in reps.items() if ref.get(k, 0) > 0}
        if paired:
            out[(prof, st)] = paired
    return out


def ablation_by_repeat(by: RepeatTable, policies: tuple[str, ...], kind: str = "sustained",
                       base: str = "fixed") -> dict[str, dict[str, dict[int, float]]]:
    """{profile: {policy: {repeat: gain_k(policy)}}} over the sets where the policy and ``base``
    both ran, a repeat counted only where each of those sets has it."""
    out: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)
    for pol in policies:
        per_set = paired_ratios(by, pol, base, kind)
        for prof in sorted({p for p, _ in per_set}):
            sets = [s for p, s in per_set if p == prof]
            reps = set.intersection(*(set(per_set[(prof, s)]) for s in sets))
            out[prof][pol] = {k: statistics.fmean(per_set[(prof, s)][k] for s in sets) for k in sorted(reps)}
    return dict(out)


def increasing_repeats(gains: dict[str, dict[int, float]], order: tuple[str, ...]) -> tuple[int, int]:
    """(repeats in which gain_k strictly increases along ``order``, repeats every policy of
    ``order`` has); policies of ``order`` absent from ``gains`` are skipped."""
    present = [p for p in order if p in gains]
    if len(present) < 2:
        return 0, 0
    reps = sorted(set.intersection(*(set(gains[p]) for p in present)))
    ok = sum(all(gains[a][k] < gains[b][k] for a, b in pairwise(present)) for k in reps)
    return ok, len(reps)


def undecided(ratios_by_repeat: dict[int, float], line: float) -> bool:
    """The repeats disagree on ``ratio >= line``: some reach it, some do not."""
    hits = [v >= line for v in ratios_by_repeat.values()]
    return any(hits) and not all(hits)


def spread_text(values: dict[int, float]) -> str:
    """``min–max`` of the per-repeat values, two decimals ("-" when there are none)."""
    if not values:
        return "-"
    return f"{min(values.values()):.2f}–{max(values.values()):.2f}"
