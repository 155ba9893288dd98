"""Time to first token and time per output token after it (the serving benchmarks' TTFT and TPOT),
per bench run, from the round traces.

A run's tok/s is ``tokens / wall_s`` from the start of the generation: it includes the cloud's
prefill of the prompt and round 0, which every policy pays alike and which, at the bench's 24-48
tokens, is a fifth to a third of the wall time on a CPU target (~2 s of prefill on the Zen 2's
fp32 target). The two halves, per run::

    TTFT = t_rel_end of the run's first round   (its verdict emits the first tokens)
    TPOT = (wall_s - TTFT) / (tokens - 1)       (vLLM's: ``rapid.runtime.telemetry.time_per_output_token``)

and, per cell (profile, schedule, set), a policy's decode ratio over a base = median TPOT of the
base / its median TPOT: the speed-up of the decoding after the first verdict, the prefill left
out for both. Runs whose first round has no ``t_rel_end`` (traces not written by ``rapid bench``)
or that emitted fewer than two tokens are left out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from rapid.bench.md_table import cell, md_table
from rapid.bench.traces import group_runs, run_key
from rapid.runtime.telemetry import time_per_output_token


@dataclass(slots=True, frozen=True)
class LatencySplit:
    """One cell's medians over its runs (seconds)."""

    profile: str
    schedule: str
    set: str
    policy: str
    runs: int
    ttft_s: float
    tpot_s: float


def first_verdicts(rounds: list[dict]) -> dict[tuple, float]:
    """``run_key`` -> seconds from the generation's start to its first verdict (``t_rel_end`` of the
    earliest round; runs without it are absent)."""
    out = {}
    for key, rs in group_runs(rounds).items():
        first = min(rs, key=lambda r: r["t_start"])
        if isinstance(first.get("t_rel_end"), (int, float)):
            out[key] = float(first["t_rel_end"])
    return out


def latency_splits(runs: list[dict], rounds: list[dict]) -> list[LatencySplit]:
    """Per (profile, schedule, set, policy): median TTFT and TPOT over its runs (module docstring)."""
    ttft = first_verdicts(rounds)
    cells: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for run in runs:
        t = ttft.get(run_key(run))
        tpot = time_per_output_token(run["wall_s"], t, run["tokens"])
        if tpot is not None:
            cells[(run["profile"], run["schedule"], run["set"], run["policy"])].append((t, tpot))
    return [LatencySplit(*key, runs=len(v), ttft_s=statistics.median(a for a, _ in v),
                         tpot_s=statistics.median(b for _, b in v))
            for key, v in sorted(cells.items())]


def decode_ratios(splits: list[LatencySplit], base: str) -> dict[tuple, float]:
    """(profile, schedule, set, policy) -> TPOT of ``base`` / TPOT of the policy in the same cell."""
    by_cell = {(s.profile, s.schedule, s.set): s.tpot_s for s in splits if s.policy == base}
    out = {}
    for s in splits:
        b = by_cell.get((s.profile, s.schedule, s.set))
        if b is not None and s.tpot_s > 0:
            out[(s.profile, s.schedule, s.set, s.policy)] = b / s.tpot_s
    return out


def first_token_lines(runs: list[dict], rounds: list[dict]) -> list[str]:
    """The report's section: per cell and policy, median TTFT and TPOT, and the decode ratios over
    ``fixed`` and over ``ar`` where they ran ([] when no run has a traced first verdict)."""
    splits = latency_splits(runs, rounds)
    if not splits:
        return []
    over = {b: decode_ratios(splits, b) for b in ("fixed", "ar")}
    L = ["", "## Time to first token and per output token after it (medians; `rapid.bench.first_token`)", "",
         "TTFT: from the generation's start to the first verdict (the cloud's prefill and round 0); TPOT: "
         "(wall - TTFT) / (tokens - 1); decode ratio: the base's TPOT / the policy's, the prefill left out "
         "for both (tok/s above includes it).", ""]
    L += md_table(["profile", "schedule", "set", "policy", "runs", "TTFT ms", "TPOT ms", "decode vs fixed",
                   "decode vs ar"],
                  ([s.profile, s.schedule, s.set, s.policy, s.runs, cell(1000 * s.ttft_s, ".0f"),
                    cell(1000 * s.tpot_s, ".0f"),
                    *(cell(over[b].get((s.profile, s.schedule, s.set, s.policy)), ".2f") for b in ("fixed", "ar"))]
                   for s in splits))
    return L
