"""The product's promise: every policy emits exactly what the target alone emits.

Property test over the real websocket (verifier in a background thread on loopback): random
prompts, depths 1..8, budgets 1..64, greedy and seeded sampling, draft = target / a perturbed
copy / an unrelated model, random verdict delays (feedback arrives at random points of the
proactive branch), random per-step delays, stop tokens and max-token limits, trees sent whole or
cut to the nodes that pay for their verify time (``TreeParams.cost_cut``).
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID

_delay_rng = random.Random(0)


@pytest.fixture(scope="module")
def cloud(tiny_pair):
    target, _ = tiny_pair
    # a verify curve steep past a few nodes, so TreeParams.cost_cut sends fewer nodes than drafted
    server = BackgroundServer(VerifierServer(target, answer_delay=lambda: _delay_rng.choice([0.0, 0.0005, 0.003, 0.01]),
                                             curve=([1, 4, 64], [500, 1500, 60000])))
    yield server
    server.close()


def run_edge(url, draft, policy, prompt, max_new, sampling, tree, stop_ids, step_delays=()):
    delays = list(step_delays)

    def hook(phase, k):
        if delays:
            time.sleep(delays[(k - 1) % len(delays)])

    drafter = Drafter(TorchEngine(draft, capacity=1024), tree, stop_ids)
    coord = Coordinator(drafter, CloudLink(url), POLICIES[policy], CoordinatorConfig(depth=tree.depth), step_hook=hook)
    return asyncio.run(coord.generate(prompt, max_new, sampling))


sampling_st = st.one_of(
    st.just(SamplingParams()),
    st.builds(SamplingParams, temperature=st.sampled_from([0.6, 1.0, 1.5]), top_p=st.sampled_from([1.0, 0.9]),
              top_k=st.sampled_from([0, 20]), seed=st.integers(0, 2**31)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    policy=st.sampled_from(sorted(POLICIES)),
    draft=st.sampled_from(["same", "partial", "unrelated"]),
    prompt=st.lists(st.integers(0, 255), min_size=1, max_size=24),
    depth=st.integers(1, 8), budget=st.integers(1, 64), topk=st.integers(1, 4), width=st.integers(1, 4),
    max_new=st.integers(1, 28), sampling=sampling_st, stop_at=st.none() | st.integers(0, 27),
    step_delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), max_size=4), roots=st.integers(1, 4),
    cut=st.booleans(),
)
def test_every_policy_matches_target_alone(cloud, tiny_pair, policy, draft, prompt, depth, budget, topk, width,
                                           max_new, sampling, stop_at, step_delays, roots, cut):
    target, drafts = tiny_pair
    stop_ids = (EOS_ID,)
    if stop_at is not None:  # make a token the reference really emits a stop token: exercises early stops
        full = reference_decode(target, prompt, 28, sampling)
        stop_ids = (EOS_ID, full[stop_at])
    expected = reference_decode(target, prompt, max_new, sampling, stop_ids)
    gen = run_edge(cloud.url, drafts[draft], policy, prompt, max_new, sampling,
                   TreeParams(depth, budget, topk, width, branch_roots=roots, cost_cut=cut), stop_ids, step_delays)
    assert gen.tokens == expected
    assert len(gen.tokens) <= max_new
    assert sum(r.emitted for r in gen.records) == len(gen.tokens)


@pytest.fixture(scope="module")
def curve_clouds(tiny_pair):
    """Clouds that report a verify curve in Ready, so rapid-cost's cost model (not CAAC's fallback)
    chooses: one flat (a GPU: deep trees pay), one steep (a CPU in fp32: depth 1 pays)."""
    target, _ = tiny_pair
    rng = random.Random(1)
    flat = BackgroundServer(VerifierServer(target, answer_delay=lambda: rng.choice([0.0, 0.004, 0.02]),
                                           curve=([0, 3, 7, 15, 31], [20000, 20100, 20300, 20700, 21500])))
    steep = BackgroundServer(VerifierServer(target, curve=([0, 3, 7, 15, 31], [1000, 40000, 90000, 190000, 390000])))
    yield {"flat": flat, "steep": steep}
    flat.close()
    steep.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    curve=st.sampled_from(["flat", "steep"]), draft=st.sampled_from(["same", "partial", "unrelated"]),
    prompt=st.lists(st.integers(0, 255), min_size=1, max_size=24),
    depth=st.integers(1, 8), budget=st.integers(1, 64), topk=st.integers(1, 4), width=st.integers(1, 4),
    max_new=st.integers(1, 40), sampling=sampling_st,
    step_delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), max_size=4), roots=st.integers(1, 4),
)
def test_cost_aware_policy_matches_target_alone_whatever_the_costs(curve_clouds, tiny_pair, curve, draft, prompt,
                                                                   depth, budget, topk, width, max_new, sampling,
                                                                   step_delays, roots):
    target, drafts = tiny_pair
    expected = reference_decode(target, prompt, max_new, sampling, (EOS_ID,))
    gen = run_edge(curve_clouds[curve].url, drafts[draft], "rapid-cost", prompt, max_new, sampling,
                   TreeParams(depth, budget, topk, width, branch_roots=roots), (EOS_ID,), step_delays)
    assert gen.tokens == expected
    assert sum(r.emitted for r in gen.records) == len(gen.tokens)


def test_cost_aware_policy_uses_the_cloud_curve_and_the_round_trip(curve_clouds, tiny_pair):
    """Not vacuous: the controller holds Ready's curve, the verdicts' verify times and the RTT, and
    with the draft equal to the target (every level accepted) and verify ~flat it drafts deep."""
    target, drafts = tiny_pair
    prompt = list(b"def f(x):")
    drafter = Drafter(TorchEngine(drafts["same"], capacity=1024), TreeParams(4, 16, 1, 1), (EOS_ID,))
    coord = Coordinator(drafter, CloudLink(curve_clouds["flat"].url), POLICIES["rapid-cost"], CoordinatorConfig(depth=4))
    gen = asyncio.run(coord.generate(prompt, 60, SamplingParams()))
    assert gen.tokens == reference_decode(target, prompt, 60, SamplingParams(), (EOS_ID,))
    ctrl = coord.controller
    assert ctrl.costs.verify.startup == {0: 0.02, 3: 0.0201, 7: 0.0203, 15: 0.0207, 31: 0.0215}
    assert set(ctrl.costs.verify.measured) == {r.tree_nodes for r in gen.records}
    assert 0 < ctrl.costs.link.rtt < 1.0
    assert coord.cut.costs is ctrl.costs  # the send cut reads the same estimates, one set per session
    assert max(r.depth for r in gen.records) >= 6, [r.depth for r in gen.records]


sampled_st = st.builds(SamplingParams, temperature=st.sampled_from([0.5, 0.7, 1.0, 1.5]),
                       top_p=st.sampled_from([1.0, 0.8, 0.5]), top_k=st.sampled_from([0, 3, 20]),
                       seed=st.integers(0, 2**40))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    policy=st.sampled_from(sorted(POLICIES)), coupled=st.booleans(),
    draft=st.sampled_from(["same", "partial", "unrelated"]),
    prompt=st.lists(st.integers(0, 255), min_size=1, max_size=24),
    depth=st.integers(1, 8), budget=st.integers(1, 32), topk=st.integers(1, 4), width=st.integers(1, 4),
    max_new=st.integers(1, 28), sampling=sampled_st,
    step_delays=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), max_size=4), roots=st.integers(1, 4),
)
def test_coupled_and_uncoupled_drafting_match_target_alone_under_sampling(
        cloud, tiny_pair, policy, coupled, draft, prompt, depth, budget, topk, width, max_new, sampling, step_delays,
        roots):
    """Coupled drafting changes only what is proposed: seeded sampling stays target-exact, every policy."""
    target, drafts = tiny_pair
    expected = reference_decode(target, prompt, max_new, sampling, (EOS_ID,))
    gen = run_edge(cloud.url, drafts[draft], policy, prompt, max_new, sampling,
                   TreeParams(depth, budget, topk, width, coupled=coupled, branch_roots=roots), (EOS_ID,),
                   step_delays)
    assert gen.tokens == expected


def test_coupled_identical_draft_accepts_whole_chains_under_sampling(cloud, tiny_pair):
    """With the target's noise, a draft equal to the target proposes exactly the target's draws:
    whole chains are accepted, as under greedy. Uncoupled, the same chains stop at its greedy guesses."""
    target, drafts = tiny_pair
    prompt = list(b"def f(x):")
    sampling = SamplingParams(temperature=0.7, top_p=0.8, seed=11)
    want = reference_decode(target, prompt, 30, sampling, (EOS_ID,))
    runs = {}
    for coupled in (True, False):
        gen = run_edge(cloud.url, drafts["same"], "fixed", prompt, 30, sampling,
                       TreeParams(4, 4, 1, 1, coupled=coupled), (EOS_ID,))
        assert gen.tokens == want
        runs[coupled] = gen
    full = [r for r in runs[True].records if r.emitted == 5]
    assert len(full) >= len(runs[True].records) - 1
    assert runs[False].summary.mean_accepted < runs[True].summary.mean_accepted


def test_identical_draft_accepts_whole_chains(cloud, tiny_pair):
    target, drafts = tiny_pair
    prompt = list(b"def f(x):")
    gen = run_edge(cloud.url, drafts["same"], "fixed", prompt, 30, SamplingParams(), TreeParams(4, 4, 1, 1), (EOS_ID,))
    assert gen.tokens == reference_decode(target, prompt, 30, SamplingParams(), (EOS_ID,))
    full = [r for r in gen.records if r.emitted == 5]
    assert len(full) >= len(gen.records) - 1  # every round but possibly the last accepts depth 4 + bonus


def test_unrelated_draft_still_progresses(cloud, tiny_pair):
    target, drafts = tiny_pair
    prompt = list(b"hello")
    gen = run_edge(cloud.url, drafts["unrelated"], "rapid", prompt, 20, SamplingParams(), TreeParams(3, 8, 2, 2), (EOS_ID,))
    assert gen.tokens == reference_decode(target, prompt, 20, SamplingParams(), (EOS_ID,))
    assert all(r.emitted >= 1 for r in gen.records[:-1])


def test_slow_cloud_interrupts_branches_and_stays_exact(tiny_pair):
    """A cloud that answers late while each draft step is slow: IPDG stops branches mid-way."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, answer_delay=lambda: 0.012))
    try:
        prompt = list(b"interrupt me")
        for policy in ("ipdg", "rapid"):
            gen = run_edge(server.url, drafts["partial"], policy, prompt, 30, SamplingParams(), TreeParams(4, 12, 2, 2),
                           (EOS_ID,), step_delays=[0.005])
            assert gen.tokens == reference_decode(target, prompt, 30, SamplingParams(), (EOS_ID,))
            assert gen.summary.interrupts > 0, policy
            hits = [r for r in gen.records if r.proactive_hit]
            assert all(r.discarded_steps == 0 for r in hits)
    finally:
        server.close()


@pytest.fixture(scope="module")
def onnx_draft(partial_onnx_export):
    """The partial draft exported to ONNX (fp32 draft; the float64 target still decides every token)."""
    return partial_onnx_export


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_onnx_runtime_draft_is_exact(cloud, tiny_pair, onnx_draft, policy):
    """Edge–cloud exactness with the ONNX Runtime backend drafting, every policy, greedy and sampled."""
    from rapid.engines.ort_engine import OrtEngine

    target, _ = tiny_pair
    prompt = list(b"onnx on the edge")
    for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=3)):
        drafter = Drafter(OrtEngine(onnx_draft, capacity=512, threads=1), TreeParams(4, 10, 2, 2), (EOS_ID,))
        coord = Coordinator(drafter, CloudLink(cloud.url), POLICIES[policy], CoordinatorConfig(depth=4))
        gen = asyncio.run(coord.generate(prompt, 24, sampling))
        assert gen.tokens == reference_decode(target, prompt, 24, sampling, (EOS_ID,))
