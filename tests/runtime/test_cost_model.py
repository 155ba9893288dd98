"""rapid.runtime.cost_model: per-level acceptance, the verify curve, RTT and tree size."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.runtime.cost_model import CostConfig, LinkCost, ReachEstimate, VerifyCurve, interpolate


def test_interpolate_is_piecewise_linear_and_extends_the_ends():
    pts = {0: 1.0, 4: 3.0, 8: 11.0}
    assert interpolate(2, pts) == 2.0
    assert interpolate(6, pts) == 7.0
    assert interpolate(10, pts) == 15.0  # last segment extended
    assert interpolate(-2, pts) == 0.0  # first segment extended
    assert interpolate(5, {3: 0.5}) == 0.5  # one point: flat
    assert interpolate(5, {}) is None


def test_reach_counts_per_level_with_shrinkage_to_the_pooled_rate():
    cfg = CostConfig(p0=0.5, prior_weight=2.0, alpha_reach=1e-12)  # no forgetting to speak of
    r = ReachEstimate(4, cfg)
    assert r.reach() == pytest.approx([0.5, 0.25, 0.125, 0.0625])  # the prior, i.i.d.
    r.observe(1, 3)  # level 1 reached, level 2 not, level 3 not tried
    r.observe(3, 3)  # levels 1..3 reached; level 4 not drafted
    # pooled: successes 1 + 3 = 4 of 5 trials, plus 2 pseudo at 0.5 -> 5/7
    h0 = 5 / 7
    assert r.pooled() == pytest.approx(h0)
    want = [(2 + 2 * h0) / (2 + 2), (1 + 2 * h0) / (2 + 2), (1 + 2 * h0) / (1 + 2), h0]
    assert r.level_rates() == pytest.approx(want)
    assert r.reach() == pytest.approx([math.prod(want[:k]) for k in range(1, 5)])


def test_reach_forgets_and_clamps():
    r = ReachEstimate(3)  # alpha_reach = 0.05: ~20 rounds of memory
    for _ in range(30):
        r.observe(0, 3)  # every first level rejected
    assert r.reach()[0] < 0.01
    for _ in range(60):
        r.observe(9, 3)  # accepted > depth is clamped: all three levels reached
    assert r.reach()[2] > 0.95  # the rejections are forgotten
    c = r.copy()
    c.observe(0, 3)
    assert c.reach() != r.reach()  # the copy is independent


def test_a_round_counted_from_level_2_leaves_level_1_and_the_memory_alone():
    """A request's first verdict (``CostAwareCAAC``): levels from 2 on count, level 1 does not; one
    that stopped at level 1 counts nothing, and does not age the memory either."""
    r = ReachEstimate(4)
    r.observe(1, 4)
    succ, trials = list(r.succ), list(r.trials)
    r.observe(0, 4, first_level=2)
    assert (r.succ, r.trials) == (succ, trials)
    r.observe(0, 1, first_level=2)  # a depth-1 round has no level 2
    assert (r.succ, r.trials) == (succ, trials)
    r.observe(2, 4, first_level=2)  # level 2 reached, level 3 not
    keep = 1.0 - r.config.alpha_reach
    assert r.trials == pytest.approx([0.0, keep, 1.0 + keep, 1.0, 0.0])
    assert r.succ == pytest.approx([0.0, keep, 1.0, 0.0, 0.0])


def test_carry_keeps_the_rates_and_weighs_them_as_at_most_a_few_rounds():
    r = ReachEstimate(4)
    for k in range(40):
        r.observe(k % 3, 4)  # 0, 1, 2 of 4 levels in turn
    rates = [s / n for s, n in zip(r.succ[1:], r.trials[1:], strict=True) if n]
    assert r.trials[1] > 10
    r.carry(4.0)
    assert r.trials[1] == pytest.approx(4.0)  # level 1 counts every drafted round
    assert [s / n for s, n in zip(r.succ[1:], r.trials[1:], strict=True) if n] == pytest.approx(rates)
    few = ReachEstimate(4)
    few.observe(2, 4)
    before = few.reach()
    few.carry(4.0)
    assert few.reach() == before  # under the cap: nothing to scale
    few.carry(0.0)
    assert few.reach() == ReachEstimate(4).reach()  # nothing carried: the prior


@settings(max_examples=50, deadline=None)
@given(rounds=st.lists(st.tuples(st.integers(0, 8), st.integers(1, 8)), max_size=40))
def test_reach_is_a_falling_probability(rounds):
    r = ReachEstimate(8)
    for a, d in rounds:
        r.observe(a, d)
    p = r.reach()
    assert all(0 < x < 1 for x in p)
    assert all(b <= a for a, b in zip(p, p[1:], strict=False))


def test_verify_curve_takes_the_shape_from_ready_and_the_level_from_verdicts():
    v = VerifyCurve(alpha=0.5)
    assert v.predict(4) is None
    v.start([0, 3, 7, 15], [0.014, 0.015, 0.016, 0.020])
    assert v.predict(5) == pytest.approx(0.0155)  # the start-up curve alone
    v.observe(7, 0.0016)  # the verdicts see a tenth of it (another clock, another model)
    assert v.predict(15) == pytest.approx(0.0016 * 0.020 / 0.016)  # C's shape at M's level
    assert v.predict(3) == pytest.approx(0.0016 * 0.015 / 0.016)  # no dip at the measured size
    v.observe(7, 0.0024)  # EMA at 0.5
    assert v.measured[7] == pytest.approx(0.002)
    v.observe(3, 0.0010)
    r3, r7 = 0.0010 / 0.015, 0.002 / 0.016  # the verdicts' level against C at their sizes
    assert v.predict(5) == pytest.approx(0.0155 * (r3 + r7) / 2)  # between them: C's shape, their level
    for bad in (float("nan"), -1.0, 0.0, float("inf")):
        v.observe(3, bad)
    assert v.measured[3] == pytest.approx(0.0010)
    v.start([1], [float("nan")])  # nothing valid: the start-up curve is kept
    assert 0 in v.startup
    w = VerifyCurve()
    w.observe(2, 0.01)
    w.observe(6, 0.03)
    assert w.predict(10) == pytest.approx(0.05)  # no start-up curve: the verdicts' line extended


def test_verify_curve_keeps_the_start_up_step_between_verdict_sizes():
    """AMX's 16-row tiles: flat to 15 nodes, a step at 16, flat again to 31. Verdicts at 14 and
    31 nodes (on a machine 10 % slower today) must not price 16-20 nodes on a line between them."""
    v = VerifyCurve()
    v.start([0, 15, 16, 31], [0.229, 0.250, 0.279, 0.315])
    c14 = 0.229 + 14 / 15 * (0.250 - 0.229)
    v.observe(14, 1.1 * c14)
    v.observe(31, 1.1 * 0.315)
    assert v.predict(15) == pytest.approx(1.1 * 0.250)
    assert v.predict(16) == pytest.approx(1.1 * 0.279)  # the step, at the verdicts' level
    assert v.predict(18) > v.predict(15) + 0.02
    assert v.predict(40) > v.predict(31)  # past the verdicts: C's shape extended, their level


def test_link_cost_rtt_ema_and_tree_size_per_depth():
    link = LinkCost(alpha=0.5)
    link.budget, link.width = 8, 2
    assert link.rtt is None
    assert link.tree_nodes(3) == 6  # width * depth before any round
    assert link.tree_nodes(5) == 8  # capped by the budget
    link.observe(2, 5, 0.040)
    link.observe(2, 7, -0.001)  # a negative RTT (clock noise) counts as 0
    assert link.rtt == pytest.approx(0.020)
    assert link.tree_nodes(2) == pytest.approx(6.0)
    assert link.tree_nodes(1) == pytest.approx(3.0)  # scaled from the nearest measured depth
    assert link.tree_nodes(4) == 8  # 12, capped


def test_config_is_validated():
    for bad in (dict(p0=1.0), dict(prior_weight=0), dict(alpha_reach=0), dict(alpha_rtt=1.5),
                dict(alpha_verify=float("nan")), dict(p0=True), dict(request_rounds=-1.0)):
        with pytest.raises(ValueError):
            CostConfig(**bad)
