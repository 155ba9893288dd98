"""CAAC depth controller: scripted scenarios (no models), bounds, anti-windup, time cap."""

from __future__ import annotations

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.runtime.caac import CAAC, CAACConfig, FixedDepth
from rapid.runtime.depth_control import CAACDecision

TOK = 8  # tokens fed per expansion step
TAU = 0.01  # normal seconds per token
P_CHAIN = 0.835  # per-token acceptance for which E[a](4) / 4 ~= 0.65 (the default target)


def chain_plant(p: float = P_CHAIN):
    """Accepted length of a chain with per-token acceptance p, error-diffused to ints."""
    carry = [0.0]

    def accepted(depth: int) -> int:
        carry[0] += sum(p**k for k in range(1, depth + 1))
        a = math.floor(carry[0])
        carry[0] -= a
        return a

    return accepted


def ratio_feeder(ratio: float = 0.65):
    """Accepted length averaging ratio * depth (depth-independent acceptance ratio)."""
    carry = [0.0]

    def accepted(depth: int) -> int:
        carry[0] += ratio * depth
        a = math.floor(carry[0])
        carry[0] -= a
        return a

    return accepted


def run_rounds(ctl, n, feeder, tau=TAU, cloud=0.1, proactive=False):
    """n rounds: decide depth, draft `depth` steps at `tau` s/token, report the verdict."""
    decisions = []
    for _ in range(n):
        dec = ctl.next_depth(proactive)
        for _ in range(dec.depth):
            ctl.observe_step(tau * TOK, TOK)
        ctl.observe_round(feeder(dec.depth), dec.depth, cloud)
        decisions.append(dec)
    return decisions


def depths(decisions):
    return [d.depth for d in decisions]


@pytest.mark.parametrize("feeder", [chain_plant, ratio_feeder], ids=["chain", "ratio"])
def test_steady_state_keeps_depth_constant(feeder):
    ctl = CAAC()
    f = feeder()
    run_rounds(ctl, 3, f)  # warm-up (8 steps = 2 rounds of 4)
    decs = run_rounds(ctl, 300, f)
    assert depths(decs) == [4] * 300
    assert all(d.eta == 1.0 and abs(d.esr - 1.0) < 1e-9 for d in decs)


@pytest.mark.parametrize("feeder", [chain_plant, ratio_feeder], ids=["chain", "ratio"])
def test_sustained_slowdown_lowers_depth_holds_then_recovers(feeder):
    ctl = CAAC()
    f = feeder()
    assert depths(run_rounds(ctl, 20, f))[-1] == 4
    slow = run_rounds(ctl, 60, f, tau=2 * TAU)
    # Lowered within a few rounds (<= 5 rounds, ~4 steps each) ...
    assert min(depths(slow[:5])) < 4
    # ... and kept lower while the slowdown lasts: the baseline does not absorb it.
    assert all(d.depth < 4 for d in slow[5:60]), depths(slow)
    assert all(d.esr > ctl.config.band_hi and d.eta < 1 for d in slow[5:60])
    # Recovery restores the depth within a few rounds and keeps it.
    rec = run_rounds(ctl, 40, f, tau=TAU)
    assert 4 in depths(rec[:3])
    assert depths(rec[3:]) == [4] * 37


def test_permanent_slowdown_is_absorbed_in_bounded_time():
    cfg = CAACConfig()
    ctl = CAAC(cfg)
    for _ in range(40):
        ctl.observe_step(TAU * TOK, TOK)
    n = 0
    while n == 0 or ctl.next_depth().eta < 1.0:
        ctl.observe_step(2 * TAU * TOK, TOK)
        n += 1
        assert n < 5000, "baseline never adapted to a permanent change"
    # Not too fast (>= 50 rounds of 4 steps), not slower than the documented bound.
    bound = math.log(cfg.band_hi / (cfg.band_hi - 1)) / cfg.alpha_slow_hold
    assert 200 <= n <= bound + 10, n
    assert ctl.next_depth().depth == 4


def test_warmup_gate_open_then_a_spike_closes_it():
    ctl = CAAC(CAACConfig(n_warmup=8))
    for i in range(8):
        ctl.observe_step((1 + 3 * i) * TAU * TOK, TOK)  # steadily slower during warm-up
        d = ctl.next_depth()
        assert d.eta == 1.0 and d.esr == 1.0 and d.depth == 4
    ctl.observe_step(100 * TAU * TOK, TOK)  # after warm-up a spike closes the gate
    assert ctl.next_depth().eta < 1.0


def test_full_acceptance_raises_to_max():
    ctl = CAAC()
    ds = depths(run_rounds(ctl, 40, lambda d: d))
    assert ds[1] == 4 and ds[2] > 4  # the first verdict is no sample, then responds at once (P term)
    assert 8 in ds[:15]
    assert ds[15:] == [8] * 25


def test_zero_acceptance_lowers_to_min():
    ctl = CAAC()
    ds = depths(run_rounds(ctl, 30, lambda d: 0))
    assert ds[1] == 4 and ds[2] < 4
    assert 1 in ds[:8]
    assert ds[8:] == [1] * 22


def test_no_windup_after_long_saturation():
    cfg = CAACConfig()
    ctl = CAAC(cfg)
    ds = depths(run_rounds(ctl, 100, lambda d: d))
    assert ds[-50:] == [8] * 50
    assert ctl.snapshot()["integral"] * cfg.ki <= cfg.max_depth - ctl.base_depth + 1e-9
    down = depths(run_rounds(ctl, 10, lambda d: 0))
    assert down[1] < 8
    assert down[3] <= 5  # an unclamped integral (~35 after 100 rounds) would stay at 8
    assert min(down[:8]) <= 3


def test_no_windup_at_minimum():
    ctl = CAAC()
    run_rounds(ctl, 100, lambda d: 0)
    up = depths(run_rounds(ctl, 10, lambda d: d))
    assert up[3] >= 3 and max(up[:8]) >= 4  # an unclamped integral would stay at 1


def test_time_cap_only_when_proactive_and_enabled():
    # tau 0.01 s/token * 8 tokens = 0.08 s per step; cloud 0.2 s -> budget 2.5 -> cap 2.
    for cfg, proactive, expect, capped in [
        (CAACConfig(), True, 2, True),
        (CAACConfig(), False, 8, False),
        (CAACConfig(time_cap=False), True, 8, False),
    ]:
        ctl = CAAC(cfg)
        run_rounds(ctl, 30, lambda d: d, cloud=0.2)
        d = ctl.next_depth(proactive)
        assert (d.depth, d.capped_by_time) == (expect, capped)
        assert d.b_hat == 8.0


def test_time_cap_bounds():
    ctl = CAAC()
    run_rounds(ctl, 30, lambda d: d, cloud=1.0)  # budget 12.5 steps: not binding
    assert ctl.next_depth(True).depth == 8 and not ctl.next_depth(True).capped_by_time
    ctl = CAAC()
    run_rounds(ctl, 30, lambda d: d, cloud=0.001)  # budget < 1 step: still at least 1
    assert ctl.next_depth(True).depth == 1
    ctl = CAAC()  # no cloud time reported: no cap
    run_rounds(ctl, 30, lambda d: d, cloud=None)
    assert ctl.next_depth(True).depth == 8


def test_time_cap_proactive_closed_loop_does_not_wind_up():
    ctl = CAAC()
    decs = run_rounds(ctl, 5, lambda d: d, cloud=0.2, proactive=True)
    integral = ctl.snapshot()["integral"]
    decs = run_rounds(ctl, 60, lambda d: d, cloud=0.2, proactive=True)
    assert all(d.depth <= 2 and d.capped_by_time for d in decs)
    # Rounds executed below the logical depth do not feed the integral (they are accepted
    # at a higher ratio only because they were cut).
    assert ctl.snapshot()["integral"] == integral
    assert 4 < ctl.next_depth(False).depth < 8


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf, -math.inf, 1e9, "x", None])
def test_invalid_steps_ignored(seconds):
    ctl = CAAC()
    run_rounds(ctl, 5, ratio_feeder())
    before = ctl.snapshot()
    ctl.observe_step(seconds, TOK)
    ctl.observe_step(0.08, 0)
    ctl.observe_step(0.08, -3)
    after = ctl.snapshot()
    assert after["ignored_steps"] == before["ignored_steps"] + 3
    assert {k: v for k, v in after.items() if k != "ignored_steps"} == {
        k: v for k, v in before.items() if k != "ignored_steps"}


def test_a_requests_first_verdict_is_no_sample():
    """It tests the reply's first token, which the draft misses far more often than the rest
    (module docstring): a first miss leaves the depth at its base, a second one lowers it, and
    every request's first verdict is skipped again."""
    ctl = CAAC()
    for _ in range(2):
        ctl.observe_round(0, 4, 0.2)
        assert ctl.next_depth().depth == 4 and ctl.snapshot()["rounds"] == 0
        assert ctl.snapshot()["cloud_seconds"] > 0  # the link is still timed
        ctl.observe_round(0, 4, 0.2)
        assert ctl.next_depth().depth < 4 and ctl.snapshot()["rounds"] == 1
        ctl.new_request()
    assert ctl.snapshot()["unsampled_rounds"] == 2


def test_invalid_rounds_ignored():
    ctl = CAAC()
    base = ctl.snapshot()
    for a, d in [(-1, 4), (2, 0), (2, -1), (1.5, 4), (math.nan, 4), (None, 4)]:
        ctl.observe_round(a, d)
    assert ctl.snapshot()["ignored_rounds"] == 6 and ctl.snapshot()["rounds"] == 0
    assert ctl.snapshot()["acceptance"] == base["acceptance"]
    ctl.observe_round(0, 4)  # the request's first verdict: valid, no sample
    assert ctl.snapshot()["unsampled_rounds"] == 1 and ctl.snapshot()["acceptance"] == base["acceptance"]
    ctl.observe_round(4, 4, cloud_seconds=math.nan)  # a bad duration leaves the round valid
    assert ctl.snapshot()["acceptance"] == pytest.approx(0.65 + 0.3 * 0.35)
    assert ctl.snapshot()["cloud_seconds"] == 0.0


def test_a_round_a_lookup_chain_carried_past_the_drafted_depth_is_no_sample():
    """Only a prompt-lookup chain reaches below the drafted levels: such a round's length is the
    chain's, so the PID neither deepens on it (as min(accepted, depth) would) nor counts it."""
    carried, full = CAAC(), CAAC()
    for c in (carried, full):
        c.observe_round(4, 4)  # the request's first verdict (no sample either)
    for _ in range(6):
        carried.observe_round(12, 4, 0.3)  # the chain carried 12 tokens past a depth-4 tree
        full.observe_round(4, 4, 0.3)  # the draft's own 4 levels all accepted
    snap = carried.snapshot()
    assert snap["unsampled_rounds"] == 7 and snap["rounds"] == 0 and snap["ignored_rounds"] == 0
    assert snap["acceptance"] == 0.65 and carried.next_depth().depth == 4
    assert snap["cloud_seconds"] == pytest.approx(0.3)  # the link still times the round
    assert full.next_depth().depth > 4


def test_near_zero_step_times_stay_finite():
    ctl = CAAC()
    for s in [5e-324, 1e-300, 1e-12, 1e-300, 3600.0, 5e-324]:
        ctl.observe_step(s, 10**6)
        ctl.observe_round(1, 4, 5e-324)
        d = ctl.next_depth(True)
        assert 1 <= d.depth <= 8
        assert all(math.isfinite(getattr(d, k)) for k in
                   ("tau_cur", "tau_fast", "tau_slow", "esr", "eta", "acceptance", "b_hat"))


floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(min_value=0, max_value=1e-6), st.floats(min_value=1e-4, max_value=1.0))
ops = st.lists(st.one_of(
    st.tuples(st.just("step"), floats, st.integers(-2, 64)),
    st.tuples(st.just("round"), st.integers(-3, 12), st.integers(-1, 10),
              st.one_of(st.none(), floats)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=ops, cfg_i=st.integers(0, 2), initial=st.integers(1, 8))
def test_bounds_and_finiteness_hypothesis(ops, cfg_i, initial):
    cfg = [CAACConfig(), CAACConfig(n_warmup=0, gamma=3.0, eta_min=0.1),
           CAACConfig(kp=20.0, ki=5.0, kd=10.0, alpha_acc=1.0)][cfg_i]
    for ctl in (CAAC(cfg, initial_depth=initial), FixedDepth(initial, cfg)):
        for op in ops:
            if op[0] == "step":
                ctl.observe_step(op[1], op[2])
            else:
                ctl.observe_round(op[1], op[2], op[3])
            for proactive in (False, True):
                d = ctl.next_depth(proactive)
                assert isinstance(d.depth, int) and 1 <= d.depth <= 8
                assert 0 < d.eta <= 1
                for k in ("tau_cur", "tau_fast", "tau_slow", "esr", "acceptance", "b_hat"):
                    assert math.isfinite(getattr(d, k)), k
        snap = ctl.snapshot()
        assert all(math.isfinite(v) for v in snap.values() if isinstance(v, float))
        json.dumps(snap)


def test_fixed_depth_ignores_signals_but_records_taus():
    fd = FixedDepth(3)
    run_rounds(fd, 10, lambda d: d)
    decs = run_rounds(fd, 10, lambda d: 0, tau=4 * TAU, cloud=0.001, proactive=True)
    assert depths(decs) == [3] * 10
    d = fd.next_depth(True)
    assert isinstance(d, CAACDecision) and d.depth == 3 and not d.capped_by_time
    assert d.tau_fast > TAU and d.esr > 1.5 and d.eta == 1.0
    assert fd.snapshot()["policy"] == "FixedDepth"


def test_next_depth_is_pure_and_snapshot_serializable():
    ctl = CAAC()
    run_rounds(ctl, 10, chain_plant(), tau=2 * TAU)
    assert ctl.next_depth() == ctl.next_depth()
    assert ctl.next_depth(True) == ctl.next_depth(True)
    snap = ctl.snapshot()
    json.dumps(snap)
    assert snap["depth"] == ctl.next_depth().depth and snap["policy"] == "CAAC"


@pytest.mark.parametrize("kwargs", [
    {"min_depth": 0}, {"min_depth": 5, "max_depth": 4}, {"max_depth": 8.0},
    {"alpha_fast": 0.0}, {"alpha_fast": 1.5}, {"alpha_slow": 0.6},
    {"alpha_slow_hold": 0.0}, {"alpha_slow_hold": 0.02}, {"n_warmup": -1},
    {"n_warmup": True}, {"band_hi": 0.9}, {"gamma": 0.0}, {"eta_min": 0.0},
    {"eta_min": 1.1}, {"tau_floor": 0.0}, {"max_seconds": 0.0}, {"alpha_acc": 0.0},
    {"target_acceptance": 0.0}, {"target_acceptance": 1.0}, {"kp": -1.0}, {"ki": -0.1},
    {"kd": math.nan}, {"alpha_cloud": 0.0}, {"time_cap": 1}, {"gamma": math.inf},
    {"band_hi": "1.2"}, {"max_classes": 0}, {"max_classes": 2.0},
])
def test_config_validation(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name if name != "max_depth" else "max_depth"):
        CAACConfig(**kwargs)


@pytest.mark.parametrize("initial", [0, 9, 2.5, True, "4"])
def test_initial_depth_validation(initial):
    with pytest.raises(ValueError, match="initial_depth"):
        CAAC(initial_depth=initial)
    with pytest.raises(ValueError, match="initial_depth"):
        FixedDepth(initial)


def test_config_is_frozen_and_defaults_valid():
    cfg = CAACConfig()
    with pytest.raises(AttributeError):
        cfg.kp = 1.0  # type: ignore[misc]
    assert (cfg.min_depth, cfg.max_depth, cfg.time_cap) == (1, 8, True)


def test_new_request_keeps_the_latency_baseline_and_resets_the_pid():
    c = CAAC(CAACConfig(), initial_depth=4)
    for _ in range(20):
        c.observe_step(0.01, 2)
    for _ in range(6):
        c.observe_round(0, 4, 0.05)
    before = c.snapshot()
    assert before["b_hat"] < 4 and before["integral"] != 0
    c.new_request()
    after = c.snapshot()
    for k in ("steps", "tau_fast", "tau_slow", "tokens_per_step", "cloud_seconds"):
        assert after[k] == before[k], k
    assert after["rounds"] == 0 and after["integral"] == 0 and after["error"] == 0
    assert after["acceptance"] == CAACConfig().target_acceptance and after["b_hat"] == 4


def test_carried_baseline_sees_contention_that_began_before_the_request():
    """A fresh controller learns its baseline under the load; a carried one gates at once."""
    carried = CAAC(CAACConfig(), initial_depth=4)
    for _ in range(40):
        carried.observe_step(0.01, 2)  # uncontended history
    carried.new_request()
    fresh = CAAC(CAACConfig(), initial_depth=4)
    for c in (carried, fresh):
        for _ in range(12):
            c.observe_step(0.03, 2)  # 3x slower from the start of this request
    assert fresh.next_depth().eta == 1.0
    d = carried.next_depth()
    assert d.esr > 2 and d.eta < 0.5 and d.depth < 4


def test_anti_windup_uses_the_b_hat_that_set_the_depth():
    """A proactive caller decides depth L_i before verdict i-1 has moved B_hat; passing the
    decision's B_hat makes the freeze test compare L_i with the B_hat behind it."""
    ctl = CAAC()
    ctl.observe_round(2, 4)  # the request's first verdict: no sample
    dec = ctl.next_depth()  # depth 4 from B_hat 4
    ctl.observe_round(4, 4)  # B_hat moves above 4 (all accepted)
    assert round(ctl.next_depth().b_hat) > 4
    stale, fresh = copy.deepcopy(ctl), copy.deepcopy(ctl)
    stale.observe_round(4, dec.depth)  # compared with the moved B_hat: frozen
    fresh.observe_round(4, dec.depth, b_hat=dec.b_hat)  # compared with the B_hat behind it
    assert stale.snapshot()["integral"] == ctl.snapshot()["integral"]
    assert fresh.snapshot()["integral"] > ctl.snapshot()["integral"]
    for bad in (math.nan, math.inf, "4", True):  # an unusable b_hat falls back to the current one
        other = copy.deepcopy(ctl)
        other.observe_round(4, dec.depth, b_hat=bad)
        assert other.snapshot() == stale.snapshot()


@pytest.mark.parametrize("accepted", [0, 2, 4])
def test_next_depth_if_previews_observe_round_without_changing_state(accepted):
    ctl = CAAC()
    run_rounds(ctl, 6, chain_plant(), cloud=0.2)
    before = ctl.snapshot()
    dec = ctl.next_depth(True)
    preview = ctl.next_depth_if(accepted, dec.depth, dec.b_hat, True)
    assert ctl.snapshot() == before
    ctl.observe_round(accepted, dec.depth, None, dec.b_hat)
    assert preview == ctl.next_depth(True)
    assert FixedDepth(3).next_depth_if(accepted, 3).depth == 3
