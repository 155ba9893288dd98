"""The rounds a simulated generation replays where it follows a traced one of its own policy
(rapid.bench.round_replay): which traced generation it starts at, and which traced round a
simulated round takes its steps and tree from. Rows are built by hand, as in test_calibration."""

from dataclasses import replace

import pytest

from rapid.bench import sim
from rapid.bench.calibration import calibrate, fit_acceptance
from rapid.bench.contention import parse_schedule
from rapid.bench.netem import get_profile
from rapid.bench.round_replay import RoundReplay, TracedRound
from rapid.bench.sim_report import read_traced_folder
from rapid.bench.traces import group_runs, load_traces
from rapid.runtime import policies


def _row(i, policy="fixed", depth=4, steps=4, tree_depth=4, accepted=0, schedule="none", **extra):
    return {"policy": policy, "round": i, "depth": depth, "draft_steps": steps, "tree_depth": tree_depth,
            "tree_nodes": 2 * tree_depth, "accepted": accepted, "reused_depth": 0, "draft_s": 0.1 * steps,
            "verify_s": 0.05, "cloud_s": 0.08, "wait_s": 0.08, "profile": "wan", "schedule": schedule, "set": "c4",
            "prompt_id": "0", "repeat": 0, "load": 0.0, "t_start": i, "t_end": i + 0.5, "emitted": accepted + 1,
            **extra}


@pytest.fixture
def cal(canned):
    return calibrate(*load_traces([canned]))


def _sim(policy, cal, schedule="none", tokens=24, seed=0):
    return sim.simulate(policies.POLICIES[policy], cal, parse_schedule(schedule), get_profile("lan"),
                        tokens=tokens, seed=seed)["edges"][0]


def test_a_generation_starts_at_its_policy_s_traced_run_under_its_schedule_where_there_is_one():
    replay = RoundReplay()
    for index, run in enumerate([("fixed", "none"), ("rapid", "none"), ("fixed", "sustained")]):
        replay.add_start(24 * index, *run)
    assert replay.starts_for("fixed", "sustained") == [48]
    assert replay.starts_for("fixed", "burst:4:4") == [0, 48]  # its policy's, under any schedule
    assert replay.starts_for("caac", "none") == [0, 24, 48]  # untraced policy (or an oracle): any
    assert replay.starts_for(None) == [0, 24, 48]


def test_a_round_follows_a_traced_one_only_with_the_same_plan():
    replay = RoundReplay(rounds={6: TracedRound("fixed", 4, 0, 3, 2, 5)})
    assert replay.at(6, "fixed", 4, 0) == TracedRound("fixed", 4, 0, 3, 2, 5)
    assert replay.at(6, "fixed", 3, 0) is None  # another depth
    assert replay.at(6, "fixed", 4, 1) is None  # levels kept from a branch
    assert replay.at(6, "rapid", 4, 0) is None and replay.at(7, "fixed", 4, 0) is None


def test_a_policy_replays_its_own_bits_not_another_s(cal):
    """Fixed's narrow depth-4 trees were rejected at every position of the prompt; rapid's wide
    depth-1 trees accepted each one (a tree's first level is its widest: the bits depend on the
    tree). A simulated fixed generation reads fixed's bits: every round accepts nothing. Before,
    it started at any traced generation, rapid's too, and accepted tokens fixed never did."""
    fixed = [_row(i, tree_depth=1, accepted=0) for i in range(24)]
    rapid = [_row(i, "rapid", depth=1, steps=1, tree_depth=1, accepted=1) for i in range(12)]
    fit = fit_acceptance(replace(cal), rapid + fixed)
    for seed in range(6):
        e = _sim("fixed", fit, seed=seed)
        assert e.accepted == 0 and e.rounds == 24


def test_a_policy_replays_its_runs_under_the_simulated_schedule(cal):
    """The same policy under load cut its trees to 1 level and accepted nothing; without load it
    sent 4 levels and accepted 3 (a timing-dependent send cut): each simulated schedule replays
    its own traced generation."""
    loaded = [_row(i, steps=2, tree_depth=1, accepted=0, schedule="sustained") for i in range(24)]
    idle = [_row(i, tree_depth=4, accepted=3) for i in range(6)]
    fit = fit_acceptance(replace(cal), idle + loaded)
    for seed in range(4):
        assert _sim("fixed", fit, "sustained", seed=seed).accepted == 0
        assert _sim("fixed", fit, "none", seed=seed).accepted == 18


def test_a_round_that_follows_its_traced_twin_replays_its_steps_and_tree(cal):
    """Fixed at depth 4 ran, by position, 2 steps and sent 1 level (accepted whole), then 4 steps
    and 4 levels (3 accepted), and so on; at the end, 3 tokens from the end, depth 3. A simulated
    fixed generation follows it round for round: 8 rounds, 16 accepted, 23 steps. Before, every
    round took the medians (4 levels, 3 steps drawn at random) and read a drawn bit past the
    traced 1-level tree."""
    a = dict(steps=2, tree_depth=1, accepted=1)  # emits 2
    b = dict(steps=4, tree_depth=4, accepted=3)  # emits 4
    shapes = [a, b, a, b, a, b, a, dict(depth=3, steps=3, tree_depth=3, accepted=3)]
    traced = [_row(i, **shape, repeat=k) for k in range(3) for i, shape in enumerate(shapes)]
    fit = fit_acceptance(replace(cal), traced)
    for seed in range(6):
        e = _sim("fixed", fit, seed=seed)
        assert (e.rounds, e.accepted, e.draft_steps) == (8, 16, 23)


def test_folders_pooled_keep_their_generations_apart(canned, tmp_path):
    """Two runs of one bench command share every key field; pooled (``rapid sim --traces A
    --traces B``) each generation stays its own, so the replay has twice the run starts, each as
    long as one generation. Before, their rounds merged under one key, two of each round number."""
    twin = tmp_path / "twin"
    twin.mkdir()
    for name in ("meta.json", "rounds.jsonl", "runs.jsonl"):
        (twin / name).write_bytes((canned / name).read_bytes())
    one = read_traced_folder(canned)[1]
    both = one + read_traced_folder(twin)[1]
    assert len(group_runs(both)) == 2 * len(group_runs(one))
    single, pooled = calibrate(one, [], {}), calibrate(both, [], {})
    assert len(pooled.replay.starts) == 2 * len(single.replay.starts)
    assert pooled.match_bits[:len(single.match_bits)] == single.match_bits
