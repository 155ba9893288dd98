"""rapid.bench.paired_runs: per-repeat paired ratios, the ablation per repeat, undecided lines."""

from __future__ import annotations

import pytest

from rapid.bench.paired_runs import (
    ablation_by_repeat,
    increasing_repeats,
    paired_ratios,
    repeat_tok_s,
    spread_text,
    undecided,
)
from rapid.bench.policy_targets import target_lines


def _run(policy: str, st: str, repeat: int, tokens: int, wall: float, schedule: str = "sustained",
         prompt: str = "0") -> dict:
    return {"profile": "wan", "schedule": schedule, "set": st, "policy": policy, "repeat": repeat,
            "prompt_id": prompt, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def test_a_repeat_pools_its_prompts_and_burst_parameters_are_one_kind():
    runs = [_run("fixed", "c4", 0, 10, 5.0, "burst:4:4"), _run("fixed", "c4", 0, 30, 5.0, "burst:4:4", "1"),
            _run("fixed", "c4", 1, 12, 4.0, "burst:8:8")]
    assert repeat_tok_s(runs) == {("wan", "burst", "c4", "fixed"): {0: 4.0, 1: 3.0}}


def test_paired_ratios_divide_within_a_repeat_only():
    runs = [_run("fixed", "c4", 0, 10, 5.0), _run("ipdg", "c4", 0, 10, 4.0),  # 2.0 vs 2.5
            _run("fixed", "c4", 1, 10, 2.0), _run("ipdg", "c4", 1, 10, 2.5),  # 5.0 vs 4.0
            _run("ipdg", "c4", 2, 10, 1.0)]  # no fixed in repeat 2: not paired
    got = paired_ratios(repeat_tok_s(runs), "ipdg", "fixed", "sustained")
    assert got == {("wan", "c4"): {0: pytest.approx(1.25), 1: pytest.approx(0.8)}}
    assert undecided(got[("wan", "c4")], 1.0) and not undecided(got[("wan", "c4")], 0.5)
    assert spread_text(got[("wan", "c4")]) == "0.80–1.25" and spread_text({}) == "-"
    assert paired_ratios(repeat_tok_s(runs), "ipdg", "fixed", "none") == {}


def _ablation_runs() -> list[dict]:
    # per repeat, tok/s of fixed / ipdg / caac / rapid on two sets; repeat 1 has ipdg below fixed on c4
    table = {0: {"c4": (2.0, 2.2, 2.6, 3.0), "oasst": (4.0, 4.3, 4.8, 6.0)},
             1: {"c4": (2.0, 1.8, 2.6, 3.0), "oasst": (4.0, 4.1, 4.8, 6.0)}}
    runs = []
    for rep, sets in table.items():
        for st, speeds in sets.items():
            for pol, v in zip(("fixed", "ipdg", "caac", "rapid"), speeds, strict=True):
                runs.append(_run(pol, st, rep, 12, 12 / v))
    return runs


def test_the_ablation_per_repeat_and_in_how_many_repeats_it_increases():
    order = ("fixed", "ipdg", "caac", "rapid")
    gains = ablation_by_repeat(repeat_tok_s(_ablation_runs()), order)["wan"]
    assert gains["ipdg"] == {0: pytest.approx((1.1 + 1.075) / 2), 1: pytest.approx((0.9 + 1.025) / 2)}
    assert gains["fixed"] == {0: 1.0, 1: 1.0}
    assert increasing_repeats(gains, order) == (1, 2)  # repeat 1: ipdg 0.96 < fixed
    assert increasing_repeats(gains, ("fixed", "npdg")) == (0, 0)  # one policy present: no order


def test_the_report_names_undecided_sets_and_the_repeats_of_the_order():
    runs = _ablation_runs()
    rows = []
    for pol in ("fixed", "ipdg", "caac", "rapid"):
        for st in ("c4", "oasst"):
            speeds = [r["tokens_per_s"] for r in runs if r["policy"] == pol and r["set"] == st]
            rows.append({"profile": "wan", "schedule": "sustained", "set": st, "policy": pol,
                         "tok_s": sorted(speeds)[len(speeds) // 2]})
    text = "\n".join(target_lines(rows, "rapid", runs))
    assert "per repeat (paired)" in text and "0.96–1.09" in text  # ipdg's macro gain, repeats 1 and 0
    assert "in 1 of 2 repeats" in text
    assert "| wan | sustained | rapid/fixed ≥ 1.3 |" in text and "undecided (repeats disagree)" in text
    plain = "\n".join(target_lines(rows, "rapid"))  # without runs: no paired columns
    assert "per repeat" not in plain and "undecided" not in plain
