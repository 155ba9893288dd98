"""Verifies the host stalled (rapid.bench.stalls): flagged against the run's verifies of the same
tree size, never a bigger tree's honest cost."""

import pytest

from rapid.bench.stalls import FACTOR, stall_lines, stalled_verifies


def _round(i, verify_s, nodes=5, policy="fixed", prompt="7", set_="oasst"):
    return {"round": i, "verify_s": verify_s, "tree_nodes": nodes, "policy": policy, "prompt_id": prompt, "set": set_}


def test_a_verify_far_above_its_sizes_median_is_a_stall():
    rows = [_round(i, 0.30 + 0.01 * (i % 3)) for i in range(10)] + [_round(10, 3.27), _round(11, 1.0)]
    stalls = stalled_verifies(rows)
    assert [(s.round, s.verify_s) for s in stalls] == [(10, 3.27)]  # 1.0 s: 3.2x, a busy round
    assert stalls[0].typical_s == pytest.approx(0.31) and stalls[0].excess_s == pytest.approx(2.96)


def test_a_rare_size_is_judged_against_the_smaller_trees_and_a_big_tree_is_no_stall():
    rows = [_round(i, 0.30, nodes=1) for i in range(8)]
    rows += [_round(20, 0.72, nodes=31), _round(21, 0.75, nodes=31)]  # fp32: 2.4x a step at 32 rows
    rows += [_round(22, 2.42, nodes=7)]  # one 7-node verify, 8x the smaller trees' median
    assert [s.round for s in stalled_verifies(rows)] == [22]
    assert stalled_verifies(rows[:3] + rows[-1:]) == []  # too few verifies to judge


def test_the_report_line_names_the_cells_and_their_excess():
    rows = [_round(i, 0.3) for i in range(10)] + [_round(10, 2.3, prompt="108"), _round(11, 1.5 + FACTOR * 0.3,
                                                                                            prompt="324")]
    line = stall_lines(rows)[0]
    assert "2 rounds" in line and "oasst `fixed` prompts ['108', '324']" in line and "4.4 s" in line  # (2.3 - 0.3) + (2.7 - 0.3)
    assert stall_lines(rows[:10]) == [f"- stalled verifies (> {FACTOR:g}x the run's median at the same tree size): none"]
