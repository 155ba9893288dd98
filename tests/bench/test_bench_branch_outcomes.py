"""rapid.bench.branch_outcomes: where the verdicts landed for the proactive branch."""

from __future__ import annotations

import pytest

from rapid.bench.branch_outcomes import (
    COLUMNS,
    branch_outcome_lines,
    branch_outcomes,
    outcome_column,
)


def _round(outcome, accepted=2, tree_depth=3, policy="rapid-cost", pset="c4", schedule="none", mass=None):
    return {"branch_outcome": outcome, "accepted": accepted, "tree_depth": tree_depth, "policy": policy,
            "set": pset, "schedule": schedule, "first_wave_p": mass}


@pytest.mark.parametrize("outcome, column", [("hit", "hit"), ("rank0", "rank0"), ("rank1", "rank1"),
                                             ("rank2", "rank2+"), ("rank11", "rank2+"), ("unfed", "unfed")])
def test_ranks_beyond_the_second_share_one_column(outcome, column):
    assert outcome_column(outcome) == column


def test_shares_count_only_rounds_with_a_branch_of_the_policy():
    rounds = [_round("hit", 3), _round("hit", 1), _round("unfed", 3), _round("rank3"),
              _round(None), _round("hit", policy="fixed"), _round("late", schedule="sustained")]
    none, sustained = branch_outcomes(rounds, "rapid-cost")
    assert (none.schedule, none.rounds, sustained.rounds) == ("none", 4, 1)
    assert none.share == {"hit": 0.5, "late": 0.0, "unfed": 0.25, "rank0": 0.0, "rank1": 0.0,
                          "rank2+": 0.25, "unranked": 0.0}
    assert sum(none.share.values()) == pytest.approx(1.0)
    assert none.whole == pytest.approx(0.5)  # two rounds accepted all 3 levels
    assert none.whole_kept == pytest.approx(0.5)  # one of them kept (the other landed unfed)
    assert sustained.share["late"] == 1.0 and sustained.whole == 0.0 and sustained.whole_kept == 0.0
    assert none.first_wave_p is None  # traces from before first_wave_p


def test_the_drafts_own_landing_probability_is_averaged_where_traced():
    rounds = [_round("hit", mass=0.3), _round("rank0", mass=0.1), _round("unfed")]
    (row,) = branch_outcomes(rounds, "rapid-cost")
    assert row.first_wave_p == pytest.approx(0.2)  # the round without it is not counted as 0
    assert branch_outcome_lines(rounds, "rapid-cost")[-1].endswith("| 0.20 |")


def test_lines_give_one_row_per_schedule_and_set():
    rounds = [_round("hit", 3), _round("rank1", pset="oasst")]
    lines = branch_outcome_lines(rounds, "rapid-cost")
    assert "rapid-cost" in lines[1]
    header = next(line for line in lines if line.startswith("| schedule"))
    assert all(c in header for c in COLUMNS)
    assert lines[-2] == "| none | c4 | 1 | 1.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 0.00 | 1.00 | 1.00 | - |"
    assert lines[-1].startswith("| none | oasst | 1 | 0.00 |")
    assert branch_outcome_lines([_round(None)], "rapid-cost") == []
