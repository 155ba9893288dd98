"""Coordinator with a caller-owned depth controller, over the real loopback websocket."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.caac import CAACConfig
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig, controller_for
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.lookup import P_MAX, P_MIN
from rapid.runtime.policies import POLICIES, Policy
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


def test_controller_for_matches_the_policy():
    cfg = CoordinatorConfig(depth=3)
    assert type(controller_for(POLICIES["rapid"], cfg)).__name__ == "CAAC"
    assert type(controller_for(POLICIES["npdg"], cfg)).__name__ == "FixedDepth"
    assert type(controller_for(POLICIES["rapid-cost"], cfg)).__name__ == "CostAwareCAAC"
    assert controller_for(POLICIES["fixed"], cfg).next_depth().depth == 3


def test_carried_controller_accumulates_steps_and_stays_exact(tiny_pair):
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    try:
        tree, cfg = TreeParams(4, 10, 2, 2), CoordinatorConfig(depth=4)
        ctrl = controller_for(POLICIES["rapid"], cfg)
        steps, unsampled = [], 0
        for prompt in (list(b"first prompt"), list(b"second, other prompt")):
            drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), tree, (EOS_ID,))
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES["rapid"], cfg, controller=ctrl)
            assert coord.controller is ctrl
            gen = asyncio.run(coord.generate(prompt, 20, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, 20, SamplingParams(), (EOS_ID,))
            snap = ctrl.snapshot()
            steps.append(snap["steps"])
            # the logical path restarted with this request: its first verdict and any round a lookup
            # chain carried past the drafted depth took no sample, and a round with one token left
            # (no level sent) is no round to it
            lefts = list(itertools.accumulate((r.emitted for r in gen.records[:-1]), lambda x, e: x - e, initial=20))
            assert snap["rounds"] + snap["unsampled_rounds"] - unsampled == sum(left > 1 for left in lefts)
            unsampled = snap["unsampled_rounds"]
        assert steps[1] > steps[0] > 0  # the physical path carried over
    finally:
        server.close()


def test_proactive_policies_reach_depth_8_as_fast_as_caac(tiny_pair):
    """Full acceptance (the draft is the target, chains of top-1 tokens): the depth of round
    i+1 is settled when verdict i lands, so a proactive policy follows the same depth sequence
    as caac instead of lagging a round. Steps take a constant (injected) time, so the gate
    stays open; the time cap is off so only acceptance moves the depth. A tiny decay roots the
    branch at the leaf (the right guess here), and a branch that runs to its plan (npdg-caac)
    builds the whole next tree: it aims at the depth the verdict it guesses will settle."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    prompt, max_new = list(b"full acceptance"), 150
    adaptive_npdg = Policy("npdg-caac", adaptive_depth=True, proactive=True)  # branch runs to its plan
    depth_runs = {}
    try:
        for policy in (POLICIES["caac"], POLICIES["rapid"], adaptive_npdg):
            ticks = itertools.count(0.0, 0.005)  # every step takes 5 ms of this clock
            # no prompt-lookup chains: they would reach below the planned depth (accepted > depth)
            drafter = Drafter(TorchEngine(drafts["same"], capacity=512), TreeParams(4, 12, 1, 1, lookup=0, branch_decay=1e-12), (),
                              clock=ticks.__next__)
            cfg = CoordinatorConfig(depth=4, caac=CAACConfig(time_cap=False))
            gen = asyncio.run(Coordinator(drafter, CloudLink(server.url), policy, cfg).generate(
                prompt, max_new, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, max_new, SamplingParams(), ())
            recs = gen.records[:16]
            assert all(r.accepted == r.depth and r.eta == 1.0 for r in recs), policy.name
            depth_runs[policy.name] = [r.depth for r in recs]
            # the outcome the traces count says "hit" exactly when the branch was kept
            assert all((r.branch_outcome == "hit") == bool(r.proactive_hit) for r in gen.records)
            assert all(r.branch_outcome is None for r in gen.records) == (not policy.proactive)
            if policy is adaptive_npdg:
                assert all(r.proactive_hit for r in recs), [r.proactive_hit for r in recs]
                assert [r.draft_steps for r in recs[1:]] == [0] * 15  # the branch drafted it all
    finally:
        server.close()
    caac = depth_runs["caac"]
    assert caac.index(8) <= 12 and caac[caac.index(8):] == [8] * (16 - caac.index(8)), caac
    assert depth_runs["rapid"] == caac and depth_runs["npdg-caac"] == caac, depth_runs


def test_rapid_cost_drafts_nothing_where_a_step_costs_more_than_it_buys(tiny_pair):
    """A carried controller whose step baselines (every size 1..32) were learnt at 2.5 ms, then
    draft steps of 75 ms (an injected clock) against a loopback verify of a few ms: CAAC's gate
    shuts, a round that drafts nothing (the prompt-lookup chains alone, or one target step) has
    the best rate, so rapid-cost sends those and drafts now and then to re-measure the step. The
    tokens are the target's, greedy and seeded sampling; a round without a draft step runs no
    branch, and the committed tokens it leaves unfed are fed by the next round that drafts. (The
    baselines are taught for every size up front: which sizes a generation steps at depends on
    when its verdicts arrive, and a size first seen under the load would take it as its baseline.)"""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    prompt = list(b"abc abd abc abd abc abd abc")
    try:
        for sampling in (SamplingParams(), SamplingParams(temperature=0.8, seed=3)):
            cfg = CoordinatorConfig(depth=4)
            ctrl = controller_for(POLICIES["rapid-cost"], cfg)
            for _ in range(4):
                for tokens in range(1, 33):
                    ctrl.observe_step(0.0025, tokens)
            drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(4, 12, 2, 2), (EOS_ID,),
                              clock=itertools.count(0.0, 0.075).__next__)
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES["rapid-cost"], cfg, controller=ctrl)
            gen = asyncio.run(coord.generate(prompt, 60, sampling))
            assert gen.tokens == reference_decode(target, prompt, 60, sampling, (EOS_ID,))
            undrafted = [r for r in gen.records if r.depth == 0]
            assert len(undrafted) >= len(gen.records) // 3 and all(r.eta < 1 for r in undrafted), \
                [(r.depth, r.eta) for r in gen.records]
            assert all(r.draft_steps == 0 and r.proactive_steps == 0 and r.proactive_hit is None for r in undrafted)
            assert any(r.depth > 0 for r in gen.records[len(gen.records) // 2:])  # it still probes
    finally:
        server.close()


def test_no_round_sends_a_node_past_the_last_token(tiny_pair):
    """With ``left`` tokens to go a verdict emits at most ``left`` (its accepted path, then the
    target's bonus), so a node deeper than ``left - 1`` is verify time for nothing. The prompt
    repeats, so its first round carries an 8-token lookup chain: without the cap that round sent
    depth 8 whatever ``max_new``. The tokens stay the target's."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    prompt = list(b"abc abc abc abc abc abc abc abc")
    try:
        for policy, max_new in itertools.product(("fixed", "rapid-cost"), (1, 2, 3, 5, 9)):
            drafter = Drafter(TorchEngine(drafts["same"], capacity=512), TreeParams(4, 24, 2, 2, lookup=8), (EOS_ID,))
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES[policy], CoordinatorConfig(depth=4))
            gen = asyncio.run(coord.generate(prompt, max_new, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, max_new, SamplingParams(), (EOS_ID,))
            left = max_new
            for rec in gen.records:
                assert rec.tree_depth <= left - 1, (policy, max_new, rec)
                assert rec.lookup_depth <= rec.tree_depth, (policy, max_new, rec)
                if left == 1:  # the bonus token is all the round emits: no draft step for it
                    assert rec.draft_steps == 0, (policy, max_new, rec)
                left -= rec.emitted
            if max_new == 9:  # the first round's chain, cut to the 8 levels left (the trace says so)
                assert gen.records[0].lookup_depth == 8, (policy, gen.records[0])
            # the request's learnt P(lookup token right) as each tree went out: the prior first
            assert gen.records[0].lookup_p == TreeParams().lookup_p
            assert all(P_MIN <= r.lookup_p <= P_MAX for r in gen.records)
    finally:
        server.close()


def test_round_0_is_drafted_while_the_cloud_prefills(tiny_pair):
    """The draft's prefill and round 0's tree run while the cloud prefills (a Ready held 0.25 s, as
    a link would hold it): round 0's drafting is all ahead of Ready, off the round's path, so the
    round is shorter than its drafting plus its wait; the tokens stay the target's. On the old
    order (draft after Ready) ahead_s is 0 and the round holds the drafting."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, answer_delay=lambda: 0.25))
    try:
        prompt = list(b"drafted while the cloud prefills")
        for name in ("fixed", "rapid-cost"):
            drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(4, 10, 2, 2), (EOS_ID,))
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES[name], CoordinatorConfig(depth=4),
                                step_hook=lambda phase, k: time.sleep(0.01))  # 10 ms a step at least
            gen = asyncio.run(coord.generate(prompt, 12, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, 12, SamplingParams(), (EOS_ID,))
            first = gen.records[0]
            assert first.draft_steps >= 1 and first.draft_s >= 0.01 * first.draft_steps
            assert first.ahead_s == first.draft_s, (name, first.ahead_s, first.draft_s)
            assert first.t_end - first.t_start < first.draft_s + first.wait_s
            assert all(r.ahead_s == 0.0 for r in gen.records[1:])
    finally:
        server.close()


def test_a_round_that_drafts_nothing_feeds_its_pending_tokens_and_sees_a_load_lift(tiny_pair):
    """rapid-cost under a load (draft steps of 75 ms by an injected clock, baselines 2.5 ms) sends
    undrafted rounds; while the cloud verifies one (each verdict held 0.15 s, so a step fits in
    the wait) the edge feeds the tokens it left pending, one measured step: the draft's KV stays
    at most a token behind, and when the load lifts (steps of 2.5 ms) the next request drafts
    again within a few rounds. Without that step nothing was measured until the next probe,
    whose interval the undrafted rounds under the load had grown to 32. Tokens: the target's."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, answer_delay=lambda: 0.15))
    step = {"s": 0.075}
    ticks = itertools.accumulate(itertools.repeat(None), lambda t, _: t + step["s"], initial=0.0)
    try:
        cfg = CoordinatorConfig(depth=4)
        ctrl = controller_for(POLICIES["rapid-cost"], cfg)
        for _ in range(4):
            for tokens in range(1, 33):
                ctrl.observe_step(0.0025, tokens)
        first_drafted = []
        for load, prompt, max_new in ((True, list(b"abc abd abc abd abc abd abc"), 40), (False, list(b"xyz q"), 14)):
            step["s"] = 0.075 if load else 0.0025
            # an unrelated draft: under the load no drafted depth can pay, whatever the real verify
            # time (with a partial draft a slow first verdict made depth 6 pay and the test flaky)
            drafter = Drafter(TorchEngine(drafts["unrelated"], capacity=512), TreeParams(4, 12, 2, 2, lookup=0),
                              (EOS_ID,), clock=ticks.__next__)
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES["rapid-cost"], cfg, controller=ctrl)
            gen = asyncio.run(coord.generate(prompt, max_new, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, max_new, SamplingParams(), (EOS_ID,))
            # an undrafted round after another has two tokens pending (a round that drafts feeds them)
            again = [r for prev, r in itertools.pairwise(gen.records) if prev.depth == 0 and r.depth == 0]
            assert again and all(r.catch_up_s > 0 for r in again), [(r.depth, r.catch_up_s) for r in gen.records]
            assert all(r.beside_s == r.catch_up_s and r.beside_tokens >= 1 for r in again)
            assert len(drafter.pending) <= 2 or gen.records[-1].depth > 0
            first_drafted.append(next((r.round for r in gen.records if r.depth > 0), len(gen.records)))
        assert first_drafted[1] <= 5, first_drafted
    finally:
        server.close()


def test_the_summary_splits_the_first_verdict_from_the_decoding_after_it(tiny_pair):
    """A cloud that holds Ready and every verdict 0.2 s: the first tokens come after both (the
    prefill and round 0), and the rate after them counts the remaining tokens over the remaining
    time (llama.cpp's prompt eval / eval split, vLLM's TTFT / TPOT); the summary line says both."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, answer_delay=lambda: 0.2))
    try:
        drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(4, 10, 2, 2), (EOS_ID,))
        coord = Coordinator(drafter, CloudLink(server.url), POLICIES["rapid-cost"], CoordinatorConfig(depth=4))
        gen = asyncio.run(coord.generate(list(b"first tokens, then the rest"), 12, SamplingParams()))
    finally:
        server.close()
    s = gen.summary
    assert len(gen.records) >= 2 and s.tokens == 12
    assert 0.4 <= s.ttft_s < s.wall_s
    span = gen.records[-1].t_end - gen.records[0].t_end  # every verdict after the first comes after TTFT
    assert span <= s.wall_s - s.ttft_s <= span + 1.0  # (then the close)
    assert s.decode_tok_s() == pytest.approx((s.tokens - 1) / (s.wall_s - s.ttft_s))
    assert f"first tokens after {s.ttft_s:.2f}s, then {s.decode_tok_s():.2f} tok/s" in s.line()


def test_the_send_cut_stops_the_drafting_where_no_further_level_would_be_sent(tiny_pair):
    """A cloud whose verify grows steeply past 4 nodes and a draft unrelated to the target (its
    nodes calibrate to ~0 accepted): with ``cost_cut`` the rounds stop drafting once no node a
    step adds would be sent, instead of drafting ``fixed``'s 6 levels and cutting them; without
    the cut every round drafts its 6. The tokens are the target's either way."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, curve=([1, 4, 64], [500, 1500, 60000])))
    prompt = list(b"the cat sat on the mat")
    try:
        steps = {}
        for cut in (False, True):
            drafter = Drafter(TorchEngine(drafts["unrelated"], capacity=512), TreeParams(6, 16, 2, 2, cost_cut=cut),
                              (EOS_ID,))
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES["fixed"], CoordinatorConfig(depth=6))
            gen = asyncio.run(coord.generate(prompt, 30, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, 30, SamplingParams(), (EOS_ID,))
            steps[cut] = [r.draft_steps for r in gen.records[1:-1] if r.depth == 6]  # not round 0 (drafted
            # before Ready's curve) nor the last (capped by the tokens left)
        assert steps[False] and all(s == 6 for s in steps[False]), steps
        assert steps[True] and sum(steps[True]) < 6 * len(steps[True]) // 2, steps
    finally:
        server.close()


def test_branch_steps_are_measured_as_steps_beside_the_verify(tiny_pair):
    """The coordinator tells the controller which steps ran while the cloud verified: the
    branch's are compared with their own kind (runtime.step_cost), the drafting steps' table
    prices the critical path. Every step lands in exactly one table."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, answer_delay=lambda: 0.05))
    try:
        cfg = CoordinatorConfig(depth=4)
        ctrl = controller_for(POLICIES["rapid"], cfg)
        drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(4, 10, 2, 2), (EOS_ID,))
        coord = Coordinator(drafter, CloudLink(server.url), POLICIES["rapid"], cfg, controller=ctrl)
        prompt = list(b"a prompt the branch runs beside")
        gen = asyncio.run(coord.generate(prompt, 24, SamplingParams()))
        assert gen.tokens == reference_decode(target, prompt, 24, SamplingParams(), (EOS_ID,))
        phys = ctrl._phys
        beside = sum(phys.beside.count(t) for t in phys.beside.classes())
        alone = sum(phys.baseline.count(t) for t in phys.baseline.classes())
        assert beside == sum(r.proactive_steps for r in gen.records) > 0
        assert alone == sum(r.draft_steps for r in gen.records) > 0
        assert alone + beside == phys.steps
        # the trace carries each round's steps beside its verify (the sim's beside fit reads them)
        for r in gen.records:
            assert (r.beside_s > 0) == (r.proactive_steps > 0) and r.beside_tokens >= r.proactive_steps, r
    finally:
        server.close()
