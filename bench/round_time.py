"""Where a round's time goes: rounds after a kept proactive branch against rounds after a
discarded one, and what the throughput would be if every branch were kept.

A round i starts with what round i-1's branch left: a kept branch (``proactive_hit`` of round
i-1) already holds the next tree's first levels, so round i drafts little before it sends; a
discarded one (or none) leaves all of round i's levels to draft after the verdict, in sequence.
From one policy's no-load rounds (``rounds.jsonl``), per set:

    kept            share of rounds i >= 1 whose round i-1 kept its branch (h)
    round ms        mean t_end - t_start of those rounds, and of the others (after a discard)
    draft ms        mean draft_s of the rounds after a discard (the drafting IPDG did not hide)
    tokens / round  mean emitted, every round
    ratio now       tokens / round ÷ mean round ms, over ar's mean round ms (one token each):
                    the speed-up of the rounds alone (the prompt's prefill left out, for both)
    ratio if kept   the same with every round costing a round after a kept branch (h = 1):
                    what hiding all the drafting behind the verify would give, acceptance unchanged

Round 0 of each generation (no branch before it) counts in tokens / round only.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from rapid.bench.md_table import cell, md_table
from rapid.bench.traces import group_runs, with_previous


@dataclass(slots=True, frozen=True)
class RoundTime:
    set: str
    kept: float  # h: share of rounds i >= 1 after a kept branch
    round_kept_ms: float | None  # mean round after a kept branch (None: there was none)
    round_missed_ms: float | None  # mean round after a discarded branch
    draft_missed_ms: float | None  # mean draft_s after a discarded branch
    tokens: float  # mean emitted per round
    ratio_now: float | None  # rounds only, vs ar's rounds
    ratio_if_kept: float | None  # every round as after a kept branch


def _mean_ms(rs: list[dict], key: str | None = None) -> float | None:
    if not rs:
        return None
    return 1000 * statistics.fmean((r[key] if key else r["t_end"] - r["t_start"]) for r in rs)


def _after(rounds: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rounds after a kept branch, rounds after a discarded one); each generation's first round
    in neither."""
    kept, missed = [], []
    for r, prev in with_previous(group_runs(rounds)):
        if prev is not None:
            (kept if prev.get("proactive_hit") else missed).append(r)
    return kept, missed


def round_times(rounds: list[dict], policy: str) -> list[RoundTime]:
    """Per set, the module docstring's columns from ``policy``'s and ar's no-load rounds."""
    mine: dict[str, list[dict]] = defaultdict(list)
    ar: dict[str, list[dict]] = defaultdict(list)
    for r in rounds:
        if r.get("schedule", "none") == "none" and r["policy"] in (policy, "ar"):
            (mine if r["policy"] == policy else ar)[r["set"]].append(r)
    out = []
    for pset, rs in sorted(mine.items()):
        kept, missed = _after(rs)
        tokens = statistics.fmean(r["emitted"] for r in rs)
        ar_ms = _mean_ms(ar.get(pset, []))
        now_ms = _mean_ms(rs)
        kept_ms = _mean_ms(kept)
        out.append(RoundTime(
            pset, len(kept) / max(1, len(kept) + len(missed)), kept_ms, _mean_ms(missed),
            _mean_ms(missed, "draft_s"), tokens,
            None if ar_ms is None else tokens * ar_ms / now_ms,
            None if ar_ms is None or kept_ms is None else tokens * ar_ms / kept_ms))
    return out


def round_time_lines(rounds: list[dict], policy: str) -> list[str]:
    rows = round_times(rounds, policy)
    if not rows:
        return []
    L = ["", f"## Where a round's time goes ({policy}'s rounds, no load; `rapid.bench.round_time`)", ""]
    return L + md_table(["set", "branch kept", "round ms after kept", "round ms after discarded",
                         "draft ms after discarded", "tokens / round", "ratio now (rounds)", "ratio if every branch kept"],
                        ([r.set, f"{r.kept:.2f}", cell(r.round_kept_ms, ".0f"), cell(r.round_missed_ms, ".0f"),
                          cell(r.draft_missed_ms, ".0f"), f"{r.tokens:.2f}", cell(r.ratio_now, ".2f"),
                          cell(r.ratio_if_kept, ".2f")] for r in rows))
