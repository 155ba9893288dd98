"""The simulator's calibration from round traces (rapid.bench.calibration): what each traced shape
makes the simulator do. Rows are built by hand so each check fails when its fit is wrong."""

from dataclasses import replace

import pytest

from rapid.bench import calibration, sim
from rapid.bench.calibration import calibrate, fit_acceptance
from rapid.bench.contention import parse_schedule
from rapid.bench.netem import get_profile
from rapid.bench.traces import load_traces
from rapid.runtime import policies


def _row(i, policy="fixed", depth=4, steps=4, tree_depth=4, accepted=0, run="0", **extra):
    return {"policy": policy, "round": i, "depth": depth, "draft_steps": steps, "tree_depth": tree_depth,
            "tree_nodes": 2 * tree_depth, "accepted": accepted, "reused_depth": 0, "draft_s": 0.1 * steps,
            "verify_s": 0.05, "cloud_s": 0.08, "wait_s": 0.08, "profile": "wan", "schedule": "none", "set": "c4",
            "prompt_id": run, "repeat": 0, "load": 0.0, "t_start": i, "t_end": i + 0.5, **extra}


@pytest.fixture
def cal(canned):
    return calibrate(*load_traces([canned]))


def _sim(policy, cal, tokens=64):
    return sim.simulate(policies.POLICIES[policy], cal, parse_schedule("none"), get_profile("lan"),
                        tokens=tokens, seed=0)["edges"][0]


def test_a_cut_tree_accepted_whole_is_not_a_rejection(cal):
    """Trees cut to 2 of 4 drafted levels and accepted whole: no zero in the replay (the third
    level was never sent), and the simulator sends 2 levels for a drafted 4."""
    rows = [_row(i, tree_depth=2, accepted=2) for i in range(30)]
    fit = fit_acceptance(replace(cal), rows)
    assert fit.p_accept == 1.0 and 0 not in fit.match_bits
    assert fit.levels(4, "fixed") == 2 and fit.levels(3, "fixed") == 3  # untraced: as drafted
    res = _sim("fixed", fit)
    # every round accepts the levels it sends: 2 of a drafted 4; the last, capped at 3 by the 4 tokens
    # left, sends 3 (untraced: as drafted)
    assert res.accepted == sum(fit.levels(d, "fixed") for d in res.depths) and res.depths[-1] == 3


def test_a_lookup_chain_reaches_past_the_drafted_depth(cal):
    """Depth-1 rounds whose lookup chain sent 6 levels and had 5 accepted: the replay offers that
    reach, so a simulated depth-1 round accepts more than one token; without it, at most one."""
    rows = [_row(i, depth=1, steps=1, tree_depth=6, accepted=5) for i in range(30)]
    fit = fit_acceptance(replace(cal), rows)
    assert fit.lookup_reach[:7] == [6, 5, 4, 3, 2, 1, 6]  # counting down along the accepted run
    no_lookup = fit_acceptance(replace(cal), [dict(r, tree_depth=1, accepted=1) for r in rows])
    assert not any(no_lookup.lookup_reach)
    fixed1 = replace(policies.POLICIES["fixed"])
    conf = sim.CoordinatorConfig(depth=1)
    s, p = parse_schedule("none"), get_profile("lan")
    far = sim.simulate(fixed1, fit, s, p, tokens=64, seed=0, config=conf)["edges"][0]
    near = sim.simulate(fixed1, no_lookup, s, p, tokens=64, seed=0, config=conf)["edges"][0]
    assert far.accepted / far.rounds > 2.0 and near.accepted <= near.rounds


def test_a_chain_no_deeper_than_the_draft_is_replayed_where_traced(cal):
    """Depth-4 rounds with a 3-level lookup chain and 3 accepted: older traces (no
    ``lookup_depth``) cannot tell the chain from the draft, so the replay offers no chain; traced,
    it offers 3 levels counting down along the run, which a round that drafts nothing sends."""
    rows = [_row(i, tree_depth=4, accepted=3, lookup_depth=3) for i in range(30)]
    fit = fit_acceptance(replace(cal), rows)
    assert fit.lookup_reach[:5] == [3, 2, 1, 0, 3]
    older = fit_acceptance(replace(cal), [{k: v for k, v in r.items() if k != "lookup_depth"} for r in rows])
    assert not any(older.lookup_reach)
    assert fit.reach(0) == 3 and older.reach(0) == 0  # what a simulated depth-0 round sends there


def test_a_chain_sent_alone_is_replayed_where_it_was_found_for_every_policy(cal):
    """rapid-cost drafted nothing and sent a 5-level lookup chain, accepted whole, from position 2
    of the prompt (after two 1-token rounds); fixed, drafting depth 1 on the same prompt, found no
    chain at its round starts (positions 0, 2, 4, ...). The replay (fixed's bits) offers the
    chain at position 2 counting down along it, as a simulated depth-0 round would find it; the
    same rows with the chain round on another prompt offer nothing there. Before, rounds that
    drafted nothing were left out of the replay, chains and all."""
    fixed = [_row(i, depth=1, steps=1, tree_depth=1, accepted=1, lookup_depth=0, emitted=2) for i in range(12)]
    alone = [_row(0, "rapid-cost", depth=0, steps=0, tree_depth=0, accepted=0, lookup_depth=0, emitted=1),
             _row(1, "rapid-cost", depth=0, steps=0, tree_depth=0, accepted=0, lookup_depth=0, emitted=1),
             _row(2, "rapid-cost", depth=0, steps=0, tree_depth=5, accepted=5, lookup_depth=5, emitted=6)]
    fit = fit_acceptance(replace(cal), fixed + alone)
    assert fit.lookup_reach[:9] == [0, 0, 5, 4, 3, 2, 1, 0, 0]
    assert fit.reach(2) == 5 and fit.reach(3) == 4
    elsewhere = fit_acceptance(replace(cal), fixed + [dict(r, prompt_id="1") for r in alone])
    assert not any(elsewhere.lookup_reach[:24])  # prompt 0's positions; prompt 1's own run keeps its chain
    assert elsewhere.replay.starts == [0, 24] and elsewhere.lookup_reach[24 + 2] == 5


def test_the_replay_is_position_aligned_and_a_generation_starts_where_a_traced_one_did(cal):
    """Every traced round adds one bit per token it emitted, a round that sent nothing (rapid-cost
    at depth 0, no chain) a drawn one, so ``replay.starts[k] + p`` is position ``p`` of the k-th
    traced run. Here each run opens with two hard positions (rejected), then a long accepted
    stretch: a simulated generation starts at a run start, so its first round accepts nothing;
    before, the offset was anywhere in the replay and most first rounds landed in the stretch."""
    def run(k, policy="fixed"):
        return [_row(0, policy, depth=1, steps=1, tree_depth=1, accepted=0, emitted=1, repeat=k),
                _row(1, policy, depth=0, steps=0, tree_depth=0, accepted=0, emitted=1, repeat=k),
                _row(2, policy, depth=4, steps=4, tree_depth=4, accepted=4, emitted=5, repeat=k),
                _row(3, policy, depth=4, steps=4, tree_depth=4, accepted=4, emitted=5, repeat=k)]
    fit = fit_acceptance(replace(cal), [r for k in range(5) for r in run(k)])
    assert fit.replay.starts == [0, 12, 24, 36, 48] and len(fit.match_bits) == 60  # 12 positions a run
    assert [fit.match_bits[s] for s in fit.replay.starts] == [0] * 5
    assert [fit.match_bits[s + 2:s + 6] for s in fit.replay.starts] == [[1, 1, 1, 1]] * 5
    for seed in range(10):  # 5 tokens: position 0 rejected, then 4 levels at most: two rounds
        e = sim.simulate(policies.POLICIES["fixed"], fit, parse_schedule("none"), get_profile("lan"),
                         tokens=5, seed=seed)["edges"][0]
        assert e.rounds == 2 and e.accepted <= 3


def test_the_bit_after_a_whole_tree_is_read_where_another_round_saw_it(cal):
    """A depth-1 tree accepted whole says nothing of the next position; a depth-3 tree on the same
    prompt (another policy: every one emits the same tokens) was rejected there. The replay takes
    that rejection instead of drawing the next bit with the pooled acceptance (~0.95 here, so
    nearly always a 1); on a prompt nothing else covered, it still draws."""
    deep = [_row(0, depth=3, steps=3, tree_depth=3, accepted=1, emitted=2)]
    whole = [_row(0, "rapid", depth=1, steps=1, tree_depth=1, accepted=1, emitted=2, repeat=k) for k in range(20)]
    fit = fit_acceptance(replace(cal), deep + whole)
    assert fit.match_bits[:2] == [1, 0] and fit.match_bits[2::2] == [1] * 20
    assert fit.match_bits[3::2] == [0] * 20  # seen rejected at position 1 of prompt 0
    drawn = fit_acceptance(replace(cal), deep + [dict(r, prompt_id="1") for r in whole])
    assert sum(drawn.match_bits[3::2]) >= 15  # nothing seen there: drawn at ~0.95


def test_draft_steps_follow_the_traces(cal):
    """Depth-4 rounds that ran 3 steps (level 1 free): the simulator drafts 3 a round, not 4."""
    fit = fit_acceptance(replace(cal), [_row(i, steps=3, tree_depth=4, accepted=1) for i in range(30)])
    assert fit.steps(4, "fixed") == 3.0 and fit.steps(2, "fixed") == 2.0  # untraced: as planned
    res = _sim("fixed", fit)
    assert res.draft_steps == sum(3 if d == 4 else d for d in res.depths)  # the last round: the tokens left


def test_a_non_interruptible_chain_branch_is_calibrated_from_its_waits():
    """EdgeLLM's chain branch ran 6 steps of 0.12 s (the tree steps 0.1 s) past a 0.2 s cloud."""
    rows = [_row(i, policy="edgellm", steps=2, accepted=1, proactive_steps=6, wait_s=0.72, cloud_s=0.2)
            for i in range(12)]
    rows += [_row(i, policy="fixed", run="1", accepted=1) for i in range(12)]
    cal = calibrate(rows, [], {})
    assert cal.chain_step == pytest.approx(1.2)
    assert cal.branch_steps_by_policy == {"edgellm": 6.0}
    assert cal.step_scale(1) == pytest.approx(1.2) and cal.step_scale(2) == 1.0
    res = _sim("edgellm", replace(cal, cut_continue=None), tokens=48)
    assert res.draft_steps >= res.branches * 6  # every branch ran its traced six steps


def test_a_non_interruptible_tree_branch_runs_its_traced_steps_per_prompt_set():
    """npdg's tree branch ran past its depth of 4 (the first steps feed the roots): 7 steps a round
    on one set, 5 on another. The replay runs that many per set, not the depth."""
    rows = [_row(i, policy="npdg", accepted=4, proactive_steps=7, proactive_hit=True, run="0")
            for i in range(12)]
    rows += [_row(i, policy="npdg", accepted=1, proactive_steps=5, run="1") | {"set": "mtbench"}
             for i in range(12)]
    cal = calibrate(rows, [], {})
    assert cal.branch_steps_by_policy == {"npdg": 6.0}
    per_set = calibration.fit_prompt_set(replace(cal), [r for r in rows if r["set"] == "c4"], [])
    assert per_set.branch_steps_by_policy == {"npdg": 7.0}
    res = _sim("npdg", replace(per_set, cut_continue=None), tokens=48)
    assert res.draft_steps >= res.branches * 7  # every branch ran its traced seven steps


def test_one_loaded_schedule_is_its_own_reference():
    """A trace with sustained load only (no uncontended round): its steps are the step samples
    and the schedule's slowdown is 1, not the 0.05 s default scaled by a guess."""
    rows = [_row(i, accepted=1, schedule="sustained", load=1.0, draft_s=1.2) for i in range(1, 20)]
    meta = {"schedules": {"sustained": {"kind": "sustained", "intensity": 1.0}}}
    cal = calibrate(rows, [], meta)
    assert cal.step_s == [0.3] * 19 and cal.slowdown_by_schedule == {"sustained": 1.0}
    assert cal.step_reference.startswith("its own loaded rounds")


def test_warmup_rounds_are_the_reference_of_a_loaded_only_trace(tmp_path):
    """Sustained load only, but the bench's uncontended warm-up recorded (warmup.jsonl): its steps
    are the reference, so the schedule's slowdown is measured (0.3 / 0.1 s), not assumed 1."""
    import json

    rows = [_row(i, accepted=1, schedule="sustained", load=1.0, draft_s=1.2) for i in range(1, 20)]
    warm = [_row(i, accepted=1) for i in range(0, 6)]  # round 0 (it holds the prefill) is left out
    meta = {"schedules": {"sustained": {"kind": "sustained", "intensity": 1.0}}}
    for name, data in (("rounds.jsonl", rows), ("warmup.jsonl", warm), ("runs.jsonl", [])):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in data))
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    rounds, runs, got = load_traces([tmp_path])
    assert rounds == rows and got["warmup_rounds"] == warm
    cal = calibrate(rounds, runs, got)
    assert cal.step_s == pytest.approx([0.1] * 5) and cal.step_reference.startswith("warm-up")
    assert cal.slowdown_by_schedule == {"sustained": pytest.approx(3.0)}


def test_a_cost_aware_controller_is_told_the_replayed_chain_as_the_coordinator_tells_it(cal):
    """A 6-level chain at position 0, accepted 5 deep: the simulated edge's outlook is the
    drafter's, each level at p^k with the request's LookupStats (prior 0.5), none below the traced
    min_p (0.5^6 < 0.03: 5 levels); a chain accepted whole raises p, one missed early lowers it."""
    rows = [_row(0, depth=1, steps=1, tree_depth=6, accepted=5, lookup_depth=6, emitted=6, repeat=k)
            for k in range(3)]
    fit = replace(fit_acceptance(replace(cal), rows), min_p=0.03)
    edge = sim._Edge(0, policies.POLICIES["rapid-cost"], fit, parse_schedule("none"), get_profile("lan"), 24,
                     0, 0.0, False, sim.CoordinatorConfig())
    assert edge.lookup_outlook() == ([0.5 ** k for k in range(1, 6)], 5)
    edge.observe_chain(6)
    learnt = edge.lookup.p
    assert learnt > 0.5 and edge.lookup_outlook()[0][0] == learnt
    edge.observe_chain(1)
    assert edge.lookup.p < learnt


def test_a_carried_controller_starts_from_the_previous_generation_s_prompts(cal):
    """As ``rapid bench`` carries each policy's controller across its generations, the throwaway
    generation before the measured one replays ``previous`` (the bench's previous prompt set) when
    given: rapid-cost's carried reach then opens the measured generation deep after a set whose
    trees were accepted whole, and at depth 0-1 after one whose trees were all rejected."""
    warm = replace(cal, warm_controller=True)
    easy = fit_acceptance(replace(warm), [_row(i, accepted=4, emitted=5, repeat=k)
                                          for k in range(3) for i in range(6)])
    hard = fit_acceptance(replace(warm), [_row(i, accepted=0, emitted=1, repeat=k)
                                          for k in range(3) for i in range(24)])
    mid = fit_acceptance(replace(warm), [_row(i, accepted=i % 3, emitted=i % 3 + 1, repeat=k)
                                         for k in range(3) for i in range(12)])
    args = (policies.POLICIES["rapid-cost"], mid, parse_schedule("none"), get_profile("wan"))
    for seed in range(3):
        assert sim.simulate(*args, tokens=24, seed=seed, previous=easy)["edges"][0].depths[0] >= 4
        assert sim.simulate(*args, tokens=24, seed=seed, previous=hard)["edges"][0].depths[0] <= 1


def test_the_reference_step_is_the_schedule_free_cells_and_a_burst_s_quiet_half_is_its_own():
    """Unloaded steps of a burst schedule ran 20 % slower than the schedule-free cells' (Zen 3,
    2026-12-07: drift or the load's after-effects): the reference is the schedule-free steps, and
    the burst's quiet half gets its own slowdown, so the simulator steps as slowly there."""
    meta = {"schedules": {"burst:4:4": {"kind": "burst", "intensity": 1.0, "on_s": 4, "off_s": 4}}}
    rows = ([_row(i) for i in range(1, 13)]  # 0.1 s a step
            + [_row(i, schedule="burst:4:4", draft_s=0.48) for i in range(1, 13)]  # quiet: 0.12 s
            + [_row(i, schedule="burst:4:4", load=1.0, draft_s=0.96) for i in range(1, 13)])  # loaded: 0.24 s
    cal = calibrate(rows, [], meta)
    assert sorted(set(cal.step_s)) == [pytest.approx(0.1)]
    assert cal.slowdown_by_schedule == {"burst:4:4": pytest.approx(2.4)}
    assert cal.idle_slowdown_by_schedule == {"burst:4:4": pytest.approx(1.2)}
    e = sim._Edge(0, policies.POLICIES["fixed"], cal, parse_schedule("burst:4:4"), get_profile("lan"), 16, 0, 0.0,
                  False, sim.CoordinatorConfig(depth=4))
    assert e.factor(1.0) == pytest.approx(2.4) and e.factor(5.0) == pytest.approx(1.2)


def test_a_kept_branch_supplies_the_levels_traced_for_its_steps(cal):
    """A tree branch's roots share its steps, so a kept branch of 3 steps supplied 1.6-2.0 levels
    on a Zen 3, not 3: the calibration keeps the traced mean per policy and step count, and the
    simulator's kept branch supplies that many (it drafts the rest)."""
    rows = [_row(i, policy="ipdg", proactive_steps=3, proactive_hit=True, reused_depth=1 + i % 2)
            for i in range(1, 9)] + [_row(9, policy="ipdg", proactive_steps=5, proactive_hit=False, reused_depth=0)]
    fit = calibrate(rows, [], {})
    assert fit.reused_by_policy == {"ipdg": {3: pytest.approx(1.5)}}
    assert fit.reused(3, 4, "ipdg") == pytest.approx(1.5) and fit.reused(3, 1, "ipdg") == 1.0
    assert fit.reused(5, 4, "ipdg") == 4.0 and fit.reused(2, 4, "rapid") == 2.0  # untraced: its steps
    traced = replace(cal, reused_by_policy={"ipdg": {k: 0.0 for k in range(1, 9)}})
    free = _sim("ipdg", replace(cal, reused_by_policy={}))
    assert free.hits > 0 and _sim("ipdg", traced).draft_steps > free.draft_steps


def test_a_branch_runs_until_its_root_has_the_levels_it_aims_at(cal):
    """The runtime's branch stops once its best root has the levels the controller asked for
    (``Coordinator._branch``), and a root of the second wave gets its first level from the second
    step: where 3 steps supplied 2.0 levels, 2 levels take 3 steps, not 2 (the sim ran 2, and its
    kept branches on humaneval handed over 2.7 levels against 3.9 measured, `amx-vsar128-curve`)."""
    fit = replace(cal, reused_by_policy={"rapid": {1: 0.3, 2: 1.1, 3: 2.0, 4: 3.1}})
    assert [fit.steps_for(n, "rapid") for n in range(5)] == [0, 2, 3, 4, 5]  # 5: past the traced steps
    assert fit.steps_for(3, "fixed") == 3  # untraced: a level a step
    never = replace(cal, reused_by_policy={"rapid": {k: 0.0 for k in range(1, 9)}})
    assert never.steps_for(2, "rapid") == 9  # bounded: past the table, a level a step


def test_kept_rates_are_split_as_the_simulator_reads_them():
    """A verdict that accepted every planned level and went on into a lookup chain is a fully
    accepted round for the kept-branch rates, in the calibration and in the simulator (which
    called it partial, and read the partial rate, 0.32 against 0.91 on humaneval)."""
    from rapid.bench import sim_cloud

    assert calibration.fully_accepted(4, 4) and calibration.fully_accepted(9, 4)
    assert not calibration.fully_accepted(3, 4) and not calibration.fully_accepted(0, 0)
    assert sim_cloud.fully_accepted is calibration.fully_accepted
    rows = [_row(i, policy="ipdg", accepted=6, proactive_steps=2, proactive_hit=True) for i in range(1, 5)] + \
        [_row(i, policy="ipdg", accepted=2, proactive_steps=2, proactive_hit=False) for i in range(5, 9)]
    fit = calibrate(rows, [], {})
    assert fit.p_hit_full == 1.0 and fit.p_hit_part == 0.0
