"""rapid-cost's depth: the pure rule (choose_depth, draft_seconds) and CostAwareCAAC driven
through device-like regimes (a clock is the only thing injected: durations are plain numbers)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.runtime.caac import CAAC, CAACConfig
from rapid.runtime.cost_caac import PROBE_BACKOFF, CostAwareCAAC, choose_depth, draft_seconds
from rapid.runtime.cost_model import CostConfig, ReachEstimate

# ---------------------------------------------------------------- the pure rule


def test_choose_depth_by_hand():
    reach = [0.8, 0.6, 0.3]
    draft = [0.0, 0.01, 0.02, 0.03]
    verify = [0.0, 0.02, 0.02, 0.04]
    # rates: (1.8)/0.08 = 22.5, (2.4)/0.09 = 26.67, (2.7)/0.12 = 22.5
    best, rates = choose_depth(reach, draft, verify, 0.05, 1)
    assert best == 2
    assert rates == pytest.approx([0.0, 22.5, 2.4 / 0.09, 22.5])
    assert choose_depth(reach, draft, verify, 0.05, 3)[0] == 3  # the lower bound (kept levels) holds
    assert choose_depth([0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.1, 0.1], 0.0, 1)[0] == 1  # tie: shallower
    with pytest.raises(ValueError):
        choose_depth(reach, draft[:2], verify, 0.05, 1)
    with pytest.raises(ValueError):
        choose_depth(reach, draft, verify, 0.05, -1)


def test_depth_0_drafts_nothing_and_wins_when_a_step_costs_more_than_it_buys():
    """A slow edge under load: a step 0.3 s buys 0.9 tokens, one target step (0.22 s verify +
    0.03 s link) buys 1 for 0.25 s. With lo = 0 the empty tree wins; lo = 1 keeps the old rule.
    Lookup chains join every tree, so a draft is worth what it adds to them."""
    reach, draft, verify = [0.9, 0.6], [0.0, 0.3, 0.6], [0.22, 0.22, 0.23]
    best, rates = choose_depth(reach, draft, verify, 0.03, 0)
    assert best == 0 and rates[0] == pytest.approx(1 / 0.25) and rates[1] == pytest.approx(1.9 / 0.55)
    assert choose_depth(reach, draft, verify, 0.03, 1)[0] == 1
    chain = [0.8, 0.64, 0.512]  # a lookup chain, p = 0.8 a token
    best, rates = choose_depth(reach, draft, verify, 0.03, 0, lookup=chain)
    assert best == 0 and rates[0] == pytest.approx((1 + sum(chain)) / 0.25)
    assert rates[1] == pytest.approx((1 + (1 - 0.1 * 0.2) + 0.64 + 0.512) / 0.55)  # level 1: either carries it
    fast = [0.0, 0.03, 0.06]  # a fast edge: the draft pays ...
    assert choose_depth(reach, fast, verify, 0.03, 0)[0] == 2
    assert choose_depth(reach, fast, verify, 0.03, 0, lookup=[0.3, 0.09])[0] == 2  # ... beside weak chains
    assert choose_depth(reach, fast, verify, 0.03, 0, lookup=chain)[0] == 0  # not beside strong ones
    # a margin: depth 0 must beat the best drafted depth by it (rates 4.0 against 3.45: +16 %)
    assert choose_depth(reach, draft, verify, 0.03, 0, margin=0.1)[0] == 0
    assert choose_depth(reach, draft, verify, 0.03, 0, margin=0.2)[0] == 1


costs = st.lists(st.floats(0.0, 0.05), min_size=8, max_size=8)


@settings(max_examples=200, deadline=None)
@given(h=st.lists(st.floats(0.01, 0.99), min_size=8, max_size=8), step=costs, ver=costs,
       rtt=st.floats(0.0, 0.2), more=st.floats(0.0, 0.3))
def test_a_longer_round_trip_never_makes_the_depth_shallower(h, step, ver, rtt, more):
    """With nondecreasing costs, a fixed cost per round (RTT) favours more tokens per round:
    depth*(RTT + x) >= depth*(RTT) (G2/(c2+R) >= G1/(c1+R) stays true as R grows when G2 > G1)."""
    reach, p = [], 1.0
    for x in h:
        p *= x
        reach.append(p)
    draft = [0.0] + [sum(step[:d]) for d in range(1, 9)]
    verify = [0.0] + [sum(ver[:d]) + 0.001 for d in range(1, 9)]
    assert choose_depth(reach, draft, verify, rtt + more, 1)[0] >= choose_depth(reach, draft, verify, rtt, 1)[0]


def test_draft_seconds_from_the_step_curve():
    flat = draft_seconds({1: 0.010, 4: 0.010}, width=4, max_depth=4, reused=0)
    assert flat == pytest.approx([0.0, 0.01, 0.02, 0.03, 0.04])
    linear = draft_seconds({1: 0.005, 2: 0.010}, width=4, max_depth=3, reused=0)  # T=4 extrapolated
    assert linear == pytest.approx([0.0, 0.005, 0.025, 0.045])
    kept = draft_seconds({1: 0.005, 2: 0.010}, width=4, max_depth=3, reused=2)  # two levels for free
    assert kept == pytest.approx([0.0, 0.0, 0.0, 0.02])
    assert draft_seconds({}, 4, 3, 0) is None


# ---------------------------------------------------------------- the controller


def drive(ctrl, p, step_s, verify, rtt, width=2, budget=16, rounds=300, seed=0, slow=1.0, curve=True):
    """Rounds of i.i.d. per-level acceptance ``p``: each round drafts the controller's depth
    (a root step of 1 token, frontier steps of ``width``, each ``step_s`` x ``slow``), the
    cloud verifies ``min(budget, width * depth)`` nodes in ``verify(nodes)`` and the link adds
    ``rtt``. Returns the depths chosen."""
    rng = random.Random(seed)
    if curve:
        ns = [0, 3, 7, 15, 31]
        ctrl.observe_cloud(ns, [verify(n) for n in ns], budget, width)
    else:
        ctrl.observe_cloud([], [], budget, width)
    depths = []
    for _ in range(rounds):
        d = ctrl.next_depth(True).depth
        depths.append(d)
        for k in range(d):
            ctrl.observe_step(step_s * slow * rng.uniform(0.95, 1.05), 1 if k == 0 else width)
        a = 0
        while a < d and rng.random() < p:
            a += 1
        n = min(budget, width * d)
        ctrl.observe_verdict(d, n, verify(n), rtt)
        ctrl.observe_round(a, d, verify(n) + rtt)
    return depths


def true_rate(d, p, step_s, verify, rtt, width=2, budget=16):
    """Expected tokens per second of depth d in ``drive``'s world."""
    return (1 + sum(p ** k for k in range(1, d + 1))) / (d * step_s + verify(min(budget, width * d)) + rtt)


REGIMES = {  # (p, step seconds, verify(nodes), rtt); the best depth of the true model in the comment
    "gpu, lan": (0.9, 0.010, lambda n: 0.014 + 0.0001 * n, 0.002),  # 2
    "gpu, wan": (0.85, 0.010, lambda n: 0.014 + 0.0001 * n, 0.050),  # 6
    "fp32 cpu": (0.7, 0.025, lambda n: 0.05 + 0.03 * n, 0.002),  # 1
    "cellular": (0.7, 0.025, lambda n: 0.05 + 0.01 * n, 0.150),  # 3
}


@pytest.mark.parametrize("name", sorted(REGIMES))
def test_reaches_the_best_rate_of_the_true_model(name):
    """Over rounds 100..300 of three seeds the chosen depths give >= 98 % of the best depth's
    expected tokens per second (measured: 98.6-100 %; CAAC's set point: 81-99.5 %), and never
    less than CAAC on the same rounds."""
    p, s, v, rtt = REGIMES[name]
    best = max(true_rate(d, p, s, v, rtt) for d in range(1, 9))  # no load: depth 0 is not a candidate
    got, caac = [], []
    for seed in range(3):
        got += [true_rate(d, p, s, v, rtt) / best for d in drive(CostAwareCAAC(), p, s, v, rtt, seed=seed)[100:]]
        caac += [true_rate(d, p, s, v, rtt) / best for d in drive(CAAC(), p, s, v, rtt, seed=seed)[100:]]
    assert sum(got) / len(got) >= 0.98, name
    assert sum(got) >= sum(caac), name


def test_a_slowed_edge_drafts_nothing_but_probes_at_growing_intervals():
    """A 0.1 s step under a 3x load: 0.3 s for the 0.9 tokens it buys, while a round that drafts
    nothing is one target step (0.25 s). Once the gate shuts the rule sends empty trees, drafting
    once after 4, 8, 16, then every 32 undrafted rounds to re-measure the step: >= 97 % of the
    best expected rate at the loaded price over the last 200 rounds. Without load the same
    edge drafts every round (the gate is open), as it does with ``max_undrafted=0``."""
    p, s, v, rtt = 0.9, 0.1, (lambda n: 0.22 + 0.0005 * n), 0.03
    assert max(range(9), key=lambda d: true_rate(d, p, 3 * s, v, rtt)) == 0
    ctrl = CostAwareCAAC()
    free = drive(ctrl, p, s, v, rtt, rounds=60)
    assert min(free) >= 1
    depths = drive(ctrl, p, s, v, rtt, rounds=300, slow=3.0, seed=1)
    drafted = [i for i, d in enumerate(depths) if d > 0]
    gaps = [b - a - 1 for a, b in zip(drafted, drafted[1:], strict=False)]
    assert [g for g in gaps if g > 0][:4] == [4, 8, 16, 32] and max(gaps) == 32
    best = true_rate(0, p, 3 * s, v, rtt)
    assert sum(true_rate(d, p, 3 * s, v, rtt) / best for d in depths[100:]) / 200 >= 0.97
    never = CostAwareCAAC(cost=CostConfig(max_undrafted=0))  # 0: every round drafts
    drive(never, p, s, v, rtt, rounds=60)
    assert min(drive(never, p, s, v, rtt, rounds=50, slow=3.0, seed=1)) >= 1


def test_when_the_load_lifts_drafting_resumes_at_the_next_probe():
    """A 0.1 s step under a 3x load (0.3 s): no drafting; once the load is gone the next probe
    measures the step at its baseline and the rule drafts again within the probe interval."""
    p, s, v, rtt = 0.9, 0.1, (lambda n: 0.22 + 0.0005 * n), 0.03
    ctrl = CostAwareCAAC()
    drive(ctrl, p, s, v, rtt, rounds=60)  # the baseline, learnt without load
    loaded = drive(ctrl, p, s, v, rtt, rounds=100, slow=3.0, seed=1)
    assert loaded[-40:].count(0) >= 35
    free = drive(ctrl, p, s, v, rtt, rounds=60, seed=2)
    back = next(i for i in range(len(free)) if all(d > 0 for d in free[i:]))
    assert back <= PROBE_BACKOFF * CostConfig().max_undrafted + 3, free


def test_one_slow_step_shuts_the_gate_but_no_round_goes_undrafted_for_it():
    """Without load about one step in ten is a spike (a shared CPU): one shuts CAAC's gate, and a
    round that drafts nothing measures no step, so a skip on one spike could last. Only a run of
    ``slow_steps`` (2) measured steps each over the band lets a round draft nothing; a step of a
    size not seen yet (a probe feeding the tokens the skipped rounds left pending) counts neither
    way, and one at its baseline ends the run."""
    p, s, v, rtt = 0.9, 0.1, (lambda n: 0.22 + 0.0005 * n), 0.03  # drafting nothing wins at 2.5x and more
    assert max(range(9), key=lambda d: true_rate(d, p, 2.5 * s, v, rtt)) == 0
    ctrl = CostAwareCAAC()
    drive(ctrl, p, s, v, rtt, rounds=60)
    ctrl.observe_step(5 * s, 2)  # a spike: ESR 3
    assert ctrl.next_depth(True).eta < 1 and ctrl.next_depth(True).depth >= 1
    ctrl.observe_step(9 * s, 17)  # a size not seen: no evidence either way
    assert ctrl.next_depth(True).depth >= 1
    ctrl.observe_step(5 * s, 2)  # the second slow step in a row: a slowed edge
    assert ctrl.next_depth(True).depth == 0
    ctrl.observe_step(s, 2)  # a step at its baseline (a probe's) ends the run
    assert ctrl.next_depth(True).eta < 1 and ctrl.next_depth(True).depth >= 1


def test_without_load_only_chains_that_carry_the_round_send_it_undrafted():
    """A slow edge without load (a 0.13 s step against a 0.15 s verify): a 4-level lookup chain the
    request's text keeps confirming sends rounds undrafted (their rate ~1.5x the best drafted one);
    a weak chain (~1.16x, a near tie of estimates) does not, as it would with the loaded margin."""
    p, s, v, rtt = 0.9, 0.13, (lambda n: 0.15 + 0.005 * n), 0.03
    ctrls = CostAwareCAAC(), CostAwareCAAC(cost=CostConfig(open_skip_margin=CostConfig().skip_margin))
    assert min(drive(ctrls[0], p, s, v, rtt, rounds=60)) >= 1  # no chains: every round drafts
    drive(ctrls[1], p, s, v, rtt, rounds=60)  # (with the loaded margin: the empty tree's ~1.07x skips)
    for ctrl in ctrls:
        ctrl.observe_lookup([0.9] * 4, 4)
        assert ctrl.next_depth(True).depth == 0 and ctrl.next_depth(True).eta == 1.0
        ctrl.observe_lookup([0.3], 1)
    assert ctrls[0].next_depth(True).depth >= 1 and ctrls[1].next_depth(True).depth == 0


def test_depth_follows_the_round_trip():
    p, s, v, _ = REGIMES["cellular"]
    lan = drive(CostAwareCAAC(), p, s, v, 0.002)[100:]
    wan = drive(CostAwareCAAC(), p, s, v, 0.150)[100:]
    assert sum(wan) / len(wan) > sum(lan) / len(lan) + 1


def test_learns_the_verify_curve_without_a_start_up_curve():
    p, s, v, rtt = REGIMES["fp32 cpu"]  # a steep verify curve, learned from the verdicts alone
    best = max(true_rate(d, p, s, v, rtt) for d in range(1, 9))
    got = [true_rate(d, p, s, v, rtt) / best for d in drive(CostAwareCAAC(), p, s, v, rtt, curve=False)[100:]]
    assert sum(got) / len(got) >= 0.98


def test_is_caac_until_the_costs_are_known():
    cost, caac = CostAwareCAAC(initial_depth=5), CAAC(initial_depth=5)
    for c in (cost, caac):
        for _ in range(12):
            c.observe_step(0.01, 2)
        c.observe_round(5, 5, 0.05)
    assert cost.next_depth(True).depth == caac.next_depth(True).depth  # no verify time, no RTT yet
    cost.observe_verdict(5, 8, 0.03, 0.02)
    assert cost.cost_depth() is not None


def test_a_slowdown_prices_the_draft_steps_instead_of_scaling_the_depth():
    """Under load depth* is the argmax with every step at ESR times its baseline (the gate is
    shut, but eta does not multiply the choice); without load the price is the baseline."""
    p, s, v, rtt = REGIMES["gpu, wan"]
    ctrl = CostAwareCAAC()
    drive(ctrl, p, s, v, rtt, rounds=100)
    free = ctrl.next_depth(True)
    assert free.eta == 1.0 and free.depth == ctrl.cost_depth(0, True)[0]
    drive(ctrl, p, s, v, rtt, rounds=3, slow=2.0, seed=1)  # a sustained 2x slowdown
    busy = ctrl.next_depth(True)
    assert busy.eta < 0.8 and busy.esr > 1.2
    assert busy.depth == busy.b_hat == ctrl.cost_depth(0, True, busy.esr)[0]
    assert busy.depth <= free.depth


def test_under_load_the_depth_keeps_the_best_rate_where_eta_would_throw_acceptance_away():
    """A slow edge (step ~0.4 of a verify, the PyTorch draft on a CPU), every level accepted, no
    branch kept, a 2x load: the verify and the RTT are paid per round, so the contended argmax
    stays deep, and its expected tokens per second at the contended price beat CAAC-style
    ``round(eta * depth*)``."""
    ctrl = CostAwareCAAC()
    ctrl.observe_cloud([0, 31], [0.33, 0.34], 16, 2)
    for _ in range(30):
        ctrl.observe_step(0.13, 1)
        ctrl.observe_step(0.13, 2)
    for _ in range(30):
        ctrl.observe_verdict(4, 8, 0.33, 0.03, accepted=4, hit=False)
        ctrl.observe_round(4, 4, 0.36)
    for _ in range(4):  # the load: every step twice as long
        ctrl.observe_step(0.26, 1)
        ctrl.observe_step(0.26, 2)
    busy = ctrl.next_depth(True)
    assert busy.eta < 0.75
    rates = ctrl.cost_depth(0, True, busy.esr)[1]
    scaled = max(1, round(busy.eta * ctrl.cost_depth(0, True)[0]))
    assert rates[busy.depth] == max(rates) and busy.depth > scaled
    assert rates[busy.depth] > rates[scaled]


def test_a_new_request_follows_its_own_text_within_a_few_rounds():
    """The reach carried from a request whose text the draft followed badly (per-level acceptance
    0.3) is a prior worth ``request_rounds`` rounds: on a new request that it follows well (0.95)
    the first rounds go deeper sooner than with the whole carried memory (~20 rounds)."""
    _, s, v, rtt = REGIMES["gpu, wan"]

    def first_rounds(request_rounds: float) -> float:
        ctrl = CostAwareCAAC(cost=CostConfig(request_rounds=request_rounds))
        drive(ctrl, 0.3, s, v, rtt, rounds=80)
        ctrl.new_request()
        return sum(true_rate(d, 0.95, s, v, rtt) for d in drive(ctrl, 0.95, s, v, rtt, rounds=8, seed=1))

    assert first_rounds(CostConfig().request_rounds) > 1.1 * first_rounds(1e9)


def test_what_if_leaves_the_state_alone_and_kept_levels_bound_the_depth():
    p, s, v, rtt = REGIMES["gpu, lan"]
    ctrl = CostAwareCAAC(CAACConfig())
    drive(ctrl, p, s, v, rtt, rounds=60)
    before = ctrl.snapshot()
    ctrl.next_depth_if(8, 8)
    ctrl.next_depth_if(0, 8)
    assert ctrl.snapshot() == before
    assert ctrl.next_depth_if(8, 8).depth >= ctrl.next_depth_if(0, 8).depth
    assert ctrl.next_depth(True, reused=7).b_hat >= 7


def test_a_kept_branch_is_credited_by_the_rate_it_is_kept_at():
    """saved(D) = (P(reach D) k_full + (1 - P(reach D)) k_part) * min(RTT + V(n(D)), draft(D, 0))."""
    ctrl = CostAwareCAAC()
    ctrl.observe_cloud([0, 31], [0.02, 0.02], 16, 2)  # flat verify, 20 ms
    for _ in range(20):
        ctrl.observe_step(0.01, 1)
        ctrl.observe_step(0.01, 2)
    ctrl.observe_verdict(4, 8, 0.02, 0.005, accepted=4, hit=True)  # kept after a full round
    ctrl.observe_verdict(4, 8, 0.02, 0.005, accepted=1, hit=False)  # not kept after a partial one
    plain = ctrl.cost_depth(0, False)[1]
    credited = ctrl.cost_depth(0, True)[1]
    reach = ctrl._reach.reach()
    for d in range(1, 9):
        saved = reach[d - 1] * 1.0 * min(0.005 + 0.02, 0.01 * d)
        gain = 1 + sum(reach[:d])
        assert credited[d] == pytest.approx(gain / (0.01 * d - saved + 0.02 + 0.005)), d
        assert credited[d] > plain[d]
    assert ctrl.snapshot()["kept_after_full"] == 1.0 and ctrl.snapshot()["kept_after_partial"] == 0.0


def test_a_chain_that_carries_the_verdict_past_the_draft_leaves_no_branch_to_keep():
    """A verdict a lookup chain carries below the drafted levels lands where no root can be: the
    saving is discounted by P_lookup(D + 1), and such a round is no sample of the kept rates
    (counted as a full round that lost its branch, it would drive k_full down)."""
    ctrl = CostAwareCAAC()
    ctrl.observe_cloud([0, 31], [0.02, 0.02], 16, 2)
    for _ in range(20):
        ctrl.observe_step(0.01, 1)
        ctrl.observe_step(0.01, 2)
    ctrl.observe_verdict(4, 8, 0.02, 0.005, accepted=4, hit=True)  # kept after a full round
    for _ in range(5):
        ctrl.observe_verdict(1, 9, 0.02, 0.005, accepted=8, hit=False)  # a chain's rounds
    assert ctrl.snapshot()["kept_after_full"] == 1.0
    chain = [0.9, 0.8, 0.7]  # levels 1..3
    ctrl.observe_lookup(chain, 3)
    rates = ctrl.cost_depth(0, True)[1]
    reach = ctrl._reach.reach()
    for d in range(1, 9):
        past = chain[d] if d < len(chain) else 0.0
        saved = reach[d - 1] * 1.0 * (1.0 - past) * min(0.005 + 0.02, 0.01 * d)
        gain = 1 + sum(1 - (1 - reach[k]) * (1 - (chain[k] if k < 3 else 0.0)) for k in range(d))
        gain += sum(chain[d:])
        assert rates[d] == pytest.approx(gain / (0.01 * d - saved + 0.02 + 0.005)), d


def test_a_round_a_lookup_chain_carried_past_the_drafted_depth_is_no_reach_sample():
    """Only a chain reaches below the drafted levels, and the verdict does not say which drafted
    levels the draft's own nodes matched: the reach is left as it was, where a round that
    accepted every drafted level raises it."""
    ctrl = CostAwareCAAC()
    for _ in range(3):
        ctrl.observe_round(1, 3)  # the first verdict is CAAC's unsampled one; these are samples
    before = ctrl._reach.reach()
    for _ in range(10):
        ctrl.observe_round(9, 3)
    assert ctrl._reach.reach() == before
    for _ in range(10):
        ctrl.observe_round(3, 3)
    assert all(a > b for a, b in zip(ctrl._reach.reach()[:3], before[:3], strict=True))


def test_a_requests_first_verdict_is_no_sample_of_level_1():
    """Its level 1 is the reply's first token, which the draft gets right far less often than any
    later position (CAAC's PID takes no sample of it either); its deeper levels count. Taken whole,
    each request's first miss pulled the level-1 rate down, carried into the next request too."""
    ctrl = CostAwareCAAC()
    for _ in range(3):
        ctrl.new_request()
        ctrl.observe_round(0, 2)  # a first miss
        for _ in range(4):
            ctrl.observe_round(1, 1)  # then depth-1 rounds, every level accepted
    taken_whole = ReachEstimate(8)
    for _ in range(3):
        taken_whole.carry(CostConfig().request_rounds)
        taken_whole.observe(0, 2)
        for _ in range(4):
            taken_whole.observe(1, 1)
    assert ctrl._reach.reach()[0] > taken_whole.reach()[0]
    assert ctrl._reach.trials[1] < taken_whole.trials[1]
    ctrl.new_request()
    before = list(ctrl._reach.trials)
    ctrl.observe_round(3, 4)  # a first verdict that got the first token right: levels 2..4 count
    assert ctrl._reach.trials[1] == pytest.approx(before[1] * (1 - CostConfig().alpha_reach))
    assert ctrl._reach.succ[2] > before[2] * (1 - CostConfig().alpha_reach)


def test_no_saving_after_a_full_round_where_the_branch_cannot_run_a_second_wave():
    """A fully accepted round ends on an unfed leaf: a root there needs the branch's second step.
    Where two branch steps outlast the wait (the gate's s and T: 0.3 s each and 0.4 s, a loaded slow
    edge) k_full is priced at 0 and such a round is no sample of it; where they fit (0.1 s) the
    same estimates credit the saving. On the old pricing a no-load k_full of 1 priced depth 2 under
    the load for a saving that could not happen."""
    ctrl = CostAwareCAAC()
    ctrl.observe_cloud([0, 31], [0.33, 0.34], 16, 2)
    for _ in range(20):
        ctrl.observe_step(0.13, 1)
        ctrl.observe_step(0.13, 2)
    ctrl.observe_verdict(1, 2, 0.34, 0.03, accepted=1, hit=True)  # kept after a full round, no load
    assert ctrl.snapshot()["kept_after_full"] == 1.0
    ctrl.gate.observe_cloud(0.4)
    ctrl.gate.observe_step(0.1)
    credited = ctrl.cost_depth(0, True)[1]
    assert credited[1] > ctrl.cost_depth(0, False)[1][1]
    ctrl.gate.step_s = 0.3  # a contended branch step: 2 s > T
    assert ctrl.cost_depth(0, True)[1] == pytest.approx(ctrl.cost_depth(0, False)[1])  # k_part is 0
    ctrl.observe_verdict(1, 2, 0.34, 0.03, accepted=1, hit=False)  # no sample: no root could be kept
    assert ctrl.snapshot()["kept_after_full"] == 1.0
    ctrl.observe_verdict(2, 3, 0.34, 0.03, accepted=1, hit=False)  # a partial round still counts
    assert ctrl.snapshot()["kept_after_partial"] == 0.0
