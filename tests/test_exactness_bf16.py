"""The promise in bf16, the production dtype on CPUs with native bf16: bitwise invariance makes
tree verification emit exactly what bf16 target-alone decoding emits — every policy, greedy
and seeded sampling, over the real websocket, single and batched (several edges at once)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.modeling import Decoder
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.main import choose_verify_mode
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


def _bf16(path: str) -> Decoder:
    return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).to(torch.bfloat16)


@pytest.fixture(scope="module")
def bf16_pair(tiny_dir):
    target = _bf16(tiny_dir("target32", seed=0))
    draft = _bf16(tiny_dir("partial32", seed=1, base_seed=0, perturb=0.08))
    return target, draft


@pytest.fixture(scope="module")
def bf16_cloud(bf16_pair):
    target, _ = bf16_pair
    mode = choose_verify_mode(target)
    assert mode == "tree"  # measured invariant: the batched tree path is what is tested here
    server = BackgroundServer(VerifierServer(target, verify_mode=mode, batch_window_ms=3.0, max_batch=4))
    yield server
    server.close()


async def _edge(url, draft, policy, prompt, max_new, sampling, tree):
    drafter = Drafter(TorchEngine(draft, capacity=512), tree, (EOS_ID,))
    coord = Coordinator(drafter, CloudLink(url), POLICIES[policy], CoordinatorConfig(depth=tree.depth))
    return (await coord.generate(prompt, max_new, sampling)).tokens


sampling_st = st.one_of(st.just(SamplingParams()),
                        st.builds(SamplingParams, temperature=st.sampled_from([0.7, 1.2]),
                                  top_p=st.sampled_from([1.0, 0.9]), seed=st.integers(0, 2**31)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(policy=st.sampled_from(sorted(POLICIES)), prompt=st.lists(st.integers(0, 255), min_size=1, max_size=20),
       depth=st.integers(1, 8), budget=st.integers(1, 32), width=st.integers(1, 3), max_new=st.integers(1, 24),
       sampling=sampling_st)
def test_bf16_every_policy_matches_bf16_target_alone(bf16_cloud, bf16_pair, policy, prompt, depth, budget, width,
                                                     max_new, sampling):
    target, draft = bf16_pair
    got = asyncio.run(_edge(bf16_cloud.url, draft, policy, prompt, max_new, sampling,
                            TreeParams(depth, budget, 2, width)))
    assert got == reference_decode(target, prompt, max_new, sampling, (EOS_ID,))


def test_bf16_concurrent_edges_batched_stay_exact(bf16_cloud, bf16_pair):
    """Four edges at once: their trees share target forwards (max_batch 4), each output exact."""
    target, draft = bf16_pair
    prompts = [list(b"def f(x):"), list(b"hello world"), list(b"x"), list(b"import numpy as np\n")]
    sampling = [SamplingParams(), SamplingParams(temperature=0.9, seed=5)] * 2

    async def all_edges():
        return await asyncio.gather(*(_edge(bf16_cloud.url, draft, "rapid", p, 20, s, TreeParams(4, 12, 2, 2))
                                      for p, s in zip(prompts, sampling, strict=True)))

    hist = bf16_cloud.server.metrics.batch_size
    trees0, forwards0 = hist._sum.get(), sum(b.get() for b in hist._buckets)
    outs = asyncio.run(all_edges())
    for p, s, out in zip(prompts, sampling, outs, strict=True):
        assert out == reference_decode(target, p, 20, s, (EOS_ID,))
    trees, forwards = hist._sum.get() - trees0, sum(b.get() for b in hist._buckets) - forwards0
    assert trees > forwards  # some forward verified more than one session's tree


def test_sequential_fallback_is_exact_over_the_websocket(tiny_pair):
    """fp64 here, forced sequential: the fallback the server takes where trees are not invariant."""
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, verify_mode="sequential"))
    try:
        for policy in ("rapid", "fixed", "edgellm"):
            prompt = list(b"sequential")
            sampling = SamplingParams(temperature=0.8, seed=11)
            got = asyncio.run(_edge(server.url, drafts["partial"], policy, prompt, 24, sampling, TreeParams(4, 10, 2, 2)))
            assert got == reference_decode(target, prompt, 24, sampling, (EOS_ID,))
    finally:
        server.close()
