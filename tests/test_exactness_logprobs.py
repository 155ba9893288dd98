"""Log-probabilities are exact too: speculative decoding with ``logprobs`` gives the same token
ids AND the same float32 log-probabilities and top alternatives as the ``ar`` path (target-only
decoding through the same cloud) and as ``reference_scored`` (the target alone, in process) —
bitwise, every drafting policy, greedy and seeded sampling, fp32 and bf16, over the real
websocket. The cloud verifies in the mode ``rapid serve`` picks for the model
(``choose_verify_mode``: ``tree`` where rows are batch-invariant, else ``sequential``)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.modeling import Decoder
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig, Generation
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.main import choose_verify_mode
from rapid.server.target import reference_scored
from rapid.tiny import EOS_ID


def _load(path: str, dtype: torch.dtype) -> Decoder:
    return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).to(dtype)


@pytest.fixture(scope="module")
def stacks(tiny_dir):
    """dtype name → (target, draft, cloud)."""
    made = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        target = _load(tiny_dir("target32", seed=0), dtype)
        draft = _load(tiny_dir("partial32", seed=1, base_seed=0, perturb=0.08), dtype)
        made[name] = (target, draft, BackgroundServer(VerifierServer(target, verify_mode=choose_verify_mode(target))))
    yield made
    for _, _, cloud in made.values():
        cloud.close()


def _edge(url: str, draft: Decoder, policy: str, prompt: list[int], max_new: int, sampling: SamplingParams,
          tree: TreeParams, k: int) -> Generation:
    drafter = Drafter(TorchEngine(draft, capacity=512), tree, (EOS_ID,))
    coord = Coordinator(drafter, CloudLink(url), POLICIES[policy], CoordinatorConfig(depth=tree.depth))
    return asyncio.run(coord.generate(prompt, max_new, sampling, logprobs=k))


def _flat(gen: Generation) -> tuple[list[float], list[int], list[float]]:
    return ([s.logprob for s in gen.scores], [t for s in gen.scores for t, _ in s.top],
            [lp for s in gen.scores for _, lp in s.top])


sampling_st = st.one_of(st.just(SamplingParams()),
                        st.builds(SamplingParams, temperature=st.sampled_from([0.7, 1.2]),
                                  top_p=st.sampled_from([1.0, 0.9]), top_k=st.sampled_from([0, 20]),
                                  seed=st.integers(0, 2**31)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(["fp32", "bf16"]), policy=st.sampled_from(sorted(p for p in POLICIES if p != "ar")),
       prompt=st.lists(st.integers(0, 255), min_size=1, max_size=16), depth=st.integers(1, 6),
       budget=st.integers(1, 24), width=st.integers(1, 3), max_new=st.integers(1, 20), sampling=sampling_st,
       k=st.sampled_from([0, 1, 5, 20]))
def test_speculative_logprobs_equal_the_ar_path_bitwise(stacks, dtype, policy, prompt, depth, budget, width,
                                                          max_new, sampling, k):
    target, draft, cloud = stacks[dtype]
    tree = TreeParams(depth, budget, 2, width)
    spec = _edge(cloud.url, draft, policy, prompt, max_new, sampling, tree, k)
    ar = _edge(cloud.url, draft, "ar", prompt, max_new, sampling, tree, k)
    ids, ref = reference_scored(target, prompt, max_new, sampling, (EOS_ID,), logprobs=k)
    assert spec.tokens == ar.tokens == ids
    assert _flat(spec) == _flat(ar) == (ref.logprobs, ref.top_ids, ref.top_logprobs)  # float32 values, bitwise
    assert len(spec.scores) == len(spec.tokens) and all(len(s.top) == k for s in spec.scores)
    assert [s.token for s in spec.scores] == spec.tokens


def test_logprobs_are_a_distribution_and_greedy_picks_the_top_one(stacks):
    """Independent of the implementation: the greedy token is the most likely one, its
    log-probability the top alternative's; the top 20 are sorted and their mass is at most 1."""
    target, draft, cloud = stacks["fp32"]
    gen = _edge(cloud.url, draft, "rapid", list(b"def f(x):"), 16, SamplingParams(), TreeParams(4, 12, 2, 2), 20)
    for s in gen.scores:
        assert s.top[0][0] == s.token and s.top[0][1] == s.logprob <= 0.0
        lps = [lp for _, lp in s.top]
        assert lps == sorted(lps, reverse=True) and math.fsum(math.exp(lp) for lp in lps) <= 1.0 + 1e-6
    assert len(gen.scores) == len(gen.tokens) == 16 or gen.tokens[-1] == EOS_ID


def test_no_logprobs_asked_none_sent(stacks):
    _, draft, cloud = stacks["bf16"]
    gen = _edge(cloud.url, draft, "rapid", list(b"hello"), 8, SamplingParams(), TreeParams(3, 8, 2, 2), -1)
    assert gen.scores == [] and gen.tokens
