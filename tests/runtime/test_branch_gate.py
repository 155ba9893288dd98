"""rapid.runtime.branch_gate: when an interruptible branch starts its next step (pure), and the
coordinator asking it before every branch step of a real (tiny) draft."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ipdg import CountingEngine, FlagLink  # noqa: E402  (beside this file)

from rapid.core.sampling import SamplingParams
from rapid.runtime.branch_gate import CATCH_UP_EVERY, BranchGate
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig, controller_for
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


def gate(cloud: float, step: float, p: float | None) -> BranchGate:
    g = BranchGate()
    g.observe_cloud(cloud)
    g.observe_step(step)
    if p is not None:
        g.p_kept = [p, p]
    return g


def test_the_rule_by_hand():
    g = gate(0.4, 0.3, 0.5)
    assert g.start(0.0)  # 0.3 <= 0.4: ends before the verdict
    assert g.start(0.1)  # ends at it
    # at t = 0.3: overlap 0.1, overrun 0.2; p = 0.5: 0.05 < 0.1 -> no
    assert not g.start(0.3)
    g.p_kept = [0.7, 0.7]  # 0.07 >= 0.06 -> yes
    assert g.start(0.3)
    assert not gate(0.4, 0.3, 0.99).start(0.5)  # overdue: only a certain branch starts a step
    assert gate(0.4, 0.3, 1.0).start(0.5)


def test_unknown_costs_start_every_step_and_the_prior_stands_in_for_p():
    assert BranchGate().start(10.0)
    assert gate(0.4, 0.0, None).start(10.0)
    g = gate(0.4, 0.3, None)
    assert g.p(0) == g.p(1) == g.prior
    g.observe_kept(0)
    assert g.p(0) == g.p(1) == 1.0
    g.observe_kept(None)
    assert g.p(0) == g.p(1) == pytest.approx(0.7)
    with pytest.raises(ValueError):
        BranchGate(alpha=0.0)


def test_a_catch_up_that_would_overrun_the_verdict_runs_once_in_a_few_rounds_by_its_own_seconds():
    """A catch-up step is judged by its own measured seconds (the branch's stand in until one is
    measured): under a load that makes it 0.39 s against a 0.29 s wait it runs once in
    CATCH_UP_EVERY rounds (that measurement keeps the slowdown current), and as soon as one fits
    again (the load lifted) it runs in every round."""
    assert BranchGate().catch_up(5.0)  # nothing known: run
    g = gate(0.29, 0.2, None)
    assert g.catch_up(0.0)  # the branch's 0.2 s stands in: fits
    g.observe_catch_up(0.39)
    runs = [g.catch_up(0.0) for _ in range(3 * CATCH_UP_EVERY)]
    assert runs == ([False] * (CATCH_UP_EVERY - 1) + [True]) * 3
    assert not g.catch_up(0.1)
    for _ in range(6):  # the load lifted: each measured catch-up is quick
        g.observe_catch_up(0.18)
    assert all(g.catch_up(0.0) for _ in range(2 * CATCH_UP_EVERY))
    assert not g.catch_up(0.2)  # 0.2 s after the send a ~0.18 s step would overrun


def test_the_first_step_counts_only_the_roots_it_feeds():
    """Verdicts landing on second-wave roots (D_i's leaves, fed by step 1) make a later step
    worth an overrun, not the first: its own roots (outcomes inside D_i) were never right."""
    g = gate(0.25, 0.3, None)
    for _ in range(5):
        g.observe_kept(1)
    assert g.p(0) == 0.0 and g.p(1) == 1.0 and g.p(7) == 1.0
    assert not g.start(0.0, 0)  # overruns by 0.05 s for nothing
    assert g.start(0.0, 1)
    g.observe_kept(0)  # a first-wave root counts for every later step too
    assert g.p(0) == pytest.approx(0.3) and g.p(1) == 1.0


def test_a_branch_stopped_before_its_first_step_teaches_only_the_first_wave():
    """Its second wave was never chosen (the first step chooses it), so only p(0) learns."""
    g = gate(0.25, 0.3, None)
    g.observe_kept(None, waves=1)
    assert g.p_kept == [0.0, -1.0]
    g.observe_kept(0, waves=1)
    assert g.p(0) == pytest.approx(0.3) and g.p(1) == g.prior


@settings(max_examples=200, deadline=None)
@given(cloud=st.floats(0.001, 2.0), step=st.floats(0.001, 2.0), p=st.floats(0.0, 1.0), t=st.floats(0.0, 3.0),
       later=st.floats(0.0, 1.0), more=st.floats(0.0, 0.5))
def test_a_later_start_or_a_less_likely_branch_never_turns_no_into_yes(cloud, step, p, t, later, more):
    """The expected gain falls and the expected overrun grows with t; both favour p."""
    if not gate(cloud, step, p).start(t):
        assert not gate(cloud, step, p).start(t + later)
        assert not gate(cloud, step, max(0.0, p - more)).start(t)


def _drafted(tiny_pair):
    _, drafts = tiny_pair
    eng = CountingEngine(drafts["partial"], capacity=512)
    d = Drafter(eng, TreeParams(3, 10, 2, 2), (EOS_ID,))
    d.start(list(b"abc def"))
    d.draft(3)
    return eng, d


@pytest.mark.parametrize("policy, p, runs", [("ipdg", 0.0, False), ("ipdg", 1.0, True), ("rapid", 0.0, False),
                                             ("npdg", 0.0, True)])
def test_the_coordinator_asks_the_gate_before_every_interruptible_branch_step(tiny_pair, policy, p, runs):
    """A cloud expected in 1 ms and a branch step of 1 s: a branch that is never kept starts no
    step, a certain one runs; npdg (not interruptible, SpecEdge) ignores the gate."""
    eng, d = _drafted(tiny_pair)
    coord = Coordinator(d, FlagLink(), POLICIES[policy], CoordinatorConfig(depth=3))
    coord.gate = gate(0.001, 1.0, p)
    before = eng.calls
    steps, interrupted = coord._branch(3, None, coord.clock())
    assert interrupted is None
    assert (steps > 0) == runs and eng.calls - before == steps


def test_a_closed_gate_still_judges_the_first_wave_so_it_can_reopen(tiny_pair):
    """Real verifier on loopback; a gate that will not start a step (100 s steps, a cloud of a
    few ms). Every round's first-wave roots are chosen before the gate is asked, so each verdict
    still updates p(0) (before, a branch stopped at step 0 had no roots: p froze where a few
    early misses left it and the gate never opened again); p(1), whose roots only a step
    chooses, learns nothing; the tokens are the target's."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    d = Drafter(CountingEngine(drafts["partial"], capacity=512), TreeParams(3, 10, 2, 2, branch_roots=2), (EOS_ID,))
    coord = Coordinator(d, CloudLink(server.url), POLICIES["ipdg"], CoordinatorConfig(depth=3))
    coord.gate = gate(0.001, 100.0, 0.5)  # p*T >= (1-p)(s-T) needs p > 0.9999: ~26 landings in a row
    prompt = list(b"abc def abc")
    try:
        gen = asyncio.run(coord.generate(prompt, 24, SamplingParams()))
    finally:
        server.close()
    assert gen.tokens == reference_decode(target, prompt, 24, SamplingParams(), (EOS_ID,))
    judged = [r for r in gen.records if r.proactive_hit is not None]
    assert len(judged) >= 2 and all(r.proactive_steps == 0 for r in gen.records)
    assert coord.gate.p_kept[0] != 0.5 and coord.gate.p_kept[1] == 0.5
    assert all(r.branch_outcome != "hit" for r in judged)
    assert all(0.0 < r.first_wave_p <= 1.0 for r in judged)  # the draft's P of its first-wave roots, traced


def test_a_second_wave_only_where_its_step_can_end_before_the_verdict():
    assert BranchGate().second_wave(5.0)  # costs unknown: the paper's branch, both waves
    assert gate(0.2, 0.09, None).second_wave(0.0)  # 0.18 <= 0.2
    assert not gate(0.2, 0.09, None).second_wave(0.03)  # 0.21 > 0.2
    assert not gate(0.21, 0.26, None).second_wave(0.0)  # slow edge under load: one step, and late


def test_the_gate_rides_with_the_controller_from_one_generation_to_the_next(tiny_pair):
    """Real verifier on loopback, two generations sharing one controller (as an EdgeSession, the
    daemon and the bench carry it). The second starts from what the first learnt: the cloud time
    is known at its first round, and a gate that has learnt that its steps outlast every verdict
    and are never kept starts no branch step in it. A gate made afresh per generation started
    every step of its first rounds on "unknown"."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    cfg = CoordinatorConfig(depth=3)
    ctrl = controller_for(POLICIES["ipdg"], cfg)
    prompt = list(b"abc def abc")

    def generation():
        d = Drafter(CountingEngine(drafts["partial"], capacity=512), TreeParams(3, 10, 2, 2), (EOS_ID,))
        coord = Coordinator(d, CloudLink(server.url), POLICIES["ipdg"], cfg, controller=ctrl)
        assert coord.gate is ctrl.gate
        return asyncio.run(coord.generate(prompt, 16, SamplingParams()))

    try:
        first = generation()
        assert ctrl.gate.cloud_s > 0.0
        ctrl.gate.step_s, ctrl.gate.p_kept = 100.0, [0.0, 0.0]  # as learnt: far past the verdict, never kept
        second = generation()
    finally:
        server.close()
    reference = reference_decode(target, prompt, 16, SamplingParams(), (EOS_ID,))
    assert first.tokens == second.tokens == reference
    assert all(r.proactive_steps == 0 for r in second.records)
    assert controller_for(POLICIES["ipdg"], cfg).gate is not ctrl.gate  # one gate per controller


def test_a_verdict_that_may_end_the_generation_gets_no_bet():
    """Where the verdict may end the generation, a kept branch or a fed token may serve nothing:
    a step starts only where it should end before the verdict, and no catch-up is forced."""
    g = gate(0.4, 0.3, 0.7)
    assert g.start(0.3) and not g.start(0.3, may_end=True)  # the bet: 0.07 >= 0.06, not taken
    assert g.start(0.1, may_end=True)  # ends at the verdict: free either way
    g.observe_catch_up(0.39)
    g.observe_cloud(0.29)
    runs = [g.catch_up(0.0) for _ in range(CATCH_UP_EVERY - 1)]
    assert not any(runs) and not g.catch_up(0.0, may_end=True)
    assert g.catch_up(0.0)  # the next round, not the last: forced as before
    assert BranchGate().catch_up(0.0, may_end=True)  # costs unknown: run


class _RecordingGate(BranchGate):
    """The coordinator's gate, recording ``may_end`` per branch (``second_wave`` opens a branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.branches: list[list[bool]] = []

    def second_wave(self, elapsed_s: float) -> bool:
        self.branches.append([])
        return super().second_wave(elapsed_s)

    def start(self, elapsed_s: float, step: int = 1, may_end: bool = False) -> bool:
        self.branches[-1].append(may_end)
        return super().start(elapsed_s, step, may_end)


def test_the_coordinator_tells_the_gate_which_verdicts_may_end_the_generation(tiny_pair):
    """Real verifier on loopback: a round's branch is told ``may_end`` exactly where the tree it
    sent reaches the generation's last token (tree depth + the bonus >= tokens left)."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    d = Drafter(CountingEngine(drafts["partial"], capacity=512), TreeParams(3, 10, 2, 2), (EOS_ID,))
    coord = Coordinator(d, CloudLink(server.url), POLICIES["ipdg"], CoordinatorConfig(depth=3))
    coord.gate = _RecordingGate()
    prompt, n = list(b"abc def abc"), 20
    try:
        gen = asyncio.run(coord.generate(prompt, n, SamplingParams()))
    finally:
        server.close()
    assert gen.tokens == reference_decode(target, prompt, n, SamplingParams(), (EOS_ID,))
    left, expected = n, []
    for r in gen.records:
        expected.append(r.tree_depth + 1 >= left)
        left -= r.emitted
    asked = coord.gate.branches
    assert len(asked) == len(gen.records) and all(asked)  # every round asked before each step
    assert [set(a) for a in asked] == [{e} for e in expected]
    assert expected[-1] and not expected[0]
