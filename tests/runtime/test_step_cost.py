"""The per-size step baselines and the price of a step run beside the verify (runtime.step_cost)."""

from __future__ import annotations

import pytest

from rapid.runtime.caac import CAAC
from rapid.runtime.step_cost import BesideVerify


def test_a_wait_step_is_priced_at_the_drafting_step_it_runs_beside():
    """Drafting steps of 0.266 s and catch-up steps of 0.335 s under the same load (the Zen 2's
    medians): a wait step comes to be priced at the drafting step's time; a drafting step is
    priced at its own."""
    b = BesideVerify()
    for _ in range(30):
        assert b.price(0.266, 1, False) == 0.266
        priced = b.price(0.335, 1, True)
    assert priced == pytest.approx(0.266, rel=0.01)
    assert b.kappa == pytest.approx(0.335 / 0.266, rel=0.01)


@pytest.mark.parametrize("wait_s", [0.2, 0.15])
def test_an_edge_of_its_own_prices_a_wait_step_at_its_own_time(wait_s):
    """A wait step as fast as a drafting step (an edge of its own) or faster (noise) is priced at
    its own time: never below it."""
    b = BesideVerify()
    for _ in range(20):
        b.price(0.2, 2, False)
        assert b.price(wait_s, 2, True) == wait_s


def test_kappa_holds_through_undrafted_rounds_and_a_lift_still_shows():
    b = BesideVerify()
    for _ in range(30):
        b.price(0.2, 1, False)
        b.price(0.3, 1, True)
    for _ in range(b.fresh):  # the last drafting step is still fresh
        b.price(0.3, 1, True)
    kappa = b.kappa
    loaded = [b.price(0.3, 1, True) for _ in range(20)]  # catch-up steps alone: no fresh drafting step
    assert b.kappa == kappa and loaded[-1] == pytest.approx(0.2, rel=0.01)
    assert b.price(0.15, 1, True) == pytest.approx(0.1, rel=0.01)  # the load lifts: half the price


def test_only_a_drafting_step_of_the_same_size_measures_kappa():
    b = BesideVerify()
    for _ in range(10):
        b.price(0.2, 1, False)
        assert b.price(0.5, 3, True) == 0.5  # no drafting step of 3 tokens: not measured, kappa 1
    assert b.kappa == 1.0


@pytest.mark.parametrize("kwargs", [{"alpha": 0.0}, {"alpha": 1.5}, {"fresh": 0}, {"kappa_max": 0.5},
                                    {"max_classes": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        BesideVerify(**kwargs)


def test_caac_prices_the_load_by_its_drafting_steps():
    """Baselines learnt without load (0.1 s a step), then a 2x load on drafting steps while the
    steps in the wait take 2.5x (they share the host with the verify): the slowdown reads as it
    would from the drafting steps alone, not higher as both kinds mixed, and the snapshot reports
    the wait steps' factor."""
    ctrl, mixed, drafting = CAAC(), CAAC(), CAAC()
    for c in (ctrl, mixed, drafting):
        for _ in range(40):
            c.observe_step(0.1, 1)
    for _ in range(40):
        for c, flag in ((ctrl, True), (mixed, False)):
            c.observe_step(0.2, 1)
            c.observe_step(0.25, 1, beside_verify=flag)
        drafting.observe_step(0.2, 1)
        drafting.observe_step(0.2, 1)
    esr = drafting.snapshot()["esr"]
    assert esr > 1.8
    assert ctrl.snapshot()["esr"] == pytest.approx(esr, rel=0.02)
    assert mixed.snapshot()["esr"] > 1.1 * esr
    assert ctrl.snapshot()["beside_verify_kappa"] == pytest.approx(1.25, rel=0.02)
