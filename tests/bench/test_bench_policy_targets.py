"""rapid.bench.policy_targets: count targets over prompt sets and the ablation's macro mean."""

from __future__ import annotations

import pytest

from rapid.bench.policy_targets import CountTarget, ablation, count_checks, target_lines


def _rows(tok_s: dict[tuple[str, str, str], float]) -> list[dict]:
    return [{"profile": "wan", "schedule": sched, "set": s, "policy": p, "tok_s": v}
            for (sched, s, p), v in tok_s.items()]


ROWS = _rows({
    ("sustained", "c4", "fixed"): 2.0, ("sustained", "c4", "rapid"): 3.0, ("sustained", "c4", "edgellm"): 3.2,
    ("sustained", "oasst", "fixed"): 2.0, ("sustained", "oasst", "rapid"): 2.4, ("sustained", "oasst", "edgellm"): 2.0,
    ("burst:8:8", "c4", "fixed"): 1.0, ("burst:8:8", "c4", "rapid"): 9.0,
})


def test_every_set_and_at_least_n_sets():
    every = CountTarget("sustained", "rapid", "fixed", 1.3, None)
    one = CountTarget("sustained", "rapid", "edgellm", 1.0, 1)
    got = {c["target"]: c for c in count_checks(ROWS, (every, one))}
    assert got[every]["per_set"] == {"c4": 1.5, "oasst": pytest.approx(1.2)}
    assert (got[every]["reached"], got[every]["need"], got[every]["met"]) == (1, 2, False)
    assert (got[one]["reached"], got[one]["met"]) == (1, True)  # oasst 1.2 ≥ 1, c4 0.94 < 1


def test_schedule_kind_groups_burst_parameters_and_missing_policies_are_skipped():
    burst = CountTarget("burst", "rapid", "fixed", 2.0, None)
    absent = CountTarget("none", "rapid", "ar", 1.0, None)
    got = count_checks(ROWS, (burst, absent))
    assert [c["per_set"] for c in got] == [{"c4": 9.0}]


def test_ablation_is_the_macro_mean_of_per_set_ratios():
    abl = {a["policy"]: a for a in ablation(ROWS, "sustained", ("fixed", "rapid", "ipdg"))}
    assert abl["fixed"]["gain"] == 1.0 and abl["rapid"]["gain"] == pytest.approx((1.5 + 1.2) / 2)
    assert abl["rapid"]["tok_s"] == pytest.approx(2.7) and "ipdg" not in abl
    assert any("Ablation" in line for line in target_lines(ROWS))
