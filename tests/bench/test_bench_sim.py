import pytest

from rapid.bench import calibration, sim
from rapid.bench.contention import parse_schedule
from rapid.bench.netem import get_profile
from rapid.bench.traces import load_traces
from rapid.runtime import caac, cost_caac, policies


@pytest.fixture
def cal(canned):
    rounds, runs, meta = load_traces([canned])
    return calibration.calibrate(rounds, runs, meta)


def test_calibration_reads_the_traces(cal):
    assert cal.slowdown == pytest.approx(2.0, rel=0.15)
    assert cal.verify_b == pytest.approx(0.01, rel=1e-6) and cal.verify_a == pytest.approx(0.05, rel=1e-6)
    assert cal.overhead_s == pytest.approx(0.002, abs=1e-6)
    assert len(cal.match_bits) > 100 and 0 < cal.p_accept < 1


def test_simulator_is_deterministic_with_a_seed(cal):
    args = (cal, parse_schedule("burst:1:1"), get_profile("wan"))
    a = sim.simulate(policies.POLICIES["rapid"], *args, tokens=96, seed=3)
    b = sim.simulate(policies.POLICIES["rapid"], *args, tokens=96, seed=3)
    c = sim.simulate(policies.POLICIES["rapid"], *args, tokens=96, seed=4)
    assert a["edges"][0] == b["edges"][0] and a["horizon_s"] == b["horizon_s"]
    assert a["edges"][0].tokens == 96
    assert c["horizon_s"] != a["horizon_s"]


@pytest.mark.parametrize("sched", ["none", "sustained", "burst:1:1"])
def test_oracle_bounds_every_policy(cal, sched):
    s, p = parse_schedule(sched), get_profile("wan")
    for seed in range(3):
        orc = sim.simulate(sim.ORACLE, cal, s, p, tokens=128, seed=seed)["edges"][0].tok_s
        for name, pol in policies.POLICIES.items():
            got = sim.simulate(pol, cal, s, p, tokens=128, seed=seed)["edges"][0].tok_s
            assert orc >= got, (sched, seed, name, got, orc)


def test_simulator_uses_the_runtime_objects(cal):
    assert sim.POLICIES is policies.POLICIES
    for name, pol in policies.POLICIES.items():
        e = sim._Edge(0, pol, cal, parse_schedule("none"), get_profile("lan"), 16, 0, 0.0, False,
                      sim.CoordinatorConfig(depth=4))
        assert e.policy is policies.POLICIES[name]
        want = cost_caac.CostAwareCAAC if pol.cost_aware else caac.CAAC if pol.adaptive_depth else caac.FixedDepth
        assert type(e.ctrl) is want
    assert sim.controller_for.__module__ == "rapid.runtime.controllers"  # the runtime's, not a copy


def test_cost_aware_policy_gets_the_sims_verify_model_and_rtt(cal):
    """As the coordinator: Ready's curve is the sim's verify model at the start-up sizes, each
    verdict brings verify_s, the tree size and the RTT; a longer RTT makes deeper trees pay."""
    pol = policies.POLICIES["rapid-cost"]
    e = sim._Edge(0, pol, cal, parse_schedule("none"), get_profile("lan"), 16, 0, 0.0, False,
                  sim.CoordinatorConfig(depth=4))
    assert e.ctrl.costs.verify.startup == {n: pytest.approx(cal.verify(n)) for n in sim.STARTUP_CURVE_NODES}
    from dataclasses import replace

    # a GPU cloud (flat verify) and a 5x faster edge (10 ms steps): the RTT decides
    gpu = replace(cal, verify_a=0.015, verify_b=0.0002, verify_table=None, step_s=[x / 5 for x in cal.step_s])
    mean = {}
    for prof in ("lan", "cellular"):
        depths = []
        for seed in range(3):
            r = sim.simulate(pol, gpu, parse_schedule("none"), get_profile(prof), tokens=256, seed=seed)
            depths += r["edges"][0].depths[10:]
        mean[prof] = sum(depths) / len(depths)
    assert mean["cellular"] > mean["lan"] + 0.5, mean


def test_many_edges_share_a_batched_cloud(cal):
    one = sim.simulate(policies.POLICIES["fixed"], cal, parse_schedule("none"), get_profile("lan"), 48, 0, edges=1)
    many = sim.simulate(policies.POLICIES["fixed"], cal, parse_schedule("none"), get_profile("lan"), 48, 0,
                        edges=32, max_batch=8)
    assert len(many["edges"]) == 32 and all(e.tokens == 48 for e in many["edges"])
    assert many["mean_batch"] > 1 and 0 < many["cloud_util"] <= 1.0 + 1e-9
    assert many["cloud_util"] > one["cloud_util"]


def test_replicas_share_the_load(cal):
    """Edges spread over verifier replicas: a saturated cloud gets faster, each replica less busy;
    one replica with no ingress cost is the single-process cloud."""
    args = (policies.POLICIES["fixed"], cal, parse_schedule("none"), get_profile("lan"), 48, 0)
    one = sim.simulate(*args, edges=64, max_batch=2)
    same = sim.simulate(*args, edges=64, max_batch=2, replicas=1)
    two = sim.simulate(*args, edges=64, max_batch=2, replicas=2)
    hop = sim.simulate(*args, edges=64, max_batch=2, replicas=2, ingress_s=0.05)
    assert one["horizon_s"] == same["horizon_s"]
    assert two["horizon_s"] < one["horizon_s"] and two["cloud_util"] < one["cloud_util"]
    assert hop["horizon_s"] > two["horizon_s"]  # the extra hop is paid on every round
    with pytest.raises(ValueError):
        sim.simulate(*args, replicas=0)


def test_sim_cli_writes_its_report(canned, tmp_path):
    from rapid.bench.cli import main_sim

    out = tmp_path / "sim"
    assert main_sim(["--traces", str(canned), "--out", str(out), "--seeds", "2", "--tokens", "48",
                     "--edges", "1,8", "--replicas", "1,2", "--ingress-ms", "1.5"]) == 0
    for f in ("sim.json", "sim.md", "scale.png"):
        assert (out / f).exists()
    md = (out / "sim.md").read_text()
    assert "Validation" in md and "Policies vs the oracle" in md and "oracle-load" in md
    assert "| replicas |" in md


def _rows(policy, drafted_accepted, planned=4, run="0"):
    """Round rows of one run: (draft_steps, accepted) per round."""
    return [{"policy": policy, "round": i, "depth": planned, "draft_steps": d, "accepted": a, "reused_depth": 0,
             "profile": "wan", "schedule": "none", "set": "c4", "prompt_id": run, "repeat": 0}
            for i, (d, a) in enumerate(drafted_accepted)]


def test_confidence_cut_model_counts_continue_decisions():
    from rapid.bench.edgellm_fit import fit_confidence_cut

    # cut right after the first miss every time: P(continue | miss) = 0, P(continue | match) = 1
    rows = _rows("edgellm", [(2, 1), (3, 2), (1, 0), (4, 4), (2, 1), (3, 2)])
    assert fit_confidence_cut(rows) == (0.0, 1.0)
    assert fit_confidence_cut(_rows("npdg", [(2, 1)] * 10)) is None  # no confidence-cut policy traced


def test_edgellm_in_the_simulator_cuts_at_the_calibrated_rate(cal):
    from dataclasses import replace

    s, p = parse_schedule("none"), get_profile("lan")
    pol = policies.POLICIES["edgellm"]
    never = sim.simulate(pol, replace(cal, cut_continue=(0.0, 0.0)), s, p, tokens=96, seed=0)["edges"][0]
    always = sim.simulate(pol, replace(cal, cut_continue=(1.0, 1.0)), s, p, tokens=96, seed=0)["edges"][0]
    # cutting after every first step leaves shallower trees (one step on top of reused levels)
    assert sum(never.depths) / len(never.depths) < sum(always.depths) / len(always.depths)
    assert always.rounds < never.rounds


def test_per_set_acceptance_replays_that_set(cal):
    from dataclasses import replace

    from rapid.bench.calibration import fit_acceptance

    all_hit = fit_acceptance(replace(cal), _rows("fixed", [(4, 4)] * 30))
    none_hit = fit_acceptance(replace(cal), _rows("fixed", [(4, 0)] * 30))
    assert all_hit.p_accept == 1.0 and none_hit.p_accept == 0.0
    s, p = parse_schedule("none"), get_profile("lan")
    hi = sim.simulate(policies.POLICIES["fixed"], all_hit, s, p, tokens=64, seed=0)["edges"][0]
    lo = sim.simulate(policies.POLICIES["fixed"], none_hit, s, p, tokens=64, seed=0)["edges"][0]
    assert hi.accepted == sum(hi.depths) and hi.depths[:-1] == [4] * (hi.rounds - 1) and lo.accepted == 0
    assert hi.depths[-1] == 3  # 60 tokens after 12 rounds: 3 levels and the bonus make the last 4
    assert hi.tok_s > lo.tok_s


def test_load_oracle_sits_between_policies_and_the_oracle(cal):
    s, p = parse_schedule("sustained"), get_profile("wan")
    for seed in range(3):
        orc = sim.simulate(sim.ORACLE, cal, s, p, tokens=128, seed=seed)["edges"][0].tok_s
        load = sim.simulate(sim.ORACLE_LOAD, cal, s, p, tokens=128, seed=seed)["edges"][0]
        assert load.tok_s <= orc
        assert len(set(load.depths)) >= 1 and all(1 <= d <= 8 for d in load.depths)


def test_prefill_and_warm_controller_are_modelled(cal):
    from dataclasses import replace

    s, p = parse_schedule("sustained"), get_profile("lan")
    pol = policies.POLICIES["rapid"]
    def wall(**kw) -> float:
        return sim.simulate(pol, replace(cal, **kw), s, p, tokens=48, seed=0)["edges"][0].wall_s

    factor = cal.slowdown_by_schedule.get("sustained", cal.slowdown)  # measured under that schedule
    assert "sustained" in cal.slowdown_by_schedule and factor == pytest.approx(2.0, rel=0.15)
    # drafted after Ready (traces before ahead_s): the prefill is on round 0's path, scaled by contention
    assert wall(prefill_s=1.0, draft_ahead=False) == pytest.approx(wall(prefill_s=0.0, draft_ahead=False) + 1.0 * factor,
                                                                   rel=1e-6)
    # drafted while the cloud prefills (the coordinator now): hidden behind a longer start-up...
    assert wall(prefill_s=1.0, draft_ahead=True, startup_s=5.0) == pytest.approx(
        wall(prefill_s=0.0, draft_ahead=True, startup_s=5.0), rel=1e-9)
    # ...and only its overrun counts past a short one
    short = wall(prefill_s=1.0, draft_ahead=True, startup_s=0.5)
    assert wall(prefill_s=0.0, draft_ahead=True, startup_s=0.5) < short < wall(prefill_s=1.0, draft_ahead=False, startup_s=0.5)
    e = sim._Edge(0, pol, replace(cal, warm_controller=True), s, p, 16, 0, 0.0, False, sim.CoordinatorConfig())
    snap = e.ctrl.snapshot()
    assert snap["steps"] >= e.ctrl.config.n_warmup and snap["rounds"] == 0


def test_prompt_set_refit_takes_that_sets_startup(canned, cal):
    from dataclasses import replace

    from rapid.bench.calibration import fit_prompt_set

    rounds, runs, _ = load_traces([canned])
    longer = [dict(r, wall_s=r["wall_s"] + 5.0) for r in runs]  # e.g. a longer prompt to prefill
    refit = fit_prompt_set(replace(cal), rounds, longer)
    assert refit.startup_s == pytest.approx(cal.startup_s + 5.0, abs=1e-9)
    assert refit.step_s == cal.step_s and refit.verify_b == cal.verify_b  # device timing untouched


def test_chain_branch_steps_cost_one_token(cal):
    """tau x tokens: a width-1 branch step costs 1/tokens_per_step of a tree step."""
    from dataclasses import replace

    s, p = parse_schedule("none"), get_profile("wan")
    chain = policies.POLICIES["edgellm"]
    tree = replace(chain, chain_branch=False)
    c = replace(cal, cut_continue=None)
    a = sim.simulate(chain, c, s, p, tokens=64, seed=0)["edges"][0]
    b = sim.simulate(tree, c, s, p, tokens=64, seed=0)["edges"][0]
    assert cal.tokens_per_step == 2 and a.wall_s < b.wall_s


def test_interruptible_branch_asks_the_runtime_gate(cal, monkeypatch):
    """As the coordinator: an interruptible branch starts a step only when the runtime's
    ``BranchGate`` says it pays. With steps far longer than the wait and no branch ever kept, the
    gate stops it once it knows both times; a branch that never asks runs a step every round."""
    from dataclasses import replace

    from rapid.runtime.branch_gate import BranchGate

    slow = replace(cal, step_s=[20 * s for s in cal.step_s], hits_by_policy={**cal.hits_by_policy, "rapid": (0.0, 0.0)})
    args = (policies.POLICIES["rapid"], slow, parse_schedule("none"), get_profile("lan"))
    e = sim._Edge(0, policies.POLICIES["rapid"], slow, parse_schedule("none"), get_profile("lan"), 16, 0, 0.0, False,
                  sim.CoordinatorConfig(depth=4))
    assert type(e.gate) is BranchGate
    gated = sim.simulate(*args, tokens=64, seed=0)["edges"][0]
    monkeypatch.setattr(BranchGate, "start", lambda self, elapsed_s, step=1, may_end=False: True)
    ungated = sim.simulate(*args, tokens=64, seed=0)["edges"][0]
    assert gated.hits == ungated.hits == 0
    assert gated.discarded <= 2 < gated.rounds // 2 <= ungated.discarded
    assert gated.wall_s < ungated.wall_s


def test_a_draft_that_costs_more_than_it_buys_is_skipped_as_the_runtime_skips_it(cal):
    """Steps 10x the traced ones under a sustained 3x load: the runtime's CostAwareCAAC, its gate
    shut, sends rounds that draft nothing (depth 0, probing now and then), each carrying the
    replayed lookup chain alone, and beats the same controller told never to skip
    (``max_undrafted=0``); rapid (CAAC) keeps drafting; without the load a round is skipped only
    where that beats drafting by ``open_skip_margin`` (10x steps: it does; a margin nothing reaches:
    nothing is skipped). With
    a carried controller (the traces say the bench carried it) the measured generation starts
    where a previous one left the controller: undrafted from its first round."""
    from dataclasses import replace

    slow = replace(cal, step_s=[10 * s for s in cal.step_s], slowdown_by_schedule={"sustained": 3.0},
                   warm_controller=True)  # as rapid bench: the baseline learnt without the load
    p = get_profile("lan")

    def run(policy, sched, **kw):
        return sim.simulate(policies.POLICIES[policy], slow, parse_schedule(sched), p, tokens=96, seed=0, **kw)["edges"][0]

    skip, free = run("rapid-cost", "sustained"), run("rapid-cost", "none")
    strict = run("rapid-cost", "none", config=sim.CoordinatorConfig(depth=4, cost=cost_caac.CostConfig(
        open_skip_margin=1e9)))
    never = run("rapid-cost", "sustained", config=sim.CoordinatorConfig(depth=4, cost=cost_caac.CostConfig(max_undrafted=0)))
    assert skip.depths.count(0) >= len(skip.depths) // 2 and 0 < skip.depths.count(0) < len(skip.depths)
    # (the last round may have one token left: it drafts nothing whatever the policy, round_depth)
    assert min(never.depths[:-1]) >= 1 and min(run("rapid", "sustained").depths[:-1]) >= 1
    assert min(strict.depths[:-1]) >= 1 and free.depths.count(0) > 0
    assert skip.tok_s > never.tok_s
    # the controller carried from a previous generation, as rapid bench carries it: no cold start
    assert skip.depths[0] == 0 and run("rapid-cost", "sustained").depths == skip.depths
    cold = sim.simulate(policies.POLICIES["rapid-cost"], replace(slow, warm_controller=False),
                        parse_schedule("sustained"), p, tokens=96, seed=0)["edges"][0]
    assert cold.depths[0] > 0


def test_a_cells_simulated_throughput_pools_its_generations_as_the_report_pools_prompts(cal):
    # the measured side pools a cell's prompts (tokens over wall seconds); the simulated side must
    # too, or a cell mixing quick and slow generations reads as a simulator error
    args = (policies.POLICIES["rapid"], cal, parse_schedule("burst:1:1"), get_profile("wan"), 48)
    runs = [sim.simulate(*args, seed=s)["edges"][0] for s in range(4)]
    assert len({round(r.tok_s, 6) for r in runs}) > 1  # the generations differ, so the estimators do
    pooled = sum(r.tokens for r in runs) / sum(r.wall_s for r in runs)
    assert sim.sim_tok_s(*args, 4) == pytest.approx(pooled, rel=1e-12)
    assert sim.sim_tok_s(*args, 4) != pytest.approx(sum(r.tok_s for r in runs) / 4, rel=1e-9)
