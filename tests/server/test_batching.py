"""Batched verification across sessions: each session's output is its target-only decoding."""

from __future__ import annotations

import asyncio
import random
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server import batching
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.batching import Batcher, verify_batch
from rapid.server.serve_config import Limits
from rapid.server.target import TargetSession, reference_decode
from rapid.tiny import EOS_ID


def random_tree(rng, n):
    tokens = [rng.randrange(259) for _ in range(n)]
    parents = [rng.randrange(-1, j) if j else -1 for j in range(n)]
    return tokens, parents


@pytest.mark.parametrize("seed", range(4))
def test_verify_batch_equals_one_by_one(tiny_pair, seed):
    """Same verdicts, same committed tokens and the same KV as verifying each session alone."""
    target, _ = tiny_pair
    rng = random.Random(seed)
    params = [SamplingParams(), SamplingParams(temperature=1.0, seed=seed)]
    prompts = [[rng.randrange(256) for _ in range(rng.randint(1, 30))] for _ in range(6)]
    a = [TargetSession(target, p, params[i % 2], 256, 64) for i, p in enumerate(prompts)]
    b = [TargetSession(target, p, params[i % 2], 256, 64) for i, p in enumerate(prompts)]
    for _ in range(5):
        trees = [random_tree(rng, rng.randint(0, 12)) for _ in a]
        trees[0] = ([1] * 3, [-1, 5, 0])  # a malformed tree fails alone
        outcome = verify_batch([(s, t, p) for s, (t, p) in zip(a, trees, strict=True)])
        batched = outcome.results
        assert isinstance(batched[0], Exception)
        assert outcome.forwards == [5] and outcome.error is None  # one forward of the 5 good trees
        for s, (t, p), v in zip(b[1:], trees[1:], batched[1:], strict=True):
            assert s.verify(t, p) == v
    for x, y in zip(a[1:], b[1:], strict=True):
        assert x.tokens == y.tokens and x.kv.length == y.kv.length
        n = x.kv.length
        assert (x.kv.k[:, :, :n] - y.kv.k[:, :, :n]).abs().max() < 1e-12


def test_a_failed_batched_forward_is_split_reported_and_still_exact(tiny_pair, monkeypatch):
    target, _ = tiny_pair
    prompts = [[1, 2, 3], [4, 5, 6, 7], [8, 9]]
    a = [TargetSession(target, p, SamplingParams(), 256, 64) for p in prompts]
    b = [TargetSession(target, p, SamplingParams(), 256, 64) for p in prompts]
    trees = [([10, 11], [-1, 0]), ([12], [-1]), ([], [])]

    def broken(items):
        raise RuntimeError("device lost")

    monkeypatch.setattr(batching, "_forward_rows", broken)
    outcome = verify_batch([(s, t, p) for s, (t, p) in zip(a, trees, strict=True)])
    assert isinstance(outcome.error, RuntimeError) and outcome.forwards == [1, 1, 1]
    assert outcome.results == [s.verify(t, p) for s, (t, p) in zip(b, trees, strict=True)]
    splits, sizes = [], []

    async def run():
        batcher = Batcher(ThreadPoolExecutor(1), 0.05, 3, lambda n, sec: sizes.append(n),
                          lambda n, e: splits.append((n, str(e))))
        c = [TargetSession(target, p, SamplingParams(), 256, 64) for p in prompts]
        got = await asyncio.gather(*(batcher.submit(s, t, p) for s, (t, p) in zip(c, trees, strict=True)))
        await batcher.close()
        return got

    assert asyncio.run(run()) == outcome.results
    assert splits == [(3, "device lost")] and sizes == [1, 1, 1]  # the metric sees what really ran


def test_concurrent_sessions_are_each_exact_and_batched(tiny_pair):
    target, drafts = tiny_pair
    server = VerifierServer(target, Limits(max_sessions=32), max_batch=8, batch_window_ms=4.0)
    cloud = BackgroundServer(server)
    rng = random.Random(1)
    jobs = []
    for i in range(8):
        prompt = [rng.randrange(256) for _ in range(rng.randint(2, 16))]
        sampling = SamplingParams() if i % 2 else SamplingParams(temperature=0.8, top_p=0.9, seed=i)
        jobs.append((prompt, sampling, sorted(POLICIES)[i % len(POLICIES)], ["same", "partial", "unrelated"][i % 3]))

    async def one(prompt, sampling, policy, draft):
        drafter = Drafter(TorchEngine(drafts[draft], capacity=512), TreeParams(3, 8, 2, 2), (EOS_ID,))
        coord = Coordinator(drafter, CloudLink(cloud.url), POLICIES[policy], CoordinatorConfig(depth=3))
        return (await coord.generate(prompt, 20, sampling)).tokens

    async def all_():
        return await asyncio.gather(*(one(*j) for j in jobs))

    try:
        outs = asyncio.run(all_())
        for (prompt, sampling, _, _), out in zip(jobs, outs, strict=True):
            assert out == reference_decode(target, prompt, 20, sampling, (EOS_ID,))
        text = urllib.request.urlopen(cloud.url.replace("ws://", "http://") + "/metrics", timeout=5).read().decode()
    finally:
        cloud.close()
    count = float(re.search(r"^rapid_verify_batch_size_count (\S+)", text, re.M).group(1))
    total = float(re.search(r"^rapid_verify_batch_size_sum (\S+)", text, re.M).group(1))
    rounds = float(re.search(r"^rapid_spec_decode_num_rounds_total (\S+)", text, re.M).group(1))
    assert total == rounds and total / count > 1.2, (total, count)  # trees really shared forwards
    for name in ("rapid_spec_decode_num_accepted_tokens_total", "rapid_spec_decode_num_draft_tokens_total",
                 "rapid_spec_decode_mean_accepted_length", "rapid_verify_latency_seconds_bucket",
                 'rapid_sessions_total{kind="new"}', "rapid_sessions_active"):
        assert name in text, name


def test_batched_decoder_rows_match_single_rows(tiny_pair):
    """Decoder.forward with B > 1 (padded, per-row mask) matches B = 1 forwards row by row."""
    import torch

    from rapid.kvcache import StaticKV
    from rapid.modeling import additive_mask

    target, _ = tiny_pair
    rng = random.Random(0)
    seqs = [[rng.randrange(259) for _ in range(n)] for n in (5, 9, 3)]
    singles = []
    for s in seqs:
        kv = StaticKV.for_config(target.config, 32, target.dtype)
        kv.begin(len(s))
        allowed = torch.tril(torch.ones(len(s), len(s), dtype=torch.bool))
        singles.append(target(torch.tensor([s]), torch.arange(len(s))[None], additive_mask(allowed, target.dtype), kv)[0])
    t = max(map(len, seqs))
    ids = torch.zeros(3, t, dtype=torch.long)
    pos = torch.zeros(3, t, dtype=torch.long)
    allowed = torch.zeros(3, t, t, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s)
        pos[b, :len(s)] = torch.arange(len(s))
        allowed[b, :len(s), :len(s)] = torch.tril(torch.ones(len(s), len(s), dtype=torch.bool))
        allowed[b, len(s):, 0] = True

    class NoKV:
        def attend_kv(self, layer, k, v):
            return k, v

    out = target(ids, pos, additive_mask(allowed, target.dtype)[0, 0][:, None], NoKV())
    for b, s in enumerate(seqs):
        assert (out[b, :len(s)] - singles[b]).abs().max() < 1e-10
