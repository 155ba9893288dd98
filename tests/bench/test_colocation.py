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


# ---------------------------------------------------------------------------------------------
# the tax as rapid sim fits and models it
from rapid.bench import sim  # noqa: E402
from rapid.bench.calibration import calibrate  # noqa: E402
from rapid.bench.colocation import fit_colocation, overlap_as_it_grows, steps_beside  # noqa: E402
from rapid.bench.contention import parse_schedule  # noqa: E402
from rapid.bench.netem import get_profile  # noqa: E402
from rapid.runtime.policies import POLICIES  # noqa: E402

SCHEDS = {"sustained": {"kind": "sustained", "intensity": 1.0},
          "burst:4:4": {"kind": "burst", "intensity": 1.0, "on_s": 4, "off_s": 4}}


def _t(i, verify_s, schedule="none", load=0.0, steps=0, nodes=4, policy="fixed", draft_s=0.2):
    """A traced round: 2 draft steps of 0.1 s, a 20 ms transport (10 ms each way)."""
    return {"policy": policy, "round": i, "tree_nodes": nodes, "verify_s": verify_s, "cloud_s": verify_s + 0.02,
            "proactive_steps": steps, "draft_steps": 2, "draft_s": draft_s, "load": load, "schedule": schedule,
            "set": "c4"}


def _alone(nodes):
    return 0.3


def test_each_schedule_s_phases_and_the_step_beside_are_fitted_apart():
    rounds = ([_t(i, 0.3) for i in range(1, 9)]
              + [_t(i, 0.36, "sustained", 1.0) for i in range(1, 9)]  # in the load: ×1.2
              + [_t(i, 0.39, "burst:4:4", 1.0) for i in range(1, 9)]  # ×1.3
              + [_t(i, 0.33, "burst:4:4", 0.0) for i in range(1, 9)]  # its quiet half: ×1.1
              + [_t(i, 0.9, "burst:4:4", 0.5) for i in range(1, 9)]  # half loaded: in neither phase
              # two 0.1 s branch steps from the send, 0.19 s of them inside an unloaded verify (it
              # starts 10 ms after the send), add 0.0475 s: κ = 0.25 (the burst's quiet half first
              # scaled by its own 1.1)
              + [_t(i, 0.3475, steps=2, policy="ipdg") for i in range(1, 9)]
              + [_t(i, 0.33 + 0.0475, "burst:4:4", 0.0, steps=2, policy="ipdg") for i in range(1, 9)]
              + [_t(i, 2.0, "sustained", 1.0, steps=2, policy="ipdg") for i in range(1, 9)]  # loaded: not κ's
              + [_t(0, 5.0)])  # round 0: left out
    fit = fit_colocation(rounds, _alone, SCHEDS)
    assert fit.verify_by_schedule == {"sustained": pytest.approx((1.2, 1.0)), "burst:4:4": pytest.approx((1.3, 1.1))}
    assert fit.load_tax == pytest.approx(0.25)  # (0.36 + 0.39) / 0.6 - 1, pooled over the loaded rounds
    assert fit.step_tax == pytest.approx(0.25) and fit.step_rounds == 16


def test_a_step_beside_the_verify_counts_only_inside_its_window():
    # 2 steps of 0.1 s from the send; the verify starts 10 ms after it and lasts 0.3 s
    assert steps_beside(_t(1, 0.3, steps=2)) == pytest.approx(0.19)
    assert steps_beside(_t(1, 0.05, steps=2)) == pytest.approx(0.05)  # clipped to a short verify
    assert steps_beside({**_t(1, 0.3), "catch_up_s": 0.04}) == pytest.approx(0.03)
    # a round that drafted nothing (a kept branch's tree): the controller's step time
    assert steps_beside({**_t(1, 0.3, steps=1), "draft_steps": 0, "draft_s": 0.0, "tau_cur": 0.15}) == pytest.approx(0.14)


def test_a_step_that_outlasts_the_verify_meets_what_it_added():
    assert overlap_as_it_grows(0.0, 0.1, 0.0, 1.0, 0.5) == pytest.approx(0.1)  # wholly inside
    assert overlap_as_it_grows(2.0, 3.0, 0.0, 1.0, 0.5) == 0.0  # after it
    # from 0.5 s, the window [0, 1] grows by 0.5 s per s beside it: it ends at 1.5 when o = 1.0
    o = overlap_as_it_grows(0.5, 3.0, 0.0, 1.0, 0.5)
    assert o == pytest.approx(1.0) and 1.0 + 0.5 * o == pytest.approx(0.5 + o)


def _cal_with_tax(canned, step_tax, by_schedule=None):
    from rapid.bench.traces import load_traces

    cal = calibrate(*load_traces([canned]))
    cal.step_tax, cal.verify_by_schedule, cal.load_tax = step_tax, by_schedule or {}, 0.0
    return cal


def test_the_sim_taxes_a_verify_by_the_steps_beside_it_on_one_host_only(canned):
    none, wan = parse_schedule("none"), get_profile("wan")
    free, taxed = _cal_with_tax(canned, 0.0), _cal_with_tax(canned, 0.5)
    run = {name: {k: sim.simulate(POLICIES[name], c, none, wan, tokens=96, seed=1)["edges"][0]
                  for k, c in (("free", free), ("taxed", taxed))} for name in ("fixed", "ipdg")}
    assert run["fixed"]["free"] == run["fixed"]["taxed"]  # no step beside its verify: nothing to tax
    assert run["ipdg"]["taxed"].wall_s > run["ipdg"]["free"].wall_s
    elsewhere = sim.simulate(POLICIES["ipdg"], taxed, none, wan, tokens=96, seed=1, colocated=False)["edges"][0]
    assert elsewhere == run["ipdg"]["free"]  # a cloud on its own machine pays none of it


def test_the_sim_takes_each_phase_s_verify_factor(canned):
    burst, wan = parse_schedule("burst:4:4"), get_profile("wan")
    plain = _cal_with_tax(canned, 0.0)
    quiet = _cal_with_tax(canned, 0.0, {"burst:4:4": (1.0, 1.5)})  # only its quiet half is slower
    loud = _cal_with_tax(canned, 0.0, {"burst:4:4": (1.5, 1.0)})
    wall = {k: sim.simulate(POLICIES["fixed"], c, burst, wan, tokens=96, seed=1)["edges"][0].wall_s
            for k, c in (("plain", plain), ("quiet", quiet), ("loud", loud))}
    assert wall["quiet"] > wall["plain"] and wall["loud"] > wall["plain"] and wall["quiet"] != wall["loud"]


def test_the_policy_cells_can_put_the_cloud_on_its_own_machine(canned):
    """``rapid sim --cloud-elsewhere``: the what-if of a deployment, no co-location tax: ipdg's
    branch steps no longer slow its verify; fixed, with nothing beside its verify, is unchanged."""
    from types import SimpleNamespace

    from rapid.bench.sim_report import _policy_cells

    cal = _cal_with_tax(canned, 0.5)

    def cell(elsewhere):
        a = SimpleNamespace(tokens=64, seeds=2, cloud_elsewhere=elsewhere)
        (row,) = _policy_cells({"c4": cal}, ["wan"], ["none"], ["c4"], ["fixed", "ipdg"], parse_schedule, a)
        return row["tok_s"]

    here, elsewhere = cell(False), cell(True)
    assert elsewhere["ipdg"] > here["ipdg"] and elsewhere["fixed"] == here["fixed"]
