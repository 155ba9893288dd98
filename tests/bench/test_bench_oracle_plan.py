import pytest

from rapid.bench.oracle_plan import plan_depth


def _plan(runs, step_s, wait, reused=0, kept=True, empty=False, max_depth=8):
    h = len(runs)
    return plan_depth(runs, [kept] * (h + max_depth), [empty] * h, reused, step_s, [wait] * (max_depth + 1), max_depth)[0]


def test_cheap_steps_draft_the_whole_run():
    # a step costs 1 ms against a 1 s wait: every accepted token is worth drafting (45 positions
    # are five rounds of 8 + 1; a horizon of 40 would make a first round of 3 as good)
    assert _plan([8] * 45, 0.001, 1.0) == 8
    assert 0 < _plan([3] + [8] * 45, 0.001, 1.0) <= 3  # never beyond the run that will be accepted


def test_a_step_as_dear_as_the_wait_keeps_rounds_short_when_the_branch_is_kept():
    # step = wait = 1 s: with one level kept, d = 1 takes 1 s for 2 tokens and keeps the next
    # one-level branch (2 tokens/s from then on); from u = 0 the myopic best-rate rule drafts 8
    # (9 tokens in 9 s beats 2 in 2 s), the plan drafts 1 to get into the 2-tokens-a-second cycle
    assert _plan([8] * 40, 1.0, 1.0, reused=1) == 1
    assert _plan([8] * 40, 1.0, 1.0, reused=0) == 1


def test_no_kept_branch_and_no_run_means_no_draft():
    assert _plan([0] * 10, 0.01, 0.1) == 0
    assert _plan([], 0.01, 0.1) == 0


def test_plan_beats_every_fixed_depth_on_its_own_model():
    """The plan's first depth, executed greedily round by round, covers the path no slower than
    any constant depth (on the plan's own deterministic model)."""
    import random

    rng = random.Random(0)
    runs = [rng.choice([0, 1, 2, 4, 8]) for _ in range(80)]
    kept = [rng.random() < 0.6 for _ in range(90)]
    step, wait, maxd = 0.012, [0.02] * 9, 8

    def walk(choose):
        j, u, t = 0, 0, 0.0
        while j < 60:
            d = min(choose(j, u), runs[j])
            k = min(maxd, -(-wait[d] // step))
            hit = kept[j + d] if d else False
            t += max(0, d - u) * step + (max(wait[d], k * step) if hit else wait[d])
            u = int(k) if hit else 0
            j += d + 1
        return t

    planned = walk(lambda j, u: plan_depth(runs[j:60], kept[j:60 + maxd], [False] * (60 - j), u, step, wait, maxd)[0])
    for d in range(maxd + 1):
        assert planned <= walk(lambda j, u, d=d: d) + 1e-12


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError):
        plan_depth([1], [True] * 9, [True], 0, 0.0, [0.1] * 9, 8)
    with pytest.raises(ValueError):
        plan_depth([1, 1], [True], [True, True], 0, 0.1, [0.1] * 9, 8)
