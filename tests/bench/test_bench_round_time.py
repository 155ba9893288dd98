"""rapid.bench.round_time: rounds after a kept branch against rounds after a discarded one."""

from __future__ import annotations

import pytest

from rapid.bench.round_time import round_time_lines, round_times


def _round(i, hit, seconds, emitted, draft_s=0.0, policy="rapid-cost", pset="c4", schedule="none"):
    return {"round": i, "proactive_hit": hit, "t_start": 10.0, "t_end": 10.0 + seconds, "emitted": emitted,
            "draft_s": draft_s, "policy": policy, "set": pset, "schedule": schedule}


def _generation(policy="rapid-cost"):
    # round 0 (no branch before it), then: after a discard, after a kept branch, after a discard
    return [_round(0, False, 0.5, 1, 0.2, policy), _round(1, True, 0.4, 4, 0.15, policy),
            _round(2, False, 0.2, 4, 0.0, policy), _round(3, None, 0.3, 3, 0.1, policy)]


def _ar(n=4, seconds=0.1):
    return [_round(i, None, seconds, 1, policy="ar") for i in range(n)]


def test_a_round_counts_as_after_kept_when_the_round_before_kept_its_branch():
    (row,) = round_times(_generation() + _ar(), "rapid-cost")
    assert row.kept == pytest.approx(1 / 3)  # rounds 1..3: only round 2 follows a kept branch
    assert row.round_kept_ms == pytest.approx(200)
    assert row.round_missed_ms == pytest.approx(350)  # rounds 1 and 3
    assert row.draft_missed_ms == pytest.approx(125)
    assert row.tokens == pytest.approx(3.0)
    assert row.ratio_now == pytest.approx(3.0 * 100 / 350)  # mean round 350 ms (all four)
    assert row.ratio_if_kept == pytest.approx(3.0 * 100 / 200)


def test_generations_do_not_carry_a_hit_across_their_boundary():
    # the last round of the first generation kept its branch; the next generation's round 0 has none
    first = [dict(r, repeat=0) for r in _generation()[:2]]
    second = [dict(r, repeat=1) for r in _generation()]
    rows = round_times(first + second + _ar(), "rapid-cost")
    assert rows[0].kept == pytest.approx(1 / 4)  # rounds 1 (after 0), 1, 2, 3 of the second


def test_only_the_policys_no_load_rounds_and_ar_count():
    loaded = [dict(r, schedule="sustained", t_end=r["t_start"] + 9) for r in _generation()]
    other = _generation("fixed")
    (row,) = round_times(_generation() + loaded + other + _ar(), "rapid-cost")
    assert row.round_missed_ms == pytest.approx(350)
    assert round_times(_ar(), "rapid-cost") == []


def test_without_ar_or_kept_rounds_the_ratios_are_left_blank():
    (row,) = round_times([_round(0, False, 0.5, 1), _round(1, False, 0.3, 2)], "rapid-cost")
    assert row.ratio_now is None and row.ratio_if_kept is None and row.round_kept_ms is None
    assert round_time_lines([_round(0, False, 0.5, 1), _round(1, False, 0.3, 2)], "rapid-cost")[-1] == \
        "| c4 | 0.00 | - | 300 | 0 | 1.50 | - | - |"


def test_lines_name_the_policy_and_one_row_per_set():
    rounds = _generation() + _ar() + [dict(r, set="oasst") for r in _generation() + _ar()]
    lines = round_time_lines(rounds, "rapid-cost")
    assert "(rapid-cost's rounds" in lines[1]
    assert [x.split(" | ")[0] for x in lines[-2:]] == ["| c4", "| oasst"]
    assert lines[-1] == "| oasst | 0.33 | 200 | 350 | 125 | 3.00 | 0.86 | 1.50 |"
    assert round_time_lines([], "rapid-cost") == []
