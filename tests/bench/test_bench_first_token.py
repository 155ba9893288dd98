"""rapid.bench.first_token: time to first token and per output token after it, per bench cell."""

from __future__ import annotations

import pytest

from rapid.bench.first_token import decode_ratios, first_token_lines, first_verdicts, latency_splits
from rapid.bench.traces import run_key


def _round(i, t_start, t_rel_end, policy, repeat=0, pset="c4", schedule="none"):
    return {"round": i, "policy": policy, "t_start": t_start, "t_end": t_start + 0.1, "t_rel_end": t_rel_end,
            "profile": "wan", "schedule": schedule, "set": pset, "prompt_id": "0", "repeat": repeat}


def _run(policy, tokens, wall_s, repeat=0, pset="c4", schedule="none"):
    return {"policy": policy, "tokens": tokens, "wall_s": wall_s, "profile": "wan", "schedule": schedule,
            "set": pset, "prompt_id": "0", "repeat": repeat}


def test_ttft_is_the_first_verdict_and_tpot_the_rest_per_token():
    rounds = [_round(1, 11.0, 2.6, "fixed"), _round(0, 10.0, 2.0, "fixed"),  # out of order: the earliest counts
              _round(0, 20.0, 2.0, "rapid"), _round(1, 21.0, 2.3, "rapid")]
    assert first_verdicts(rounds)[run_key(rounds[0])] == 2.0  # (the key of fixed's generation)
    runs = [_run("fixed", 25, 14.0), _run("rapid", 25, 8.0)]
    fixed, rapid = latency_splits(runs, rounds)
    assert (fixed.policy, fixed.ttft_s, fixed.tpot_s) == ("fixed", 2.0, pytest.approx(0.5))  # 12 s / 24
    assert rapid.tpot_s == pytest.approx(0.25)
    ratios = decode_ratios([fixed, rapid], "fixed")
    assert ratios[("wan", "none", "c4", "rapid")] == pytest.approx(2.0)
    assert ratios[("wan", "none", "c4", "fixed")] == 1.0
    assert decode_ratios([fixed, rapid], "ar") == {}  # no base in the cell: no ratio


def test_medians_over_the_repeats_and_runs_without_a_traced_first_verdict_left_out():
    rounds = [_round(0, 1.0, 1.0, "ar", repeat=r) for r in range(3)]
    rounds[2].pop("t_rel_end")  # not written by rapid bench
    runs = [_run("ar", 11, 6.0, 0), _run("ar", 11, 11.0, 1), _run("ar", 11, 3.0, 2), _run("ar", 1, 3.0, 0, "oasst")]
    (only,) = latency_splits(runs, rounds)  # oasst: one token, no TPOT
    assert only.runs == 2 and only.tpot_s == pytest.approx((0.5 + 1.0) / 2)


def test_the_report_section_names_both_halves_and_is_empty_without_traces():
    rounds = [_round(0, 1.0, 2.0, p) for p in ("fixed", "ar", "rapid")]
    runs = [_run("fixed", 25, 14.0), _run("ar", 25, 26.0), _run("rapid", 25, 8.0)]
    md = "\n".join(first_token_lines(runs, rounds))
    assert "| wan | none | c4 | rapid | 1 | 2000 | 250 | 2.00 | 4.00 |" in md
    assert first_token_lines(runs, []) == []
