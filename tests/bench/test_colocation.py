"""The co-location tax: a proactive policy's verify beside a branch step over fixed's of the same
set, schedule and tree size (rapid.bench.colocation)."""

from __future__ import annotations

import pytest

from rapid.bench.colocation import verify_tax, verify_tax_lines


def _r(policy, verify_s, nodes=4, steps=1, rnd=1, pset="c4", schedule="none"):
    return {"policy": policy, "verify_s": verify_s, "tree_nodes": nodes, "proactive_steps": steps, "round": rnd,
            "set": pset, "schedule": schedule}


def test_the_tax_compares_like_with_like():
    rounds = [_r("fixed", 0.100, steps=0), _r("fixed", 0.120, steps=0), _r("fixed", 0.200, nodes=8, steps=0),
              _r("ipdg", 0.121), _r("ipdg", 0.231, nodes=8),  # 1.1 and 1.155 of fixed's at their sizes
              _r("ipdg", 0.500, steps=0),  # no branch step beside it: not taxed
              _r("ipdg", 0.900, rnd=0),  # round 0: left out
              _r("ipdg", 0.300, nodes=16)]  # no fixed round of 16 nodes: nothing to compare with
    (tax,) = verify_tax(rounds, "ipdg")
    assert (tax.policy, tax.schedule, tax.set, tax.rounds) == ("ipdg", "none", "c4", 2)
    assert tax.ratio == pytest.approx((1.1 + 1.155) / 2)


def test_cells_stay_apart_and_no_fixed_means_no_table():
    rounds = [_r("fixed", 0.1, steps=0), _r("fixed", 0.2, steps=0, schedule="sustained"),
              _r("rapid", 0.1), _r("rapid", 0.3, schedule="sustained"), _r("rapid", 0.1, pset="oasst")]
    assert [(t.schedule, round(t.ratio, 9)) for t in verify_tax(rounds, "rapid")] == [("none", 1.0), ("sustained", 1.5)]
    assert verify_tax_lines([r for r in rounds if r["policy"] != "fixed"], ["rapid"]) == []
    assert any("| rapid | sustained | c4 | 1.500 | 1 |" in line for line in verify_tax_lines(rounds, ["rapid"]))
